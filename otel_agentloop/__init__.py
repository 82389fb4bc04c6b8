"""OpenTelemetry spans and verl's agent-loop metrics for RL rollouts.

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

from . import semconv
from ._configure import Handle, configure, current_handle
from ._version import __version__
from .analysis._timeline import TimelineRecorder
from .core._context import (
    SampleHandle,
    StepState,
    bind,
    current_sample,
    current_step,
    record_generation,
    record_sample,
    sample,
    step,
)
from .core._inflight import InflightSample
from .core._phase import phase, span, trace_generate, trace_reward, trace_tool
from .core._trainer import trainer_phase
from .export._file import OTLPJsonFileExporter
from .export._otlp_json import decode_resource_spans, read_jsonl
from .health._watchdog import OverdueSample, WatchdogSettings
from .metrics._processor import PhaseMetricsProcessor
from .metrics._records import SpanRecord
from .metrics._table import PhaseTable, StepMetrics, compute_metrics

__all__ = [
    "Handle",
    "InflightSample",
    "OTLPJsonFileExporter",
    "OverdueSample",
    "PhaseMetricsProcessor",
    "PhaseTable",
    "SampleHandle",
    "SpanRecord",
    "StepMetrics",
    "StepState",
    "TimelineRecorder",
    "WatchdogSettings",
    "__version__",
    "bind",
    "compute_metrics",
    "configure",
    "current_handle",
    "current_sample",
    "current_step",
    "decode_resource_spans",
    "phase",
    "read_jsonl",
    "record_generation",
    "record_sample",
    "sample",
    "semconv",
    "span",
    "step",
    "trace_generate",
    "trace_reward",
    "trace_tool",
    "trainer_phase",
]
