"""``report --compare A B``: two steps side by side, and what explains the difference in their step time.

Each step is read as its :class:`StepSummary`: the one the live side stored (``rl.step.summary``), else rebuilt
from the step's sample spans by :func:`summary_of` (the code ``collect()`` runs), so every figure here equals the
metrics of ``report --step``. The per-sample rows (the tail's phase mix, the samples that moved) need the sample
spans; with summaries only, the comparison says so and falls back to the slowest sample.

What explains the difference (:func:`explain`): a step waits for its slowest sample, so its time is made at the
slow end. The *tail* of a step is its slowest :data:`TAIL_FRACTION` of samples (by generate + tool + score
seconds, at least one); its *mix* is the mean seconds per tail sample in each phase, and in each tool (the sum of
that sample's calls of the tool). The cause is the phase whose tail time moved most in the direction of the step
time, when it carries at least :data:`MAJORITY` (two thirds) of the tail's movement in that direction; within
``tool_calls``, the tool named by the same rule. No cause is named when the step time moved less than the noise
threshold (:data:`NOISE_REL` of step A's time, at least :data:`NOISE_ABS_S`), when the tail's phases moved less than
:data:`MIN_COVERAGE` of the step-time change (the time went elsewhere: waiting, scheduling), or when no phase
holds the majority (several causes, listed with their shares).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .. import semconv as sc
from ..metrics._records import SpanRecord
from ..metrics._summary import Distribution, StepSummary
from ..metrics._table import PhaseTable
from ._compare_html import write_compare_html
from ._engine import engine_value
from ._html import jaeger_ui_base
from ._report import build_report, steps_in, stored_summaries, summary_of
from ._runs import steps_text
from ._terminal import printable, say, say_json
from ._timeline_html import write_step_pages

SampleKey = tuple[int, int]

TAIL_FRACTION = 0.10
"""The tail of a step: its slowest 10% of samples (at least one)."""
NOISE_REL = 0.10
"""A step-time change under 10% of step A's time is noise ..."""
NOISE_ABS_S = 0.05
"""... and so is one under 50 ms."""
MAJORITY = 2 / 3
"""A phase (a tool) is the cause when it carries at least two thirds of the tail's movement: twice as much as all
the others together."""
MIN_COVERAGE = 0.25
"""The tail's phases must move by at least a quarter of the step-time change to explain it."""
STATS = ("p50", "p90", "p99", "max")


# -- the rule -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TailMix:
    """Mean seconds per sample, in each phase and each tool, over a step's slowest samples (``samples`` of them;
    ``basis`` says which: e.g. ``"slowest 10% (7 of 64 samples)"``)."""

    samples: int
    phases: Mapping[str, float]
    tools: Mapping[str, float]
    basis: str


@dataclass(frozen=True)
class Cause:
    """What explains the step-time change from A to B (see the module docstring).

    ``phase``/``tool`` are ``None`` when no cause (no tool) is named; ``phase_deltas``/``tool_deltas`` are the
    tail's B - A seconds per sample; ``phase_share``/``tool_share`` the named one's part of the tail's movement in
    the step's direction (0 when none is named). ``text``: one sentence for people."""

    step_delta_s: float
    threshold_s: float
    phase: str | None
    tool: str | None
    phase_share: float
    tool_share: float
    phase_deltas: Mapping[str, float]
    tool_deltas: Mapping[str, float]
    text: str

    @property
    def clear(self) -> bool:
        return self.phase is not None


def _leader(deltas: Mapping[str, float], sign: float) -> tuple[str | None, float, float]:
    """The key whose delta moved most in the direction ``sign``, its share of the movement in that direction,
    and that movement (the sum of the positive parts); ``(None, 0, 0)`` when nothing moved that way."""
    moved = {k: sign * v for k, v in deltas.items() if sign * v > 0}
    total = sum(moved.values())
    if not moved or total <= 0:
        return None, 0.0, 0.0
    name = max(sorted(moved), key=lambda k: moved[k])
    return name, moved[name] / total, total


