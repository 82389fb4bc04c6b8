"""The step timeline as a PNG (matplotlib, the ``plot`` extra): the page's picture without the interaction."""

from __future__ import annotations

from . import semconv as sc
from ._step_view import FAILED, HUNG, SLOW, StepView

PALETTE = {sc.GENERATE: "#4C72B0", sc.TOOL_CALLS: "#DD8452", sc.COMPUTE_SCORE: "#55A868"}
ERROR = "#C44E52"
_LABELS = {sc.GENERATE: "generation", sc.TOOL_CALLS: "tool call", sc.COMPUTE_SCORE: "reward"}


def render_timeline_png(view: StepView, path: str, *, title: str = "") -> str:
    """Write every sample of ``view`` on one time axis, with per-phase histograms at the right. Returns ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("--timeline-png needs matplotlib: pip install 'otel-agentloop[plot]'") from exc
    samples = view.samples
    n = max(len(samples), 1)
    height = min(max(0.16 * n + 1.8, 6.0), 40.0)
    fig = plt.figure(figsize=(14, height))
    grid = fig.add_gridspec(len(sc.PHASES) + 1, 2, width_ratios=(3.2, 1), hspace=1.1, wspace=0.12)
    ax = fig.add_subplot(grid[:, 0])
    t0 = view.t0_ns
    for y, s in enumerate(samples):
        ax.plot([(s.start_ns - t0) / 1e9, (s.end_ns - t0) / 1e9], [y, y], color=ERROR if s.state == HUNG else "#BBBBBB",
                lw=1, ls="--" if s.state == HUNG else "-", zorder=1)
        lane_h = 0.8 / s.lanes
        for b in s.bars:
            color = ERROR if b.error else PALETTE.get(b.phase, "#8C8C8C")
            ax.barh(y - 0.4 + lane_h * (b.lane + 0.5), (b.end_ns - b.start_ns) / 1e9, left=(b.start_ns - t0) / 1e9,
                    height=lane_h * 0.92, color=color, hatch="////" if b.open else None,
                    edgecolor=ERROR if b.open else color, lw=1.2 if b.open else 0, zorder=2)
        if s.snapshot is not None:
            ax.plot([(s.snapshot.end_ns - t0) / 1e9] * 2, [y - 0.45, y + 0.45], color=ERROR, lw=1.2, ls=":", zorder=3)
        if s.state == HUNG:
            ax.text((s.end_ns - t0) / 1e9, y, "  hung", va="center", fontsize=7, color=ERROR, weight="bold")
    labels = []
    for s in samples:
        tag = {HUNG: " HUNG", SLOW: " slow", FAILED: " failed"}.get(s.state, "")
        labels.append(f"{s.index}/{s.rollout}{tag}{' *' if s.key == view.slowest else ''}")
    ax.set_yticks(range(len(samples)))
    ax.set_yticklabels(labels, fontsize=max(4.0, min(8.0, 420 / n)), family="monospace")
    for tick, s in zip(ax.get_yticklabels(), samples, strict=True):
        if s.state in (HUNG, FAILED):
            tick.set_color(ERROR)
        if s.key == view.slowest:
            tick.set_fontweight("bold")
    ax.set_ylim(len(samples) - 0.5, -0.5)
    ax.set_xlim(0, max((view.t1_ns - t0) / 1e9, 1e-3) * 1.07)
    ax.set_xlabel("seconds since the step's first sample started")
    ax.set_ylabel("sample/rollout by end time (* slowest)")
    ax.grid(axis="x", alpha=0.3)
    counts = view.counts
    ax.set_title(title or (f"step {view.step}{' (validation)' if view.validate else ''}: {len(samples)} samples, "
                           f"{counts.get(FAILED, 0)} failed, {counts.get(HUNG, 0)} hung, {counts.get(SLOW, 0)} slow"),
                 fontsize=10)
    handles = [Patch(color=c, label=_LABELS[p]) for p, c in PALETTE.items()]
    handles += [Patch(color=ERROR, label="error"), Patch(facecolor="#DD8452", edgecolor=ERROR, hatch="////",
                                                         label="open phase (hung)")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.9 / height), ncol=len(handles),
              fontsize=8, frameon=False)

    finished = [s for s in samples if s.state != HUNG]
    for row, phase in enumerate((*sc.PHASES, "total")):
        hax = fig.add_subplot(grid[row, 1])
        values = [s.total_s if phase == "total" else s.phase_s[phase] for s in finished]
        hax.hist(values, bins=24, color=PALETTE.get(phase, "#777777"))
        hax.set_title(f"{_LABELS.get(phase, 'sample total')} (s per sample)", fontsize=8)
        hax.tick_params(labelsize=7)
    fig.subplots_adjust(left=0.1, right=0.98, top=1 - 0.5 / height, bottom=1.3 / height)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
