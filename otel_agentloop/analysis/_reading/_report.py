"""Rebuild a step from stored spans (a trace file or Jaeger): verl's metrics, the slowest samples, a waterfall.

The metrics go through the live path: the spans are fed to a :class:`PhaseMetricsProcessor` (``ingest``) and
:func:`compute_metrics` computes the dict, so a report and the live ``collect`` cannot disagree.

Verdicts (one rule, ``metrics._summary.verdict``): a sample the watchdog reported that was still running when its
step was collected is *hung* for that step, even if it ended (or was cancelled) later. ``collect()`` left it out
of the step's table, so a report leaves it out too: it is never the step's ``slowest`` and its spans add nothing
to the step's metrics (live, they would be the step's late samples of a later collect). Which samples were hung
comes from the step's stored summary (``rl.step.summary``, written at collect: exact) when there is one, else
from the watchdog's snapshot spans (:func:`step_verdicts`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from ... import semconv as sc
from ...metrics._processor import PhaseMetricsProcessor
from ...metrics._records import SpanRecord
from ...metrics._summary import StepSummary, sample_causes, summarize
from ...metrics._table import OverdueSample, PhaseTable, StepMetrics, compute_metrics
from ...metrics._verdicts import FAILED, HUNG, StepVerdicts, Verdict, apply_verdicts, classify_reported, count_verdicts
from ._summary_check import read_summary

SampleKey = tuple[int, int]


@dataclass
class StepReport:
    """One stored step rebuilt: ``metrics`` and ``table`` as ``collect()`` had them (hung samples left out),
    ``samples`` every sample's spans (hung ones included, to draw them), ``verdicts`` the watchdog's."""

    step: int
    validate: bool
    metrics: StepMetrics
    table: PhaseTable
    samples: dict[SampleKey, list[SpanRecord]]
    verdicts: StepVerdicts = field(default_factory=lambda: StepVerdicts({}, {}, "none"))

    def slowest(self, n: int = 5) -> list[dict[str, object]]:
        """``PhaseTable.slowest`` rows, each with its ``verdict`` and its ``cause`` in words
        (``metrics._summary.cause``)."""
        rows = self.table.slowest(n)
        keys = [(int(row["sample_index"]), int(row["rollout_n"])) for row in rows]  # type: ignore[call-overload]
        causes = self.causes(keys)
        for row, key in zip(rows, keys, strict=True):
            row["verdict"] = self.verdicts.of_sample(key, error=bool(row["error"]))
            row["cause"] = causes.get(key, "")
        return rows

    def causes(self, keys: Iterable[SampleKey] | None = None) -> dict[SampleKey, str]:
        """The cause in words of each sample of ``keys`` in the table (default: the slowest and the slow ones),
        by the one rule (``metrics._summary.cause``) on the table and metrics ``collect()`` had."""
        if keys is None:
            keys = [*self.verdicts.slow, *([self.metrics.slowest_sample] if self.metrics.slowest_sample else [])]
        return sample_causes(self.table, self.metrics, keys)

    def sample_verdicts(self) -> dict[SampleKey, str]:
        """Every sample's verdict: the table's (collected) samples and the hung ones."""
        t = self.table
        out = {
            (int(t.sample_index[i]), int(t.rollout_n[i])): self.verdicts.of_sample(
                (int(t.sample_index[i]), int(t.rollout_n[i])), error=bool(t.error[i])
            )
            for i in range(len(t))
        }
        out.update(dict.fromkeys(self.verdicts.hung, HUNG))
        return out

    def verdict_counts(self) -> dict[str, int]:
        return count_verdicts(self.sample_verdicts().values())

    def verdicts_json(self) -> dict[str, object]:
        """The step's verdicts for ``report --json``: counts, the hung/slow/failed samples and the source."""
        by_sample = self.sample_verdicts()
        return {
            "counts": count_verdicts(by_sample.values()),
            "hung": overdue_json(self.verdicts.hung.values()),
            "slow": overdue_json(self.verdicts.slow.values()),
            "failed": [list(k) for k, v in sorted(by_sample.items()) if v == FAILED],
            "from": self.verdicts.source,
        }


