"""Draw one sample's spans as a waterfall: text for the terminal, and (optionally) a PNG."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ... import semconv as sc
from ...metrics._records import SpanRecord
from .._reading._engine import engine_parts
from .._reading._step_view import order_spans
from .._reading._text import printable
from ._engine_text import engine_note

if TYPE_CHECKING:  # matplotlib is the ``plot`` extra, imported where a PNG is drawn
    from matplotlib.typing import RcKeyType

_COLORS = {sc.GENERATE: "\033[34m", sc.TOOL_CALLS: "\033[33m", sc.COMPUTE_SCORE: "\033[32m"}
_RESET = "\033[0m"
_ERROR = "\033[31m"
LITERAL_TEXT: dict[RcKeyType, bool] = {"text.parse_math": False, "text.usetex": False}
"""matplotlib settings under which text from trace data is drawn literally: ``$x$`` is not mathtext."""


def _label(span: SpanRecord) -> str:
    return printable(span.name)


ENGINE_GLYPHS = {"queue": "░", "prefill": "▒", "decode": "▓"}
"""How the engine's part of a turn is drawn inside its bar (the rest of the turn stays ``█``)."""
ENGINE_LEGEND = "inside a turn: ░ engine queue  ▒ prefill  ▓ decode  █ the rest of the turn"

WaterfallRow = tuple[str, str, str | None, str]
"""(text before the bar, the bar, its tint: a phase name, ``"error"`` or ``None``, text after the bar)."""


def waterfall_rows(spans: Sequence[SpanRecord], *, width: int = 60) -> tuple[str, list[WaterfallRow]]:
    """The waterfall's header line and rows, uncoloured (``spans`` must not be empty): one row per span in
    tree order, its bar placed on the sample's time axis, then its duration (and ERROR with its type). A turn with
    the engine's timing has its queue, prefill and decode drawn inside its bar (:data:`ENGINE_GLYPHS`, legend
    under the header) and said after it."""
    rows = order_spans(spans)
    t0 = min(s.start_ns for s in spans)
    t1 = max(s.end_ns for s in spans)
    total = max(t1 - t0, 1)
    label_width = min(max(len("  " * d + _label(s)) for d, s in rows), 40)
    head = f"{'span':<{label_width}}  0{'':{width - 2}}{total / 1e9:.3f}s"
    out: list[WaterfallRow] = []
    engine = False
    for depth, s in rows:
        label = ("  " * depth + _label(s))[:label_width]
        a = int((s.start_ns - t0) / total * width)
        b = max(int((s.end_ns - t0) / total * width), a + 1)
        cells = list(" " * a + "█" * (b - a) + " " * (width - b))
        parts = engine_parts(s.start_ns, s.end_ns, s.attributes)
        for name, start, end in parts:
            x0 = max(round((start - t0) / total * width), a)
            x1 = min(round((end - t0) / total * width), b)
            if x1 > x0:  # a part shorter than half a cell is said after the bar, not drawn
                cells[x0:x1] = ENGINE_GLYPHS[name] * (x1 - x0)
        engine = engine or bool(parts)
        phase = s.attributes.get(sc.RL_PHASE)
        mark = " ERROR " + printable(s.attributes.get(sc.ERROR_TYPE, "")) if s.error else ""
        note = "  " + engine_note(s.attributes) if parts else ""
        tint = "error" if s.error else (str(phase) if phase is not None else None)
        out.append((f"{label:<{label_width}} |", "".join(cells), tint, f"| {s.duration_s:7.3f}s{mark}{note}"))
    return (f"{head}\n{ENGINE_LEGEND}" if engine else head), out


def render_text(spans: Sequence[SpanRecord], *, width: int = 60, color: bool | None = None, title: str = "") -> str:
    """A waterfall: one line per span, a bar placed on the sample's time axis, and its duration.

    ``color`` (ANSI) defaults to :func:`~._terminal.color_enabled` for stdout (``NO_COLOR``, ``FORCE_COLOR``).
    """
    if not spans:
        return "(no spans)"
    if color is None:
        from ._terminal import color_enabled

        color = color_enabled(sys.stdout)
    head, rows = waterfall_rows(spans, width=width)
    lines = [title] if title else []
    lines.append(head)
    for prefix, bar, tint, suffix in rows:
        code = _ERROR if tint == "error" else _COLORS.get(tint or "", "")
        lines.append(f"{prefix}{code}{bar}{_RESET}{suffix}" if color and code else f"{prefix}{bar}{suffix}")
    return "\n".join(lines)


MAX_PNG_ROWS = 400
_PNG_ENGINE = {"queue": "#C9D6EE", "prefill": "#8FA8D6", "decode": "#1F3A68"}


def render_png(spans: Sequence[SpanRecord], path: str, *, title: str = "") -> str:
    """Write the waterfall as a PNG (needs the ``plot`` extra: matplotlib): its first :data:`MAX_PNG_ROWS` spans
    in tree order, all text drawn as written, a turn's engine queue, prefill and decode as thinner bars inside
    it (pale to dark). Returns ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("--png needs matplotlib: pip install 'otel-agentloop[plot]'") from exc
    with matplotlib.rc_context(LITERAL_TEXT):  # span names are drawn as written, never as mathtext or TeX
        rows = order_spans(spans)
        if len(rows) > MAX_PNG_ROWS:  # past this the image is taller than matplotlib draws (2**16 pixels)
            title = f"{title or 'sample waterfall'} (first {MAX_PNG_ROWS} of {len(rows)} spans)"
            rows = rows[:MAX_PNG_ROWS]
        t0 = min(s.start_ns for s in spans)
        palette = {sc.GENERATE: "#4C72B0", sc.TOOL_CALLS: "#DD8452", sc.COMPUTE_SCORE: "#55A868"}
        fig, ax = plt.subplots(figsize=(11, 0.42 * len(rows) + 1.3))
        for y, (_depth, s) in enumerate(rows):
            start = (s.start_ns - t0) / 1e9
            color = "#C44E52" if s.error else palette.get(str(s.attributes.get(sc.RL_PHASE)), "#8C8C8C")
            ax.barh(y, s.duration_s, left=start, color=color, height=0.6)
            for name, a, b in engine_parts(s.start_ns, s.end_ns, s.attributes):  # the engine's part, inside
                ax.barh(y, (b - a) / 1e9, left=(a - t0) / 1e9, color=_PNG_ENGINE[name], height=0.34)
            ax.text(start + s.duration_s, y, f" {s.duration_s * 1000:.0f} ms", va="center", fontsize=8)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(["   " * d + printable(s.name) for d, s in rows], fontsize=9, family="monospace")
        ax.invert_yaxis()
        ax.set_xlabel("seconds since the sample started")
        ax.set_title(printable(title or "sample waterfall", max_chars=None), fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        try:
            fig.savefig(path, dpi=110)
        finally:
            plt.close(fig)
    return path
