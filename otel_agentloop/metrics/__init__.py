"""verl's ``agent_loop/*`` metrics from spans (the span processor, per-sample accumulation, verl's formula)
and the library's OpenTelemetry metrics (phase-duration histograms with exemplars, in-flight gauges)."""

from ._processor import PhaseMetricsProcessor
from ._records import SpanRecord
from ._table import PhaseTable, StepMetrics, compute_metrics

__all__ = ["PhaseMetricsProcessor", "PhaseTable", "SpanRecord", "StepMetrics", "compute_metrics"]
