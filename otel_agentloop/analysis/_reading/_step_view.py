"""One step's samples on one time axis: the model behind the timeline page and the timeline PNG.

Built from stored spans (a trace file or Jaeger). A still-open sample reaches the backend only as a snapshot span
(``semconv.RL_SNAPSHOT``). Each sample has the one verdict (``metrics._summary.verdict``) that ``collect()`` and
``report`` give it, from the same :class:`~otel_agentloop.metrics._verdicts.StepVerdicts`
(``analysis._reading._report.step_verdicts``: the step's stored summary, else the snapshot rule): *hung*
(reported, still running when the step was collected, even if it ended later; one that never ended is drawn up to
its snapshot), *failed* (its ``rl.sample`` span ended with an error), *slow* (reported, finished before the
collect), *ok*. Phase time per sample is the wall time its phase spans cover (parallel tool calls count once),
computed as the metrics compute it.

Rows open on the tail: hung samples first, then the others by end time, last-ending first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ... import semconv as sc
from ...metrics._accumulate import add_interval
from ...metrics._records import SpanRecord
from ...metrics._summary import FAILED, HUNG, OK, SLOW, VERDICTS
from ...metrics._table import OverdueSample
from ...metrics._verdicts import StepVerdicts
from ._engine import Part, engine_parts
from ._engine_load import EngineLoad, step_engine_load
from ._report import adopt_unstepped, build_report, of_step, step_verdicts

SampleKey = tuple[int, int]
__all__ = ["FAILED", "HUNG", "OK", "SLOW", "SampleView", "StepView", "build_step_view", "is_snapshot"]


def order_spans(spans: Sequence[SpanRecord]) -> list[tuple[int, SpanRecord]]:
    """Spans as (depth, span) in tree order (children by start time); orphans hang off the top level.

    Iterative and cycle-safe: every span appears exactly once, however deep the tree; a span that is its own
    parent, or a cycle of parents, is drawn from its earliest span as a top-level one.
    """
    by_id = {s.span_id: s for s in spans}
    children: dict[int, list[SpanRecord]] = {}
    roots: list[SpanRecord] = []
    for s in spans:
        if s.parent_id and s.parent_id in by_id and s.parent_id != s.span_id:
            children.setdefault(s.parent_id, []).append(s)
        else:
            roots.append(s)
    for kids in children.values():
        kids.sort(key=lambda c: (c.start_ns, c.name))
    out: list[tuple[int, SpanRecord]] = []
    seen: set[int] = set()  # id() of the spans placed: duplicate span ids and cycles place each span once

    def walk(root: SpanRecord) -> None:
        stack = [(0, root)]
        while stack:
            depth, span = stack.pop()
            if id(span) in seen:
                continue
            seen.add(id(span))
            out.append((depth, span))
            kids = children.get(span.span_id, ())
            stack.extend((depth + 1, c) for c in reversed(kids) if id(c) not in seen)

    for root in sorted(roots, key=lambda r: (r.name != sc.SAMPLE_SPAN, r.start_ns)):
        walk(root)
    if len(seen) < len(spans):  # spans only reachable through a cycle of parents
        for s in sorted(spans, key=lambda r: (r.start_ns, r.name)):
            if id(s) not in seen:
                walk(s)
    return out


def is_snapshot(rec: SpanRecord) -> bool:
    """A snapshot of a still-open sample (not a finished span: never counted in metrics)."""
    return rec.attributes.get(sc.RL_SNAPSHOT) is True


@dataclass(slots=True)
class Bar:
    """One phase span of a sample on the step's axis; ``lane`` separates overlapping bars (parallel tools).
    ``open`` marks the phase a hung sample is still in (from its last finished phase to the snapshot);
    ``engine``: the engine's queue, prefill and decode inside a turn (``analysis._reading._engine.engine_parts``)."""

    phase: str
    name: str
    start_ns: int
    end_ns: int
    lane: int = 0
    error: bool = False
    open: bool = False
    engine: list[Part] = field(default_factory=list)


