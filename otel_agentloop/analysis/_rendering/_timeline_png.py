"""The step timeline as a PNG (matplotlib, the ``plot`` extra): the page's picture without the interaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ... import semconv as sc
from ...metrics._summary import FAILED, HUNG, OK, SLOW
from .._reading._step_view import SampleView, StepView
from ._waterfall import LITERAL_TEXT

if TYPE_CHECKING:  # matplotlib is the ``plot`` extra, imported where a PNG is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.gridspec import GridSpec

PALETTE = {sc.GENERATE: "#4C72B0", sc.TOOL_CALLS: "#DD8452", sc.COMPUTE_SCORE: "#55A868"}
ERROR = "#C44E52"
MAX_LABELLED_ROWS = 160
_LABELS = {sc.GENERATE: "generation", sc.TOOL_CALLS: "tool call", sc.COMPUTE_SCORE: "reward"}


def timeline_title(view: StepView) -> str:
    """The PNG's title: the step and its verdict counts (the same ``view.counts`` as the page)."""
    c = view.counts
    return (
        f"step {view.step}{' (validation)' if view.validate else ''}: {len(view.samples)} samples, "
        f"{c.get(FAILED, 0)} failed, {c.get(HUNG, 0)} hung, {c.get(SLOW, 0)} slow"
    )


def row_label(view: StepView, index: int) -> str:
    """The y-axis label of row ``index``: sample/rollout, its verdict unless ok, ``*`` on the slowest."""
    s = view.samples[index]
    tag = {HUNG: " HUNG", SLOW: " slow", FAILED: " failed"}.get(s.state, "")
    return f"{s.index}/{s.rollout}{tag}{' *' if s.key == view.slowest else ''}"


def render_timeline_png(view: StepView, path: str, *, title: str = "") -> str:
    """Write every sample of ``view`` on one time axis, with per-phase histograms at the right. Returns ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("--timeline-png needs matplotlib: pip install 'otel-agentloop[plot]'") from exc
    with matplotlib.rc_context(LITERAL_TEXT):  # any text from trace data is drawn as written, never as mathtext
        fig = _draw(view, title)
        try:
            fig.savefig(path, dpi=110)
        finally:
            plt.close(fig)
    return path


def _draw(view: StepView, title: str) -> Figure:
    """The timeline figure (matplotlib imported by :func:`render_timeline_png`)."""
    import matplotlib.pyplot as plt

    samples = view.samples
    n = max(len(samples), 1)
    height = min(max(0.16 * n + 1.8, 6.0), 40.0)
    fig = plt.figure(figsize=(14, height))
    grid = fig.add_gridspec(len(sc.PHASES) + 1, 2, width_ratios=(3.2, 1), hspace=1.1, wspace=0.12)
    ax = fig.add_subplot(grid[:, 0])
    _draw_samples(ax, view, n)
    _label_rows(ax, view, n, title)
    _legend(ax, height)
    _histograms(fig, grid, samples)
    fig.subplots_adjust(left=0.1, right=0.98, top=1 - 0.5 / height, bottom=1.3 / height)
    return fig


def _draw_samples(ax: Axes, view: StepView, n: int) -> None:
    """Each sample's line, its phase bars (one collection per colour), its snapshot mark, ``hung`` at its end."""
    samples = view.samples
    from matplotlib.collections import LineCollection, PolyCollection

    t0 = view.t0_ns
    lines, line_colors = [], []
    groups: dict[tuple[str, bool], tuple[list[float], list[float], list[float], list[float]]] = {}
    snaps: list[tuple[tuple[float, float], tuple[float, float]]] = []
    for y, s in enumerate(samples):
        lines.append([((s.start_ns - t0) / 1e9, y), ((s.end_ns - t0) / 1e9, y)])
        line_colors.append(ERROR if s.state == HUNG else "#BBBBBB")
        lane_h = 0.8 / s.lanes
        for b in s.bars:
            ys, widths, lefts, heights = groups.setdefault(
                (ERROR if b.error else PALETTE.get(b.phase, "#8C8C8C"), b.open), ([], [], [], [])
            )
            ys.append(y - 0.4 + lane_h * (b.lane + 0.5))
            widths.append((b.end_ns - b.start_ns) / 1e9)
            lefts.append((b.start_ns - t0) / 1e9)
            heights.append(lane_h * 0.92)
        if s.snapshot is not None:
            x = (s.snapshot.end_ns - t0) / 1e9
            snaps.append(((x, y - 0.45), (x, y + 0.45)))
        if s.state == HUNG:
            ax.text((s.end_ns - t0) / 1e9, y, "  hung", va="center", fontsize=7, color=ERROR, weight="bold")
    ax.add_collection(LineCollection(lines, colors=line_colors, linewidths=max(0.3, min(1.0, 300 / n)), zorder=1))
    for (color, is_open), (ys, widths, lefts, heights) in groups.items():  # one collection per colour
        ya, wa, xa, ha = (np.asarray(v, dtype=float) for v in (ys, widths, lefts, heights))
        verts = np.stack(
            [
                np.stack([xa, ya - ha / 2], 1),
                np.stack([xa + wa, ya - ha / 2], 1),
                np.stack([xa + wa, ya + ha / 2], 1),
                np.stack([xa, ya + ha / 2], 1),
            ],
            1,
        )
        ax.add_collection(
            PolyCollection(
                verts,  # type: ignore[arg-type]  # an (N, 4, 2) array, which matplotlib takes; its stubs say Sequence
                facecolors=color,
                hatch="////" if is_open else None,
                edgecolors=ERROR if is_open else "none",
                linewidths=1.2 if is_open else 0,
                zorder=2,
            )
        )
    if snaps:
        ax.add_collection(LineCollection(snaps, colors=ERROR, linewidths=1.2, linestyles=":", zorder=3))


