"""verl's ``agent_loop/*`` metrics from spans (the span processor, per-sample accumulation, verl's formula)
and the library's OpenTelemetry metrics (phase-duration histograms with exemplars, in-flight gauges)."""

from ._processor import PhaseMetricsProcessor
from ._records import SpanRecord
from ._summary import Distribution, StepSummary, summarize, verdict
from ._table import PhaseTable, StepMetrics, compute_metrics

__all__ = [
    "Distribution",
    "PhaseMetricsProcessor",
    "PhaseTable",
    "SpanRecord",
    "StepMetrics",
    "StepSummary",
    "compute_metrics",
    "summarize",
    "verdict",
]