@dataclass
class SampleView:
    """One sample of the step. ``state`` is its verdict: ``ok``, ``failed``, ``slow`` or ``hung``; ``reported``:
    what the watchdog reported of it (``None`` when it did not); ``ended``: its ``rl.sample`` span is stored;
    ``cause``: why it took its time in words (``metrics._summary.cause``; the slowest and slow samples only)."""

    index: int
    rollout: int
    trace_id: str
    start_ns: int
    end_ns: int
    state: str
    phase_s: dict[str, float]
    bars: list[Bar]
    lanes: int
    waterfall: list[tuple[int, SpanRecord]]
    snapshot: SpanRecord | None = None
    error_spans: int = 0
    reported: OverdueSample | None = None
    ended: bool = True
    cause: str = ""

    @property
    def key(self) -> SampleKey:
        return (self.index, self.rollout)

    @property
    def total_s(self) -> float:
        """generate + tool + score seconds: the measure verl's ``slowest`` ranks by."""
        return sum(self.phase_s.values())

    @property
    def current_phase(self) -> str | None:
        """The phase the watchdog reported it in (its snapshot's, else the step summary's)."""
        if self.snapshot is not None:
            return str(self.snapshot.attributes.get(sc.RL_PHASE))
        return self.reported.phase if self.reported is not None else None


@dataclass
class StepView:
    """The samples of one step, hung ones first, then by end time, last-ending first; times are Unix ns.
    ``counts``: how many of each verdict; ``verdicts``: the watchdog's classification used."""

    step: int
    validate: bool
    samples: list[SampleView]
    t0_ns: int
    t1_ns: int
    slowest: SampleKey | None = None
    counts: dict[str, int] = field(default_factory=dict)
    verdicts: StepVerdicts | None = None
    engines: list[EngineLoad] = field(default_factory=list)
    """Each engine's load over ``[t0_ns, t1_ns]`` (``_engine_load.step_engine_load``; empty without load spans)."""


def _lanes(bars: list[Bar]) -> int:
    """Give overlapping bars different lanes (greedy by start); returns the number of lanes used."""
    ends: list[int] = []
    for bar in sorted(bars, key=lambda b: (b.start_ns, -b.end_ns)):
        for lane, end in enumerate(ends):
            if end <= bar.start_ns:
                bar.lane, ends[lane] = lane, bar.end_ns
                break
        else:
            bar.lane = len(ends)
            ends.append(bar.end_ns)
    return max(len(ends), 1)