def sample_key_of(attrs: Mapping[str, object]) -> SampleKey | None:
    """(sample index, rollout) of a sample's span (rollout -1 when unknown); ``None`` without an int index (a
    bool is not one)."""
    index = attrs.get(sc.RL_SAMPLE_INDEX)
    if type(index) is not int:
        return None
    rollout = attrs.get(sc.RL_ROLLOUT_N)
    return index, rollout if type(rollout) is int else -1


def of_step(
    records: Iterable[SpanRecord], step: int, validate: bool, unstepped: list[SpanRecord]
) -> Iterator[tuple[SpanRecord, SampleKey | None]]:
    """The records of ``step`` (its validation pass with ``validate``) with their samples' keys; the records
    without any ``rl.step`` go to ``unstepped`` (for :func:`adopt_unstepped`), other steps' are left out."""
    for rec in records:
        attrs = rec.attributes
        if sc.step_key(attrs) != (step, validate):
            if attrs.get(sc.RL_STEP) is None:
                unstepped.append(rec)
            continue
        yield rec, sample_key_of(attrs)


def overdue_json(items: Iterable[OverdueSample]) -> list[dict[str, object]]:
    """The watchdog's samples as ``report --json`` lists them."""
    return [
        {"sample_index": s.sample_index, "rollout_n": s.rollout_n, "trace_id": s.trace_id, "phase": s.phase,
         "tool": s.tool}
        for s in items
    ]  # fmt: skip


def adopt_unstepped(samples: dict[SampleKey, list[SpanRecord]], foreign: list[SpanRecord]) -> None:
    """Add to each sample the spans without a step under its own (an engine's ``llm_request`` child of a turn,
    and that span's children), to draw them in its waterfall; they count in no metric."""
    owner = {rec.span_id: key for key, recs in samples.items() for rec in recs}
    while foreign:
        left = []
        for rec in foreign:
            key = owner.get(rec.parent_id)
            if key is None:
                left.append(rec)
            else:
                samples[key].append(rec)
                owner[rec.span_id] = key
        if len(left) == len(foreign):
            return
        foreign = left


def build_report(
    records: Iterable[SpanRecord], step: int, validate: bool = False, verdicts: StepVerdicts | None = None
) -> StepReport:
    """The report of ``step`` from ``records`` (spans of other steps are ignored). With ``verdicts``, the hung
    samples are left out of the metrics (as ``collect()`` left them out) and the watchdog's keys are added."""
    proc = PhaseMetricsProcessor(max_steps=1 << 16)
    samples: dict[SampleKey, list[SpanRecord]] = {}
    hung = verdicts.hung if verdicts is not None else {}
    foreign: list[SpanRecord] = []
    for rec, key in of_step(records, step, validate, foreign):
        if key is not None:
            samples.setdefault(key, []).append(rec)
            if key in hung:
                continue
        proc.ingest(rec.name, rec.attributes, rec.start_ns, rec.end_ns, rec.trace_id, rec.error)
    adopt_unstepped(samples, foreign)
    table = proc.take(step, validate)
    metrics = compute_metrics(table)
    if verdicts is None:
        return StepReport(step, validate, metrics, table, samples)
    apply_verdicts(metrics, [verdicts.as_verdict()])
    return StepReport(step, validate, metrics, table, samples, verdicts)


def _is_snapshot(rec: SpanRecord) -> bool:
    return rec.attributes.get(sc.RL_SNAPSHOT) is True