def explain(
    step_a_s: float,
    step_b_s: float,
    tail_a: TailMix,
    tail_b: TailMix,
    *,
    noise_rel: float = NOISE_REL,
    noise_abs_s: float = NOISE_ABS_S,
    majority: float = MAJORITY,
    min_coverage: float = MIN_COVERAGE,
) -> Cause:
    """Which phase (and which tool) explains the step time going from ``step_a_s`` to ``step_b_s``, given the
    tails' mixes; pure (see the module docstring for the rule)."""
    delta = step_b_s - step_a_s
    threshold = max(noise_abs_s, noise_rel * max(step_a_s, 0.0))
    phases = {p: tail_b.phases.get(p, 0.0) - tail_a.phases.get(p, 0.0) for p in sc.PHASES}
    tools = {t: tail_b.tools.get(t, 0.0) - tail_a.tools.get(t, 0.0) for t in sorted({*tail_a.tools, *tail_b.tools})}
    verb = "slower" if delta > 0 else "faster"

    def cause(
        text: str, phase: str | None = None, share: float = 0.0, tool: str | None = None, tshare: float = 0.0
    ) -> Cause:
        return Cause(delta, threshold, phase, tool, share, tshare, phases, tools, text)

    if not abs(delta) >= threshold:  # also NaN
        return cause(
            f"no clear cause: the step time changed by {delta:+.3f} s, under the noise threshold of "
            f"{threshold:.3f} s ({noise_rel:.0%} of step A's time, at least {noise_abs_s * 1e3:.0f} ms)"
        )
    sign = 1.0 if delta > 0 else -1.0
    phase, share, moved = _leader(phases, sign)
    if phase is None or moved < min_coverage * abs(delta):
        return cause(
            f"no clear cause: the step got {abs(delta):.3f} s {verb}, but its slowest samples' phase times moved "
            f"by only {moved:.3f} s in that direction (the time went elsewhere: waiting, scheduling, samples "
            "outside the tail)"
        )
    if share < majority:
        parts = ", ".join(f"{p} {d:+.3f} s" for p, d in sorted(phases.items(), key=lambda kv: -sign * kv[1]))
        return cause(f"no single cause: the step got {abs(delta):.3f} s {verb}; the slowest samples moved by {parts}")
    head = (
        f"the step got {abs(delta):.3f} s {verb}; its slowest samples ({tail_b.basis}) spent "
        f"{phases[phase]:+.3f} s in {phase} ({share:.0%} of their phase-time change)"
    )
    if phase != sc.TOOL_CALLS or not tools:
        return cause(f"{phase}: {head}", phase, share)
    tool, tshare, _ = _leader(tools, sign)
    if tool is None or tshare < majority:
        parts = ", ".join(f"{t} {d:+.3f} s" for t, d in sorted(tools.items(), key=lambda kv: -sign * kv[1])[:4])
        return cause(f"{phase} (no single tool): {head}; by tool: {parts}", phase, share)
    text = f"tool {tool} ({phase}): {head}, of which {tool} {tools[tool]:+.3f} s ({tshare:.0%} of the tools' change)"
    return cause(text, phase, share, tool, tshare)


# -- one step's data --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepSide:
    """One step of the comparison: its summary (``stored``: written by the live side, else rebuilt from spans),
    and, when its sample spans are there, the per-sample table and each sample's seconds per tool."""

    summary: StepSummary
    stored: bool
    table: PhaseTable | None = None
    sample_tools: Mapping[SampleKey, Mapping[str, float]] = field(default_factory=dict)

    @property
    def has_samples(self) -> bool:
        return self.table is not None and len(self.table) > 0

    def tail(self, fraction: float = TAIL_FRACTION, *, summary_only: bool = False) -> TailMix:
        """The mix of this step's slowest ``fraction`` of samples; from the summary (without sample spans, or with
        ``summary_only``), its slowest sample, and each tool's seconds per sample over all samples (per-sample
        tool times need the spans)."""
        if self.table is not None and len(self.table) and not summary_only:
            t = self.table.canonical()
            n = len(t)
            k = max(1, math.ceil(n * fraction))
            top = np.argsort(-t.total, kind="stable")[:k]
            phases = {
                sc.GENERATE: float(t.generate_sequences[top].mean()),
                sc.TOOL_CALLS: float(t.tool_calls[top].mean()),
                sc.COMPUTE_SCORE: float(t.compute_score[top].mean()),
            }
            tools: dict[str, float] = {}
            for i in top:
                for name, seconds in self.sample_tools.get((int(t.sample_index[i]), int(t.rollout_n[i])), {}).items():
                    tools[name] = tools.get(name, 0.0) + seconds / k
            return TailMix(k, phases, tools, f"slowest {fraction:.0%}: {k} of {n} samples")
        s = self.summary
        n = max(s.num_samples, 1)
        tools = {name: d.sum / n for name, d in s.tools.items()}
        if s.slowest is None:
            return TailMix(0, {}, tools, "no samples")
        mix = {sc.GENERATE: s.slowest.generate_s, sc.TOOL_CALLS: s.slowest.tool_s, sc.COMPUTE_SCORE: s.slowest.score_s}
        return TailMix(1, mix, tools, "the slowest sample (summary only; tools over all samples)")