def _sample_view(
    key: SampleKey, spans: Sequence[SpanRecord], snapshots: Sequence[SpanRecord], verdicts: StepVerdicts
) -> SampleView:
    root = next((s for s in spans if s.name == sc.SAMPLE_SPAN), None)
    snapshot = max(snapshots, key=lambda s: s.end_ns) if snapshots else None
    blocks: dict[str, list[int]] = {p: [] for p in sc.PHASES}
    phase_ns = dict.fromkeys(sc.PHASES, 0)
    bars: list[Bar] = []
    for s in sorted(spans, key=lambda s: (s.start_ns, s.end_ns)):
        phase = s.attributes.get(sc.RL_PHASE)
        if phase in blocks:
            phase_ns[phase] += add_interval(blocks[phase], s.start_ns, s.end_ns)
            parts = engine_parts(s.start_ns, s.end_ns, s.attributes)
            bars.append(Bar(str(phase), s.name, s.start_ns, s.end_ns, error=s.error, engine=parts))
    anchor = root or snapshot or min(spans, key=lambda s: s.start_ns)
    start = anchor.start_ns
    waterfall_spans = list(spans)
    state = verdicts.of_sample(key, error=root is not None and root.error)
    if root is not None:
        end = root.end_ns
        trace_id = root.trace_id_hex
        if snapshot is not None:
            waterfall_spans.append(snapshot)
    elif snapshot is not None:
        end = max(snapshot.end_ns, max((s.end_ns for s in spans), default=0))
        # The open phase started when the previous (different) phase ended, else with the sample.
        current = str(snapshot.attributes.get(sc.RL_PHASE))
        since = max((b.end_ns for b in bars if b.phase != current), default=snapshot.start_ns)
        bars.append(Bar(current, snapshot.name, since, snapshot.end_ns, open=True))
        trace_id = (
            spans[0].trace_id_hex
            if spans
            else format(snapshot.links[0][0], "032x")
            if snapshot.links
            else snapshot.trace_id_hex
        )
        # The sample span never ended: hang its finished children under the snapshot in the waterfall.
        ids = {s.span_id for s in spans}
        waterfall_spans = [snapshot] + [
            s if s.parent_id in ids else replace(s, parent_id=snapshot.span_id) for s in spans
        ]
    else:  # phase spans without their sample span (not exported, or still open without a snapshot)
        end = max(s.end_ns for s in spans)
        trace_id = anchor.trace_id_hex
    return SampleView(
        index=key[0],
        rollout=key[1],
        trace_id=trace_id,
        start_ns=start,
        end_ns=end,
        state=state,
        phase_s={p: ns / 1e9 for p, ns in phase_ns.items()},
        bars=bars,
        lanes=_lanes(bars),
        waterfall=order_spans(waterfall_spans),
        snapshot=snapshot,
        error_spans=sum(s.error for s in spans),
        reported=verdicts.hung.get(key) or verdicts.slow.get(key),
        ended=root is not None,
    )


def build_step_view(
    records: Iterable[SpanRecord],
    step: int,
    validate: bool = False,
    verdicts: StepVerdicts | None = None,
    causes: Mapping[SampleKey, str] | None = None,
) -> StepView:
    """The view of ``step`` (its validation pass with ``validate``) from ``records``; other steps are ignored.
    ``verdicts``: the step's (``analysis._reading._report.step_verdicts``); by default the snapshot rule over
    ``records``.
    ``causes``: the slowest and slow samples' (``StepReport.causes``); by default rebuilt from ``records``.
    """
    records = list(records)
    if verdicts is None:
        verdicts = step_verdicts(records, step, validate)
    spans: dict[SampleKey, list[SpanRecord]] = {}
    snapshots: dict[SampleKey, list[SpanRecord]] = {}
    foreign: list[SpanRecord] = []
    for rec, key in of_step(records, step, validate, foreign):
        if key is None:
            continue
        (snapshots if is_snapshot(rec) else spans).setdefault(key, []).append(rec)
    adopt_unstepped(spans, foreign)
    if causes is None:
        causes = build_report(records, step, validate, verdicts).causes()
    samples = [
        _sample_view(k, spans.get(k, []), snapshots.get(k, []), verdicts) for k in spans.keys() | snapshots.keys()
    ]
    for sample in samples:
        sample.cause = causes.get(sample.key, "")
    # the tail first: what the step waited for is on the first screen
    samples.sort(key=lambda s: (s.state != HUNG, -s.end_ns, s.key))
    finished = [s for s in samples if s.state != HUNG]
    slowest = None
    if finished:  # argmax of the total over the collected samples; ties to the first in (index, rollout) order
        slowest = min(finished, key=lambda s: (-s.total_s, s.key)).key
    counts = {state: sum(s.state == state for s in samples) for state in VERDICTS}
    t0, t1 = min((s.start_ns for s in samples), default=0), max((s.end_ns for s in samples), default=0)
    return StepView(
        step=step,
        validate=validate,
        samples=samples,
        t0_ns=t0,
        t1_ns=t1,
        slowest=slowest,
        counts=counts,
        verdicts=verdicts,
        engines=step_engine_load(records, step, validate, t0, t1) if samples else [],
    )