def step_verdicts(
    records: Iterable[SpanRecord], step: int, validate: bool = False, summary: StepSummary | None = None
) -> StepVerdicts:
    """The watchdog's hung and slow samples of ``step``.

    With the step's stored ``summary``, its ``hung``/``slow`` lists (made at collect) decide. Without one, the
    snapshot rule: a sample the watchdog snapshotted (it reported it) is *hung* when its ``rl.sample`` span never
    ended or ended cancelled (``rl.cancelled``: a trainer cancels what still runs after collecting the step), else
    *slow*. The snapshot rule cannot see the collect: a sample cancelled before its step was collected is slow
    live and hung here; a summary has the truth.
    """
    if summary is not None:
        return StepVerdicts.of(Verdict(tuple(summary.slow), tuple(summary.hung)), "summary")
    snapshots: dict[SampleKey, SpanRecord] = {}
    roots: dict[SampleKey, SpanRecord] = {}
    for rec in records:
        attrs = rec.attributes
        if sc.step_key(attrs) != (step, validate):
            continue
        index = attrs.get(sc.RL_SAMPLE_INDEX)
        if type(index) is not int:
            continue
        rollout = attrs.get(sc.RL_ROLLOUT_N)
        key = (index, rollout if type(rollout) is int else -1)
        if _is_snapshot(rec):
            if key not in snapshots or snapshots[key].end_ns > rec.end_ns:
                snapshots[key] = rec  # the first: the moment the watchdog reported it
        elif rec.name == sc.SAMPLE_SPAN:
            roots[key] = rec
    slow: list[OverdueSample] = []
    hung: list[OverdueSample] = []
    for key, snap in sorted(snapshots.items()):
        tool = snap.attributes.get(sc.GEN_AI_TOOL_NAME)
        item = OverdueSample(
            key[0],
            key[1] if key[1] >= 0 else None,
            snap.trace_id_hex,
            str(snap.attributes.get(sc.RL_PHASE, "other")),
            tool if isinstance(tool, str) else None,
        )
        root = roots.get(key)
        finished = root is not None and root.attributes.get(sc.RL_CANCELLED) is not True
        (hung if classify_reported(finished=finished) == HUNG else slow).append(item)
    return StepVerdicts.of(Verdict(tuple(slow), tuple(hung)), "snapshots")


def steps_in(records: Iterable[SpanRecord]) -> list[tuple[int, bool]]:
    """The (step, validate) pairs that have sample spans in ``records``, sorted."""
    found: set[tuple[int, bool]] = set()
    for r in records:
        if r.name == sc.SAMPLE_SPAN:
            step, validate = sc.step_key(r.attributes)
            if step is not None:
                found.add((step, validate))
    return sorted(found)


def stored_summaries(records: Iterable[SpanRecord]) -> dict[tuple[int, bool], StepSummary]:
    """The step summaries the live side wrote (``rl.step.summary`` spans), by (step, validate). A step collected
    more than once: its latest summary, except that a later collect of only the samples still running at an
    earlier one (``agent_loop/late_samples``) never replaces the step's own summary (which says they were hung).
    A summary that cannot be read is left out (see ``report``)."""
    late_key = f"{sc.METRIC_PREFIX}/{sc.LATE_SAMPLES}"
    found: dict[tuple[int, bool], tuple[tuple[bool, int], StepSummary]] = {}
    for rec in records:
        if rec.name != sc.STEP_SUMMARY_SPAN:
            continue
        try:
            summary = read_summary(rec)  # checked, and of the step its span names
        except ValueError:
            continue
        key = (summary.step, summary.validate)
        rank = (late_key not in summary.metrics, rec.end_ns)  # the step's own collect first, then the latest
        if key not in found or found[key][0] <= rank:
            found[key] = (rank, summary)
    return {key: summary for key, (_, summary) in found.items()}


def summary_of(records: Iterable[SpanRecord], step: int, validate: bool = False) -> StepSummary:
    """The summary of ``step`` rebuilt from its stored sample spans, through the same code as the live side
    (``PhaseMetricsProcessor`` -> ``compute_metrics`` -> ``summarize``, tool calls from the table); hung samples by
    the snapshot rule (:func:`step_verdicts`), left out of the metrics as ``collect()`` leaves them out."""
    spans = list(records)
    report = build_report(spans, step, validate, step_verdicts(spans, step, validate))
    return summarize(report.table, report.metrics, step, validate)