def _label_rows(ax: Axes, view: StepView, n: int, title: str) -> None:
    """The rows' labels (marked samples in red or bold), the axes' limits, labels and title."""
    samples = view.samples
    t0 = view.t0_ns
    # one label per row while they are legible; past that only the marked samples are named
    shown = [(y, s) for y, s in enumerate(samples) if n <= MAX_LABELLED_ROWS or s.state != OK or s.key == view.slowest][
        :MAX_LABELLED_ROWS
    ]
    labels = [row_label(view, y) for y, _ in shown]
    ax.set_yticks([y for y, _ in shown])
    ax.set_yticklabels(labels, fontsize=max(4.0, min(8.0, 420 / min(n, MAX_LABELLED_ROWS))), family="monospace")
    for tick, (_, s) in zip(ax.get_yticklabels(), shown, strict=True):
        if s.state in (HUNG, FAILED):
            tick.set_color(ERROR)
        if s.key == view.slowest:
            tick.set_fontweight("bold")
    ax.set_ylim(len(samples) - 0.5, -0.5)
    ax.set_xlim(0, max((view.t1_ns - t0) / 1e9, 1e-3) * 1.07)
    ax.set_xlabel("seconds since the step's first sample started")
    ax.set_ylabel("sample/rollout: hung, then last-ending first (* slowest)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(title or timeline_title(view), fontsize=10)


def _legend(ax: Axes, height: float) -> None:
    from matplotlib.patches import Patch

    handles = [Patch(color=c, label=_LABELS[p]) for p, c in PALETTE.items()]
    handles += [
        Patch(color=ERROR, label="error"),
        Patch(facecolor="#DD8452", edgecolor=ERROR, hatch="////", label="open phase (hung)"),
    ]
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.9 / height),
        ncol=len(handles),
        fontsize=8,
        frameon=False,
    )


def _histograms(fig: Figure, grid: GridSpec, samples: Sequence[SampleView]) -> None:
    """Per phase and in total, the finished samples' seconds as histograms at the right."""
    finished = [s for s in samples if s.state != HUNG]
    for row, phase in enumerate((*sc.PHASES, "total")):
        hax = fig.add_subplot(grid[row, 1])
        values = [s.total_s if phase == "total" else s.phase_s[phase] for s in finished]
        hax.hist(values, bins=24, color=PALETTE.get(phase, "#777777"))
        hax.set_title(f"{_LABELS.get(phase, 'sample total')} (s per sample)", fontsize=8)
        hax.tick_params(labelsize=7)
