"""OpenTelemetry spans and verl's agent-loop metrics for RL rollouts.

The names here are all most users need. The rest lives in sub-namespaces: :mod:`~otel_agentloop.metrics`
(verl's formula, the span processor), :mod:`~otel_agentloop.export` (exporters), :mod:`~otel_agentloop.analysis`
(stored traces, reports, the timeline page), :mod:`~otel_agentloop.health` (training health, validation
capture, the watchdog), :mod:`~otel_agentloop.integrations` (Ray, verl) and :mod:`~otel_agentloop.testing`.

Typical use::

    import otel_agentloop as oal

    handle = oal.configure(service_name="rollout")          # OTLP if OTEL_EXPORTER_OTLP_ENDPOINT is set

    @oal.trace_generate(model="qwen")
    async def generate(...): ...

    with oal.step(step):
        async def one(i, n):
            async with oal.sample(i, rollout_n=n):
                await generate(...)
        await asyncio.gather(*(one(i, n) for i, n in work))
    metrics = handle.metrics.collect(step)                    # verl's agent_loop/... dict
"""

from .config._environment import sanitize_environment

# Before the SDK is imported: it parses some OTEL_* variables at import and raises on a bad value.
sanitize_environment()

from . import semconv as semconv  # noqa: E402  (a public sub-module: `oal.semconv.RL_SAMPLE_INDEX`)
from ._version import __version__  # noqa: E402
from .core._context import (  # noqa: E402
    bind,
    current_sample,
    current_step,
    record_generation,
    record_sample,
    sample,
    step,
)
from .core._phase import phase, span, trace_generate, trace_reward, trace_tool  # noqa: E402
from .core._trainer import trainer_phase  # noqa: E402
from .health._watchdog import WatchdogSettings  # noqa: E402
from .setup import Handle, configure, current_handle  # noqa: E402

__all__ = [
    "Handle",
    "WatchdogSettings",
    "__version__",
    "bind",
    "configure",
    "current_handle",
    "current_sample",
    "current_step",
    "phase",
    "record_generation",
    "record_sample",
    "sample",
    "span",
    "step",
    "trace_generate",
    "trace_reward",
    "trace_tool",
    "trainer_phase",
]
