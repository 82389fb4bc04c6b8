"""``report --compare A B``'s result: step A against step B (:class:`Comparison`, made by :func:`compare` from the
two steps' :class:`~._compare.StepSide`), and its plain JSON (what ``--json`` prints and the page draws)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ... import semconv as sc
from ...metrics._records import SpanRecord
from ...metrics._summary import Distribution
from ._compare import STATS, Cause, StepSide, TailMix, explain, load_step
from ._report import steps_in, stored_summaries
from ._runs import steps_text


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

    def to_json(self) -> dict[str, object]:
        """Plain JSON-able data (``report --compare --json`` prints it; the page draws it)."""
        return {
            "a": _side_json(self.a, self.step_a_s, self.tail_a),
            "b": _side_json(self.b, self.step_b_s, self.tail_b),
            "step_time": {
                "basis": self.step_time_basis,
                "a": self.step_a_s,
                "b": self.step_b_s,
                "delta": self.step_b_s - self.step_a_s,
            },
            "cause": _cause_json(self.cause),
            "rows": [_row_json(r) for r in self.rows],
            "moved": [_moved_json(m) for m in self.moved],
            "only_in_a": self.only_a,
            "only_in_b": self.only_b,
            "notes": list(self.notes),
        }


# -- its JSON -----------------------------------------------------------------------------------------------
def _dist_json(d: Distribution) -> dict[str, float]:
    return {"count": d.count, **{s: getattr(d, s) for s in STATS}, "mean": d.mean}


def _side_json(s: StepSide, step_s: float, tail: TailMix) -> dict[str, object]:
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
        **({"engine": {k: _dist_json(d) for k, d in m.engine.items()}} if m.engine else {}),
        "tail_mix": {
            "basis": tail.basis,
            "samples": tail.samples,
            "phases": dict(tail.phases),
            "tools": dict(tail.tools),
        },
    }


def _cause_json(c: Cause) -> dict[str, object]:
    return {
        "phase": c.phase,
        "tool": c.tool,
        "phase_share": c.phase_share,
        "tool_share": c.tool_share,
        "step_delta_s": c.step_delta_s,
        "noise_threshold_s": c.threshold_s,
        "tail_phase_deltas": dict(c.phase_deltas),
        "tail_tool_deltas": dict(c.tool_deltas),
        "text": c.text,
    }


def _row_json(r: Row) -> dict[str, object]:
    return {
        "kind": r.kind,
        "name": r.name,
        "a": _dist_json(r.a),
        "b": _dist_json(r.b),
        "delta": {"count": r.b.count - r.a.count, **{s: r.delta(s) for s in STATS}},
    }


def _moved_json(m: MovedSample) -> dict[str, object]:
    return {
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


# -- making it ----------------------------------------------------------------------------------------------


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
