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

from . import semconv as semconv  # a public sub-module: `oal.semconv.RL_SAMPLE_INDEX`
from ._configure import Handle, configure, current_handle
from ._version import __version__
from .core._context import bind, current_sample, current_step, record_generation, record_sample, sample, step
from .core._phase import phase, span, trace_generate, trace_reward, trace_tool
from .core._trainer import trainer_phase
from .health._watchdog import WatchdogSettings

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
