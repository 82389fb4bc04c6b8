"""Rebuild a step from stored spans (a trace file or Jaeger): verl's metrics, the slowest samples, a waterfall.

The metrics go through the live path: the spans are fed to a :class:`PhaseMetricsProcessor` (``ingest``) and
:func:`compute_metrics` computes the dict, so a report and the live ``collect`` cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .. import semconv as sc
from ..metrics._processor import PhaseMetricsProcessor
from ..metrics._records import SpanRecord
from ..metrics._summary import StepSummary, summarize
from ..metrics._table import PhaseTable, StepMetrics, compute_metrics

SampleKey = tuple[int, int]


@dataclass
class StepReport:
    step: int
    validate: bool
    metrics: StepMetrics
    table: PhaseTable
    samples: dict[SampleKey, list[SpanRecord]]

    def slowest(self, n: int = 5) -> list[dict[str, object]]:
        return self.table.slowest(n)


def build_report(records: Iterable[SpanRecord], step: int, validate: bool = False) -> StepReport:
    """The report of ``step`` from ``records`` (spans of other steps are ignored)."""
    proc = PhaseMetricsProcessor(max_steps=1 << 16)
    samples: dict[SampleKey, list[SpanRecord]] = {}
    for rec in records:
        attrs = rec.attributes
        if attrs.get(sc.RL_STEP) != step or bool(attrs.get(sc.RL_VALIDATE, False)) != validate:
            continue
        index = attrs.get(sc.RL_SAMPLE_INDEX)
        if isinstance(index, int):
            rollout = attrs.get(sc.RL_ROLLOUT_N)
            samples.setdefault((index, rollout if isinstance(rollout, int) else -1), []).append(rec)
        proc.ingest(rec.name, attrs, rec.start_ns, rec.end_ns, rec.trace_id, rec.error)
    table = proc.take(step, validate)
    return StepReport(step, validate, compute_metrics(table), table, samples)


def steps_in(records: Iterable[SpanRecord]) -> list[tuple[int, bool]]:
    """The (step, validate) pairs that have sample spans in ``records``, sorted."""
    found = {
        (r.attributes[sc.RL_STEP], bool(r.attributes.get(sc.RL_VALIDATE, False)))
        for r in records
        if r.name == sc.SAMPLE_SPAN and type(r.attributes.get(sc.RL_STEP)) is int
    }
    return sorted(found)


def stored_summaries(records: Iterable[SpanRecord]) -> dict[tuple[int, bool], StepSummary]:
    """The step summaries the live side wrote (``rl.step.summary`` spans), by (step, validate); the latest of
    each when a step was collected more than once. A summary that cannot be read is left out (see ``report``)."""
    found: dict[tuple[int, bool], tuple[int, StepSummary]] = {}
    for rec in records:
        if rec.name != sc.STEP_SUMMARY_SPAN:
            continue
        text = rec.attributes.get(sc.RL_STEP_SUMMARY)
        if not isinstance(text, str):
            continue
        try:
            summary = StepSummary.from_json(text)
        except ValueError:
            continue
        key = (summary.step, summary.validate)
        if key not in found or found[key][0] <= rec.end_ns:
            found[key] = (rec.end_ns, summary)
    return {key: summary for key, (_, summary) in found.items()}


def summary_of(records: Iterable[SpanRecord], step: int, validate: bool = False) -> StepSummary:
    """The summary of ``step`` rebuilt from its stored sample spans, through the same code as the live side
    (``PhaseMetricsProcessor`` -> ``compute_metrics`` -> ``summarize``, tool calls from the table)."""
    report = build_report(records, step, validate)
    return summarize(report.table, report.metrics, step, validate)