def _sample_spans(records: Iterable[SpanRecord], step: int, validate: bool) -> list[SpanRecord]:
    return [
        r
        for r in records
        if sc.step_key(r.attributes) == (step, validate)
        and not r.attributes.get(sc.RL_SNAPSHOT)
        and r.name != sc.STEP_SUMMARY_SPAN
    ]


def _with_wall_times(summary: StepSummary, spans: Sequence[SpanRecord]) -> StepSummary:
    """``summary`` with its wall times (first start, median and last end of the finished samples) taken from the
    sample spans when it has none."""
    samples = [r for r in spans if r.name == sc.SAMPLE_SPAN and r.end_ns > 0]
    if summary.start_ns or not samples:
        return summary
    ends = sorted(r.end_ns for r in samples)
    starts = [r.start_ns for r in samples if r.start_ns > 0]
    return replace(
        summary, start_ns=min(starts) if starts else 0, median_end_ns=ends[(len(ends) - 1) // 2], end_ns=ends[-1]
    )


def load_step(
    records: Sequence[SpanRecord],
    step: int,
    validate: bool = False,
    stored: Mapping[tuple[int, bool], StepSummary] | None = None,
) -> StepSide | None:
    """Step ``step`` from ``records`` (finished spans of one run); ``None`` when it has neither a stored summary
    nor sample spans. ``stored``: :func:`stored_summaries` of ``records`` (computed when not given)."""
    stored = stored_summaries(records) if stored is None else stored
    spans = _sample_spans(records, step, validate)
    report = build_report(spans, step, validate) if spans else None
    has_rows = report is not None and len(report.table) > 0
    summary = stored.get((step, validate))
    is_stored = summary is not None
    if summary is None:
        if not has_rows:
            return None
        summary = summary_of(spans, step, validate)
    summary = _with_wall_times(summary, spans)
    sample_tools: dict[SampleKey, dict[str, float]] = {}
    for rec in spans:
        name, index = rec.attributes.get(sc.GEN_AI_TOOL_NAME), rec.attributes.get(sc.RL_SAMPLE_INDEX)
        if isinstance(name, str) and isinstance(index, int):
            rollout = rec.attributes.get(sc.RL_ROLLOUT_N)
            per = sample_tools.setdefault((index, rollout if isinstance(rollout, int) else -1), {})
            per[name] = per.get(name, 0.0) + rec.duration_s
    return StepSide(summary, is_stored, report.table if has_rows and report else None, sample_tools)


# -- the comparison -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    """One line of the side-by-side table: a phase (seconds per sample) or a tool (seconds per call)."""

    kind: str  # "phase" or "tool"
    name: str
    a: Distribution
    b: Distribution

    def delta(self, stat: str) -> float:
        return float(getattr(self.b, stat) - getattr(self.a, stat))


@dataclass(frozen=True)
class MovedSample:
    """A sample present in both steps (matched by index and rollout) and how its total moved."""

    index: int
    rollout: int
    total_a: float
    total_b: float
    phase_deltas: Mapping[str, float]
    tool_deltas: Mapping[str, float]
    trace_a: str | None
    trace_b: str | None

    @property
    def delta(self) -> float:
        return self.total_b - self.total_a

    def moved_most(self) -> str:
        """The phase (and tool) whose change is largest in the direction of the total's, e.g.
        ``tool_calls +1.2 s (search +1.3 s)``."""
        sign = 1.0 if self.delta >= 0 else -1.0
        phase = max(sc.PHASES, key=lambda p: sign * self.phase_deltas.get(p, 0.0))
        text = f"{phase} {self.phase_deltas.get(phase, 0.0):+.3f} s"
        if phase == sc.TOOL_CALLS and self.tool_deltas:
            tool = max(sorted(self.tool_deltas), key=lambda t: sign * self.tool_deltas[t])
            text += f" ({tool} {self.tool_deltas[tool]:+.3f} s)"
        return text


@dataclass(frozen=True)
class Comparison:
    """Step A against step B: the table, the step times, the cause, the samples that moved."""

    a: StepSide
    b: StepSide
    step_time_basis: str
    step_a_s: float
    step_b_s: float
    rows: tuple[Row, ...]
    tail_a: TailMix
    tail_b: TailMix
    cause: Cause
    moved: tuple[MovedSample, ...]
    only_a: int
    only_b: int
    notes: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able data (``report --compare --json`` prints it; the page draws it)."""

        def dist(d: Distribution) -> dict[str, float]:
            return {"count": d.count, **{s: getattr(d, s) for s in STATS}, "mean": d.mean}

        def side(s: StepSide, step_s: float, tail: TailMix) -> dict[str, Any]:
            m = s.summary
            slowest = m.slowest
            return {
                "step": m.step,
                "validate": m.validate,
                "summary": "stored" if s.stored else "rebuilt from spans",
                "num_samples": m.num_samples,
                "step_s": step_s,
                "wall_s": m.wall_s,
                "until_median_s": m.median_s,
                "tail_s": m.tail_s,
                "counts": dict(m.counts),
                "slowest": None
                if slowest is None
                else {
                    "sample_index": slowest.index,
                    "rollout_n": slowest.rollout,
                    "trace_id": slowest.trace_id,
                    "total_s": slowest.total_s,
                    sc.GENERATE: slowest.generate_s,
                    sc.TOOL_CALLS: slowest.tool_s,
                    sc.COMPUTE_SCORE: slowest.score_s,
                    **({"cause": slowest.cause} if slowest.cause else {}),
                },
                **({"engine": {k: dist(d) for k, d in m.engine.items()}} if m.engine else {}),
                "tail_mix": {
                    "basis": tail.basis,
                    "samples": tail.samples,
                    "phases": dict(tail.phases),
                    "tools": dict(tail.tools),
                },
            }

        c = self.cause
        return {
            "a": side(self.a, self.step_a_s, self.tail_a),
            "b": side(self.b, self.step_b_s, self.tail_b),
            "step_time": {
                "basis": self.step_time_basis,
                "a": self.step_a_s,
                "b": self.step_b_s,
                "delta": self.step_b_s - self.step_a_s,
            },
            "cause": {
                "phase": c.phase,
                "tool": c.tool,
                "phase_share": c.phase_share,
                "tool_share": c.tool_share,
                "step_delta_s": c.step_delta_s,
                "noise_threshold_s": c.threshold_s,
                "tail_phase_deltas": dict(c.phase_deltas),
                "tail_tool_deltas": dict(c.tool_deltas),
                "text": c.text,
            },
            "rows": [
                {
                    "kind": r.kind,
                    "name": r.name,
                    "a": dist(r.a),
                    "b": dist(r.b),
                    "delta": {"count": r.b.count - r.a.count, **{s: r.delta(s) for s in STATS}},
                }
                for r in self.rows
            ],
            "moved": [
                {
                    "sample_index": m.index,
                    "rollout_n": m.rollout,
                    "total_a": m.total_a,
                    "total_b": m.total_b,
                    "delta": m.delta,
                    "moved_most": m.moved_most(),
                    "phase_deltas": dict(m.phase_deltas),
                    "tool_deltas": dict(m.tool_deltas),
                    "trace_id_a": m.trace_a,
                    "trace_id_b": m.trace_b,
                }
                for m in self.moved
            ],
            "only_in_a": self.only_a,
            "only_in_b": self.only_b,
            "notes": list(self.notes),
        }


def _moved(a: StepSide, b: StepSide, top: int) -> tuple[list[MovedSample], int, int]:
    """The ``top`` samples whose total moved most (by absolute change), and how many are in one step only."""
    if a.table is None or b.table is None:
        return [], 0, 0
    ta, tb = a.table.canonical(), b.table.canonical()
    rows_a = {(int(ta.sample_index[i]), int(ta.rollout_n[i])): i for i in range(len(ta))}
    rows_b = {(int(tb.sample_index[i]), int(tb.rollout_n[i])): i for i in range(len(tb))}
    common = sorted(rows_a.keys() & rows_b.keys())
    out: list[MovedSample] = []
    for key in common:
        i, j = rows_a[key], rows_b[key]
        phases = {
            sc.GENERATE: float(tb.generate_sequences[j] - ta.generate_sequences[i]),
            sc.TOOL_CALLS: float(tb.tool_calls[j] - ta.tool_calls[i]),
            sc.COMPUTE_SCORE: float(tb.compute_score[j] - ta.compute_score[i]),
        }
        tools_a, tools_b = a.sample_tools.get(key, {}), b.sample_tools.get(key, {})
        tools = {t: tools_b.get(t, 0.0) - tools_a.get(t, 0.0) for t in sorted({*tools_a, *tools_b})}
        out.append(
            MovedSample(
                key[0],
                key[1],
                float(ta.total[i]),
                float(tb.total[j]),
                phases,
                tools,
                ta.trace_id_hex(i),
                tb.trace_id_hex(j),
            )
        )
    out.sort(key=lambda m: -abs(m.delta))  # stable: ties keep (index, rollout) order
    return out[: max(top, 0)], len(rows_a.keys() - rows_b.keys()), len(rows_b.keys() - rows_a.keys())


def compare(a: StepSide, b: StepSide, *, top: int = 5) -> Comparison:
    """Step ``a`` against step ``b`` (see the module docstring)."""
    notes = []
    if a.summary.wall_s > 0 and b.summary.wall_s > 0:
        basis, step_a, step_b = (
            "rollout wall time, first sample start to last sample end",
            a.summary.wall_s,
            b.summary.wall_s,
        )
    else:
        basis = "the slowest sample's generate + tool + score seconds, no wall times stored"
        step_a = a.summary.slowest.total_s if a.summary.slowest else 0.0
        step_b = b.summary.slowest.total_s if b.summary.slowest else 0.0
    both = a.has_samples and b.has_samples  # else both tails from the summaries, so that they compare
    tail_a, tail_b = a.tail(summary_only=not both), b.tail(summary_only=not both)
    if not both:
        bare = " and ".join(f"step {s.summary.step}" for s in (a, b) if not s.has_samples)
        notes.append(
            f"{bare}: summary only, no sample spans (sampled away or expired): each step's tail is its slowest "
            "sample, tools are compared over all samples, and the samples that moved need the spans"
        )
    rows = [
        Row("phase", p, a.summary.phases.get(p, Distribution.of([])), b.summary.phases.get(p, Distribution.of([])))
        for p in sc.PHASES
    ]
    empty = Distribution.of([])
    rows += [
        Row("tool", t, a.summary.tools.get(t, empty), b.summary.tools.get(t, empty))
        for t in sorted({*a.summary.tools, *b.summary.tools})
    ]
    moved, only_a, only_b = _moved(a, b, top)
    return Comparison(
        a,
        b,
        basis,
        step_a,
        step_b,
        tuple(rows),
        tail_a,
        tail_b,
        explain(step_a, step_b, tail_a, tail_b),
        tuple(moved),
        only_a,
        only_b,
        tuple(notes),
    )


def compare_steps(
    records: Sequence[SpanRecord], step_a: int, step_b: int, validate: bool = False, *, top: int = 5
) -> Comparison | str:
    """:func:`compare` of two steps of ``records`` (finished spans of one run), or why it cannot be made."""
    stored = stored_summaries(records)
    sides = [load_step(records, s, validate, stored) for s in (step_a, step_b)]
    missing = [s for s, side in zip((step_a, step_b), sides, strict=True) if side is None]
    if missing or sides[0] is None or sides[1] is None:
        kind = "validation " if validate else ""
        exists = sorted({*stored, *steps_in(records)})
        return (
            f"no {kind}summary or sample spans for step {', '.join(map(str, missing))} (steps with a summary or "
            f"sample spans: {steps_text(exists)})"
        )
    return compare(sides[0], sides[1], top=top)


# -- the terminal -------------------------------------------------------------------------------------------
def _f(v: float) -> str:
    return f"{v:.3f}"


def _d(v: float) -> str:
    return f"{v if abs(v) >= 5e-4 else 0.0:+.3f}"  # no "-0.000"


def _origin(side: StepSide) -> str:
    return "summary stored by the live side" if side.stored else "summary rebuilt from spans"


def _engine_lines(a: StepSummary, b: StepSummary, add: Callable[[str], None]) -> None:
    """The engine's per-turn statistics of both steps side by side (nothing when neither step has them)."""
    stats = [k for k in sc.ENGINE_STATS if k in a.engine or k in b.engine]
    if not stats:
        return
    width = max(len("engine, per turn"), *(len(k) for k in stats)) + 2
    add(f"{'engine, per turn':<{width}}{'step':>8}" + "".join(f"{s:>12}" for s in STATS))
    for k in stats:
        for label, s in ((k, a), ("", b)):
            d = s.engine.get(k)
            cells = "".join(f"{engine_value(k, getattr(d, c) if d is not None else None):>12}" for c in STATS)
            add(f"{label:<{width}}{s.step:>8}{cells}")


def terminal_lines(c: Comparison, source: str = "") -> list[tuple[str, str | None]]:
    """The comparison for people: (line, rich style) pairs, the cause near the top."""
    a, b = c.a.summary, c.b.summary
    sa, sb = f"step {a.step}", f"step {b.step}"
    out: list[tuple[str, str | None]] = []

    def add(text: str = "", style: str | None = None) -> None:
        out.append((text, style))

    kind = " (validation)" if a.validate else ""
    origin = "; ".join(f"step {s.summary.step}: {_origin(s)}" for s in (c.a, c.b))
    add(f"== {sa} -> {sb}{kind}: compared from {source or 'stored spans'} ({origin})", "bold")
    ratio = f", x{c.step_b_s / c.step_a_s:.2f}" if c.step_a_s > 0 else ""
    add(
        f"step time ({c.step_time_basis}): {_f(c.step_a_s)} s -> {_f(c.step_b_s)} s "
        f"({_d(c.step_b_s - c.step_a_s)} s{ratio})"
    )
    if a.wall_s > 0 and b.wall_s > 0:
        add(
            f"  until the median sample finished: {_f(a.median_s)} -> {_f(b.median_s)} s "
            f"({_d(b.median_s - a.median_s)}); "
            f"tail (median to slowest): {_f(a.tail_s)} -> {_f(b.tail_s)} s ({_d(b.tail_s - a.tail_s)})"
        )
    counts = "; ".join(f"{v} {a.counts.get(v, 0)} -> {b.counts.get(v, 0)}" for v in ("failed", "hung", "slow"))
    add(f"  samples {a.num_samples} -> {b.num_samples}; {counts}")
    add(f"cause: {c.cause.text}", "bold red" if c.cause.clear else "yellow")
    for s in (a, b):
        if s.slowest is not None and s.slowest.cause:
            add(f"  slowest sample of step {s.step}: {s.slowest.index} / {s.slowest.rollout}: {s.slowest.cause}")
    _engine_lines(a, b, add)
    add()
    add("per phase (seconds per sample) and per tool (seconds per call)", "bold")
    width = max([len("tool_calls"), *(len(r.name) + 5 for r in c.rows)]) + 2
    add(f"{'':<{width}}{'step':>8}{'n':>8}" + "".join(f"{s:>10}" for s in STATS))
    for r in c.rows:
        label = r.name if r.kind == "phase" else f"tool {r.name}"
        add(f"{label:<{width}}{a.step:>8}{r.a.count:>8}" + "".join(f"{_f(getattr(r.a, s)):>10}" for s in STATS))
        add(f"{'':<{width}}{b.step:>8}{r.b.count:>8}" + "".join(f"{_f(getattr(r.b, s)):>10}" for s in STATS))
        add(
            f"{'':<{width}}{'delta':>8}{r.b.count - r.a.count:>+8}" + "".join(f"{_d(r.delta(s)):>10}" for s in STATS),
            "cyan",
        )
    add()
    add(f"tail mix (mean seconds per sample): {sa}: {c.tail_a.basis}; {sb}: {c.tail_b.basis}", "bold")
    add(f"{'':<{width}}{sa:>10}{sb:>10}{'delta':>10}")
    for p in sc.PHASES:
        va, vb = c.tail_a.phases.get(p, 0.0), c.tail_b.phases.get(p, 0.0)
        add(f"{p:<{width}}{_f(va):>10}{_f(vb):>10}{_d(vb - va):>10}")
    for t in sorted({*c.tail_a.tools, *c.tail_b.tools}):
        va, vb = c.tail_a.tools.get(t, 0.0), c.tail_b.tools.get(t, 0.0)
        add(f"{'  tool ' + t:<{width}}{_f(va):>10}{_f(vb):>10}{_d(vb - va):>10}")
    if c.moved:
        add()
        add("samples that moved most (matched by sample index / rollout; total = generate + tool + score s)", "bold")
        add(f"{'sample':<12}{sa:>10}{sb:>10}{'delta':>10}   {'moved most':<44}trace ({sb})")
        for m in c.moved:
            add(
                f"{f'{m.index} / {m.rollout}':<12}{_f(m.total_a):>10}{_f(m.total_b):>10}{_d(m.delta):>10}   "
                f"{m.moved_most():<44}{m.trace_b or '-'}"
            )
    if c.only_a or c.only_b:
        add(f"samples in one step only: {c.only_a} in {sa}, {c.only_b} in {sb}")
    for note in c.notes:
        add(f"note: {note}", "yellow")
    return out


def _step_pages(records: Sequence[SpanRecord], c: Comparison, html: str, source: str) -> dict[str, str]:
    """The two steps' timeline pages beside the comparison page (``cmp.html`` -> ``cmp.steps/``), where its trace
    ids link (each sample's waterfall); ``{"a": path, "b": path}`` for the steps with sample spans."""
    keys = {"a": (c.a.summary.step, c.a.summary.validate), "b": (c.b.summary.step, c.b.summary.validate)}
    spans = {k: [r for r in records if sc.step_key(r.attributes) == k] for k in set(keys.values())}
    written = write_step_pages(spans, html, source=source)
    return {side: written[key] for side, key in keys.items() if key in written}


def run_compare(
    records: Sequence[SpanRecord],
    step_a: int,
    step_b: int,
    *,
    validate: bool = False,
    top: int = 5,
    as_json: bool = False,
    html: str | None = None,
    source: str = "",
    jaeger_ui: str | None = None,
) -> int:
    """``report --compare A B``: print the comparison (or its JSON, alone on stdout), write the page; the exit
    status (1 with a one-line reason on stderr when a step is missing or the page cannot be written)."""
    from ._display import Output

    found = compare_steps(records, step_a, step_b, validate, top=top)
    if isinstance(found, str):
        say(f"report: {found}", err=True)
        return 1
    written = None
    if html:
        try:
            pages = {} if jaeger_ui_base(jaeger_ui) else _step_pages(records, found, html, source)
            written = write_compare_html(found.to_json(), html, source=source, jaeger_ui=jaeger_ui, pages=pages)
        except OSError as exc:
            say(
                f"report: cannot write --html {printable(html)}: {printable(exc.strerror or type(exc).__name__)}",
                err=True,
            )
            return 1
    if as_json:
        say_json(found.to_json(), indent=1, allow_nan=False)
        if written:
            say(f"comparison page written to {written}", err=True)
        return 0
    show = Output()
    for text, style in terminal_lines(found, source):
        show.line(text, style=style)
    if written:
        show.line(f"comparison page written to {written}")
    return 0
