"""``report --compare A B`` for people: the comparison as terminal lines (:func:`terminal_lines`)."""

from __future__ import annotations

from collections.abc import Callable

from ... import semconv as sc
from ...metrics._summary import StepSummary
from .._reading._compare import STATS, StepSide
from .._reading._comparison import Comparison
from ._engine_text import engine_value


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


def _table_lines(c: Comparison, add: Callable[..., None], width: int) -> None:
    """The side-by-side table: per phase (seconds per sample) and per tool (seconds per call), with deltas."""
    a, b = c.a.summary, c.b.summary
    add()
    add("per phase (seconds per sample) and per tool (seconds per call)", "bold")
    add(f"{'':<{width}}{'step':>8}{'n':>8}" + "".join(f"{s:>10}" for s in STATS))
    for r in c.rows:
        label = r.name if r.kind == "phase" else f"tool {r.name}"
        add(f"{label:<{width}}{a.step:>8}{r.a.count:>8}" + "".join(f"{_f(getattr(r.a, s)):>10}" for s in STATS))
        add(f"{'':<{width}}{b.step:>8}{r.b.count:>8}" + "".join(f"{_f(getattr(r.b, s)):>10}" for s in STATS))
        add(
            f"{'':<{width}}{'delta':>8}{r.b.count - r.a.count:>+8}" + "".join(f"{_d(r.delta(s)):>10}" for s in STATS),
            "cyan",
        )


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
    width = max([len("tool_calls"), *(len(r.name) + 5 for r in c.rows)]) + 2
    _table_lines(c, add, width)
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
