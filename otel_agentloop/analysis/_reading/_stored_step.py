"""What ``report --step`` prints, from the step's stored summary or from its spans: one answer, two sources.

From Jaeger a step of 8,192 samples is about 80,000 spans, and finding and fetching them costs tens of seconds
on a store of millions (``bench/RESULTS.md``, "Store soak"). The step's ``rl.step.summary`` span (a trace of its
own, written at collect) holds what the terminal and ``--json`` report print: the metrics dict exactly as
``collect()`` returned it, the slowest samples (:data:`~..metrics._summary.TOP_STORED`) with their verdicts and
causes, the watchdog's hung and slow samples, the verdict counts and the failed samples' keys. The waterfall's
sample is then one trace fetched by id. :func:`from_summary` answers ``None`` whenever the summary does not hold
everything the command asks (no summary, one older than schema version 3, ``--top`` beyond its list, a
``--sample`` it does not name, ``--json`` with more failed samples than it lists, ``--from-spans``, a page or a
Perfetto file, ``--compare``): the caller then reads the step's spans (:func:`from_report`), as from a file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ... import semconv as sc
from ...metrics._records import SpanRecord
from ...metrics._summary import FAILED, StepSummary
from ...metrics._table import OverdueSample
from ...metrics._verdicts import StepVerdicts
from ._decode import Skipped, decode_resource_spans
from ._jaeger import JaegerError
from ._jaeger_run import run_records
from ._options import StepOptions
from ._report import (
    SampleKey,
    StepReport,
    adopt_unstepped,
    overdue_json,
    sample_key_of,
    step_verdicts,
    stored_summaries,
)
from ._runs import RunNotFoundError
from ._source import JaegerSource
from ._summary_check import checked, skipped_line

SUMMARY = "summary"
"""``StepAnswer.read_from`` of an answer from the step's stored summary."""
SPANS = "spans"
"""``StepAnswer.read_from`` of an answer rebuilt from the step's sample spans."""


@dataclass
class StepAnswer:
    """The facts ``report --step`` prints about one step, whichever source they came from.

    ``rows``: ``PhaseTable.slowest`` rows with ``verdict`` and ``cause`` (``--top`` of them); ``verdicts``: the
    ``--json`` verdicts object; ``samples``: the spans of the samples it can draw (every sample from spans, one
    from a summary); ``read_from``: :data:`SUMMARY` or :data:`SPANS`."""

    step: int
    validate: bool
    metrics: Mapping[str, float]
    rows: list[dict[str, object]]
    hung: list[OverdueSample]
    verdicts: dict[str, object]
    slowest_sample: SampleKey | None
    slowest_trace_id: str | None
    read_from: str
    samples: dict[SampleKey, list[SpanRecord]] = field(default_factory=dict)


def from_report(report: StepReport, top: int) -> StepAnswer:
    """The answer of a step rebuilt from its spans (``analysis._reading._report.build_report``)."""
    return StepAnswer(
        report.step,
        report.validate,
        report.metrics,
        report.slowest(top),
        list(report.verdicts.hung.values()),
        report.verdicts_json(),
        report.metrics.slowest_sample,
        report.metrics.slowest_trace_id,
        SPANS,
        report.samples,
    )


def summary_rows(summary: StepSummary, top: int) -> list[dict[str, object]]:
    """The first ``top`` of the summary's slowest samples as ``StepReport.slowest`` rows (same keys, same
    values: the summary stores the numbers that table had)."""
    return [
        {
            "sample_index": s.index,
            "rollout_n": s.rollout,
            "total": s.total_s,
            sc.GENERATE: s.generate_s,
            sc.TOOL_CALLS: s.tool_s,
            sc.COMPUTE_SCORE: s.score_s,
            "error": s.verdict == FAILED,
            "trace_id": s.trace_id,
            "verdict": s.verdict,
            "cause": s.cause,
        }
        for s in summary.top[: max(0, top)]
    ]


def summary_verdicts(summary: StepSummary, verdicts: StepVerdicts) -> dict[str, object]:
    """``StepReport.verdicts_json`` from the summary (``verdicts``: its own, :func:`step_verdicts`): its counts,
    the watchdog's samples, the failed keys."""
    return {
        "counts": dict(summary.counts),
        "hung": overdue_json(verdicts.hung.values()),
        "slow": overdue_json(verdicts.slow.values()),
        "failed": [list(k) for k in summary.failed],
        "from": verdicts.source,
    }


def _trace_of(summary: StepSummary, key: SampleKey) -> str | None:
    """The trace id the summary records for sample ``key`` (its slowest list, its hung and slow samples)."""
    for s in summary.top:
        if (s.index, s.rollout) == key:
            return s.trace_id
    for o in (*summary.hung, *summary.slow):
        if (o.sample_index, -1 if o.rollout_n is None else o.rollout_n) == key:
            return o.trace_id
    return None


def from_summary(asked: StepOptions, jaeger: JaegerSource, note: Callable[[str], None]) -> StepAnswer | None:
    """The answer to ``asked`` from the step's stored summary in ``jaeger`` and one trace fetched by id, or
    ``None`` when the spans must be read (see the module). ``note`` gets the run lines of ``one_run`` only when it
    answers. Raises :class:`JaegerError` from the searches."""
    if asked.spans:
        return None
    lines: list[str] = []
    bad = Skipped()
    records = checked(jaeger.search(lines.append, operation=sc.STEP_SUMMARY_SPAN), bad)
    if bad.count:
        lines.append(skipped_line(bad, jaeger.label))
    try:
        run = run_records(records, asked.run_id, lines.append)  # the run line always printed
    except RunNotFoundError:
        return None  # the span search says what runs there are
    summaries = stored_summaries(run)
    steps = [s for s, v in summaries if v == asked.validate]
    step = asked.number if asked.number is not None else max(steps, default=None)
    summary = summaries.get((step, asked.validate)) if step is not None else None
    if summary is None or not summary.top_complete(asked.top) or (asked.all_failed and not summary.failed_complete):
        return None
    slowest = (summary.slowest.index, summary.slowest.rollout) if summary.slowest is not None else None
    key = (asked.sample, asked.rollout) if asked.sample is not None else slowest
    samples: dict[SampleKey, list[SpanRecord]] = {}
    if key is not None:
        trace_id = _trace_of(summary, key)
        if trace_id is None:
            return None
        try:
            found = decode_resource_spans(jaeger.client.get_trace(trace_id), Skipped())
            spans = [r for r in found if r.attributes.get(sc.RL_SNAPSHOT) is not True]  # as report leaves them out
        except JaegerError:
            return None
        samples[key] = [r for r in spans if sc.step_key(r.attributes) == (summary.step, summary.validate)
                        and sample_key_of(r.attributes) == key]  # fmt: skip
        if not samples[key]:
            return None
        adopt_unstepped(samples, [r for r in spans if r.attributes.get(sc.RL_STEP) is None])
    for line in lines:
        note(line)
    verdicts = step_verdicts((), summary.step, summary.validate, summary)  # from the summary alone
    return StepAnswer(
        summary.step,
        summary.validate,
        summary.metrics,
        summary_rows(summary, asked.top),
        list(verdicts.hung.values()),
        summary_verdicts(summary, verdicts),
        slowest,
        summary.slowest.trace_id if summary.slowest is not None else None,
        SUMMARY,
        samples,
    )
