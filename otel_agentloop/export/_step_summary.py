"""The ``rl.step.summary`` span: one per collected step, the record the run page and ``report --compare`` read.

:meth:`StepSummaryWriter.write` builds the step's :class:`~otel_agentloop.metrics.StepSummary` with
:func:`~otel_agentloop.metrics._summary.summarize` (the table and metrics exactly as the caller's step
produced them) and exports it as a span of a trace of its own (:data:`semconv.STEP_SUMMARY_SPAN`, attributes
``rl.step``, ``rl.validate`` and :data:`semconv.RL_STEP_SUMMARY` = the summary's JSON). Every place that
produces a step's final metric dict calls it: ``collect()``, ``integrations.ray.merge_metrics``, verl's
legacy ``_performance_metrics`` and V1 ``step_metrics``.

Like the watchdog's snapshot spans, the span goes through a side tracer straight into the handle's export
processors: ALWAYS_ON (no trace sampler drops it), past the SampleKeeper (no sample budget holds it back), and
with no attribute length limit (``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` never truncates the JSON). It never
raises into the caller; written and failed summaries are counted (``handle.stats``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.util.types import AttributeValue

from .. import semconv as sc
from ..config._fork import after_fork_in_child
from ..core._guard import internal_error
from ..metrics._hooks import StepHooks
from ..metrics._summary import StepSummary, summarize
from ..metrics._table import PhaseTable, StepMetrics
from ._side import side_tracer

if TYPE_CHECKING:
    import numpy.typing as npt

NO_STEP = -1
"""The step a summary records for ``collect(None)`` (a step-less collect), as verl marks an unknown step."""


class StepSummaryWriter(StepHooks):
    """Writes ``rl.step.summary`` spans into ``export`` (span processors) with ``resource``; see the module.

    As a :class:`StepHooks` of the metrics processor it writes the summary of each ``collect()``
    (``step_collected``)."""

    def __init__(self, resource: Resource, export: Sequence[SpanProcessor]) -> None:
        # no attribute length limit: OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT never truncates the JSON
        self._tracer = side_tracer(
            "otel_agentloop.summary", resource, export, max_attributes=8, max_links=0, max_attribute_length=None
        )
        self._new_lock()
        after_fork_in_child(self, "_new_lock")
        self.written = 0
        self.failed = 0
        self.closed = False

    def _new_lock(self) -> None:
        """A fresh lock (also in a forked child: one held by another thread at fork is never inherited held)."""
        self._lock = threading.Lock()

    def write(
        self,
        table: PhaseTable,
        metrics: StepMetrics,
        step: int | None,
        validate: bool = False,
        *,
        staleness: npt.ArrayLike | None = None,
    ) -> StepSummary | None:
        """Summarize and export one collected step (``metrics``: the dict the caller returns, with the
        watchdog's hung/slow samples; ``staleness``: per-sample, async modes). Returns the summary written,
        ``None`` when closed or on an internal error (logged once, counted in ``failed``). Never raises."""
        if self.closed:
            return None
        try:
            collected_ns = time.time_ns()
            summary = summarize(
                table,
                metrics,
                NO_STEP if step is None else int(step),
                bool(validate),
                collected_ns=collected_ns,
                staleness=staleness,
            )
            attrs: dict[str, AttributeValue] = {
                sc.RL_STEP: summary.step,
                sc.RL_VALIDATE: summary.validate,
                sc.RL_STEP_SUMMARY: summary.to_json(),
            }
            start = summary.start_ns if 0 < summary.start_ns <= collected_ns else collected_ns
            span = self._tracer.start_span(sc.STEP_SUMMARY_SPAN, context=Context(), attributes=attrs, start_time=start)
            span.end(end_time=collected_ns)
        except Exception:
            with self._lock:
                self.failed += 1
            internal_error("StepSummaryWriter.write")
            return None
        with self._lock:
            self.written += 1
        return summary

    def step_collected(self, table: PhaseTable, metrics: StepMetrics, step: int | None, validate: bool) -> None:
        """``collect()`` returned ``metrics``: write the step's summary (:meth:`write`)."""
        self.write(table, metrics, step, validate)

    def close(self) -> None:
        self.closed = True

    @property
    def stats(self) -> dict[str, int]:
        return {"summaries_written": self.written, "summaries_failed": self.failed}
