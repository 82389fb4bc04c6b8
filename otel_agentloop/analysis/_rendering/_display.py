"""Printing a step's metrics, and the samples still running, the way a person reads them.

Two renderers of the same cells: plain text (always available), and ``rich`` tables, colour and a live view
when the ``cli`` extra is installed. rich is imported lazily, here only; the library core never imports it.
Colour follows no-color.org: off when ``NO_COLOR`` is set (non-empty) or the stream is not a terminal;
``FORCE_COLOR`` (non-empty) turns it on for a pipe. ``--json`` output never goes through here.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TextIO

from ... import semconv as sc
from ...metrics._summary import OK
from .._reading._text import printable
from ._engine_text import ENGINE_HEAD, engine_cells, engine_state, engine_table
from ._terminal import color_enabled, isatty

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table

    from ...core._inflight import InflightSample
    from ...metrics._records import SpanRecord

_PHASES = ("generate_sequences", "tool_calls", "compute_score")
_STAT_COLS = ("min", "mean", "p50", "p90", "p99", "max")
_SLOWEST_HEAD = ("slowest samples", "total s", "gen s", "tool s", "score s", "trace id")
# rich styles; the plain renderer prints the same text without them
_PHASE_STYLE = {sc.GENERATE: "blue", sc.TOOL_CALLS: "yellow", sc.COMPUTE_SCORE: "green"}
_ERROR_STYLE = "bold red"
_TITLE_STYLE = "bold"


def rich_console(stream: TextIO) -> Console | None:
    """A rich ``Console`` writing to ``stream`` (colour per :func:`color_enabled`), or ``None`` without rich.

    It is a terminal (live redraws) exactly when ``stream`` is one; no markup, emoji or highlighting is
    applied, so text prints as given.
    """
    try:
        from rich.console import Console
    except ImportError:
        return None
    tty = isatty(stream)
    color = color_enabled(stream)
    return Console(
        file=stream,
        force_terminal=tty,
        color_system=("auto" if tty else "standard") if color else None,
        no_color=not color,
        markup=False,
        emoji=False,
        highlight=False,
    )


def metrics_cells(metrics: Mapping[str, float]) -> list[tuple[str, ...]]:
    """The rows of the metrics grid, formatted: phase x min/mean/p50/p90/p99/max (seconds), then
    num_preempted (min, mean, max) when known. ``-`` where a value is missing."""
    p = sc.METRIC_PREFIX
    rows: list[tuple[str, ...]] = []
    for phase in _PHASES:
        cells = [metrics.get(f"{p}/{phase}/{c}") for c in _STAT_COLS]
        rows.append((phase, *(f"{c:.3f}" if c is not None else "-" for c in cells)))
    pre = [metrics.get(f"{p}/num_preempted/{c}") for c in ("min", "mean", "max")]
    if pre[0] is not None and pre[1] is not None and pre[2] is not None:
        if pre[2] < 0:  # verl's -1 for every sample: no engine reported a count
            rows.append(("num_preempted", "n/a", "n/a", "", "", "", "n/a"))
        else:
            rows.append(("num_preempted", f"{pre[0]:.0f}", f"{pre[1]:.2f}", "", "", "", f"{pre[2]:.0f}"))
    return rows


NOT_REPORTED = "no preemption count was recorded for the sample (verl's -1: not available)"


def preempted_note(metrics: Mapping[str, float]) -> str | None:
    """The line that explains verl's ``num_preempted`` -1 where the grid shows it (or ``n/a`` for it): verl sets
    -1 when a sample's first generation turn got no count from the engine (its ``num_preempted`` was None, as
    from an engine or server that does not report it) or the sample had no generation turn; the values are
    verl's, unchanged, so a mean over some such samples counts each as -1."""
    low, high = (metrics.get(f"{sc.METRIC_PREFIX}/num_preempted/{c}") for c in ("min", "max"))
    if low is None or high is None or low >= 0:
        return None
    if high < 0:
        return f"num_preempted n/a: {NOT_REPORTED}, for every sample"
    return f"num_preempted -1: {NOT_REPORTED}; verl's min and mean include those -1s"


def metrics_footer(metrics: Mapping[str, float]) -> list[str]:
    """The lines under the grid: the slowest sample (when known), then the sample count."""
    p = sc.METRIC_PREFIX
    lines = []
    if f"{p}/slowest/sample_index" in metrics:
        s = f"{p}/slowest/"
        parts = [f"sample {metrics[s + 'sample_index']:.0f}", f"rollout {metrics.get(s + 'rollout_n', -1):.0f}"]
        parts += [f"{k} {metrics[s + k]:.3f}s" for k in _PHASES]
        npre = metrics[s + "num_preempted"]
        parts.append(f"num_preempted {npre:.0f}" if npre >= 0 else "num_preempted n/a")
        for k in ("prompt_length", "response_length"):
            if s + k in metrics:
                parts.append(f"{k} {metrics[s + k]:.0f}")
        lines.append("slowest: " + ", ".join(parts))
    note = preempted_note(metrics)
    if note is not None:
        lines.append(note)
    lines.append(f"samples: {metrics.get(p + '/num_samples', 0):.0f}")
    return lines


def metrics_table(metrics: Mapping[str, float], title: str = "") -> str:
    """verl's per-phase keys as a grid (phase x min/mean/p50/p90/p99/max, seconds), the engine's per-turn grid
    when some turn carried the engine's timing (:func:`~._engine_text.engine_table`), then the slowest sample."""
    lines = [title] if title else []
    lines.append(f"{'phase (s)':<20}" + "".join(f"{c:>9}" for c in _STAT_COLS))
    lines += [f"{row[0]:<20}" + "".join(f"{c:>9}" for c in row[1:]) for row in metrics_cells(metrics)]
    engine = engine_table(metrics)
    if engine:
        lines += ["", engine, ""]
    return "\n".join(lines + metrics_footer(metrics))


def _flag(row: Mapping[str, object]) -> str:
    """A slowest row's verdict when not ok (``FAILED``, ``SLOW``; from ``StepReport.slowest``), else ``""``."""
    verdict = row.get("verdict")
    if verdict is None:
        return "FAILED" if row["error"] else ""
    return "" if verdict == OK else str(verdict).upper()


def slowest_cells(rows: Sequence[Mapping[str, object]]) -> list[tuple[str, ...]]:
    """``PhaseTable.slowest`` rows formatted: sample / rollout, total, gen, tool, score, trace id, the sample's
    verdict when it is not ok (``FAILED``, ``SLOW``: the one verdict, ``metrics._summary.verdict``), and its
    cause in words (``metrics._summary.cause``; ``""`` when the row has none)."""
    out = []
    for row in rows:
        secs = (row["total"], row[sc.GENERATE], row[sc.TOOL_CALLS], row[sc.COMPUTE_SCORE])
        out.append(
            (
                f"{row['sample_index']} / {row['rollout_n']}",
                *(f"{v:.3f}" if isinstance(v, (int, float)) else "-" for v in secs),
                printable(row["trace_id"]),
                _flag(row),
                printable(row.get("cause", "")),
            )
        )
    return out


def slowest_table(rows: Sequence[Mapping[str, object]]) -> str:
    """The slowest samples as plain text, one line each."""
    head = _SLOWEST_HEAD
    lines = [f"{head[0]:<16}" + "".join(f"{h:>9}" for h in head[1:5]) + f"  {head[5]}"]
    for row, cells in zip(rows, slowest_cells(rows), strict=True):
        lines.append(
            f"{row['sample_index']:>6} / {row['rollout_n']!s:<6}"
            + "".join(f"{c:>9}" for c in cells[1:5])
            + f"  {cells[5]}{'  ' + cells[6] if cells[6] else ''}{'  ' + cells[7] if cells[7] else ''}"
        )
    return "\n".join(lines)


def inflight_lines(samples: Sequence[InflightSample], top: int = 3, others: int = 0) -> list[str]:
    """The live view of running samples (``InflightSample``\\ s, any order): counts by phase (tools by name),
    then the ``top`` oldest, overdue ones flagged. ``others``: samples of other steps still running (not in
    ``samples``), said apart so the step's counts add up."""
    by_phase: dict[str, int] = {}
    tools: dict[str, int] = {}
    for s in samples:
        phase = printable(s.phase)
        by_phase[phase] = by_phase.get(phase, 0) + 1
        if s.tool:
            tool = printable(s.tool)
            tools[tool] = tools.get(tool, 0) + 1
    parts = []
    for phase in (*_PHASES, "other"):
        n = by_phase.get(phase, 0)
        if phase == sc.TOOL_CALLS and tools:
            parts.append(f"{phase} {n} ({', '.join(f'{t} {c}' for t, c in sorted(tools.items()))})")
        elif n or phase != "other":
            parts.append(f"{phase} {n}")
    lines = [
        f"in flight: {len(samples):>4}  " + " | ".join(parts) + (f"  (+{others} of other steps)" if others else "")
    ]
    for s in sorted(samples, key=lambda s: -s.sample_age_s)[:top]:
        where = f"{printable(s.phase)}{' ' + printable(s.tool) if s.tool else ''} {s.phase_age_s:.1f}s"
        lines.append(
            f"  oldest: {printable(s.label()):<28} {where:<32} sample {s.sample_age_s:6.1f}s  trace {s.trace_id}"
            f"{'  OVERDUE' if s.overdue else ''}"
        )
    return lines


def live_view(label: str, done: int, total: int, elapsed_s: float, lines: Sequence[str]) -> RenderableType:
    """The rich live view: a progress bar line, then the in-flight ``lines`` (overdue flagged). Needs rich."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    bar = Table.grid(padding=(0, 1))
    bar.add_row(
        Text(label, style=_TITLE_STYLE),
        ProgressBar(total=total, completed=done, width=30, complete_style="cyan", finished_style="green"),
        f"{done}/{total}",
        f"{elapsed_s:5.1f}s",
    )
    texts = []
    for line in lines:
        text = Text(line)
        text.highlight_words(["OVERDUE"], _ERROR_STYLE)
        if line.startswith("in flight:"):
            text.stylize(_TITLE_STYLE, 0, len("in flight:"))
        texts.append(text)
    return Group(bar, *texts)


class Output:
    """Lines and tables for people on one stream (default: stdout at construction): through rich when it is
    installed, else plain text. Both print the same cells in the same order; only borders and colour differ."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.color = color_enabled(self.stream)
        self.console = rich_console(self.stream)

    def line(self, text: str = "", style: str | None = None) -> None:
        """``text`` (never wrapped; its lines' control characters escaped: :func:`~.._reading._text.printable`),
        coloured with the rich ``style`` when colour is on."""
        text = "\n".join(printable(part, max_chars=None) for part in text.split("\n"))
        if self.console is None:
            print(text, file=self.stream)
            return
        from rich.text import Text

        self.console.print(Text(text, style=style or ""), soft_wrap=True)

    def metrics(self, metrics: Mapping[str, float], title: str = "") -> None:
        """:func:`metrics_table`: the title, the phase grid, the slowest sample and the sample count."""
        if self.console is None:
            print(metrics_table(metrics, title), file=self.stream)
            return
        if title:
            self.line(title, _TITLE_STYLE)
        table = self._table(("phase (s)", *_STAT_COLS), metrics_cells(metrics), flag=None)
        self._print_table(table)
        engine = engine_cells(metrics)
        if engine:
            self._print_table(self._table(ENGINE_HEAD, engine, flag=None))
        if state := engine_state(metrics):
            self.line(state)
        for text in metrics_footer(metrics):
            self.line(text)

    def slowest(self, rows: Sequence[Mapping[str, object]]) -> None:
        """:func:`slowest_table`: the slowest samples, failed and slow ones flagged (their rows red)."""
        if self.console is None:
            print(slowest_table(rows), file=self.stream)
            return
        cells = slowest_cells(rows)
        width = 8 if any(row[7] for row in cells) else 7  # a cause column only when some row has one
        head = (*_SLOWEST_HEAD, "", "cause")[:width]
        if not any(row[6] for row in cells):  # no error column to pad
            keep = [i for i in range(width) if i != 6]
            head = tuple(head[i] for i in keep)
            cells = [tuple(row[i] for i in keep) for row in cells]
            table = self._table(head, cells, flag=None, left=(0, 5, 6))
        else:
            table = self._table(head, [row[:width] for row in cells], flag=6, left=(0, 5, 6, 7))
        self._print_table(table)

    def waterfall(self, spans: Sequence[SpanRecord], title: str = "") -> None:
        """A sample's waterfall (:func:`~._waterfall.render_text`), bars coloured by phase, errors red."""
        from ._waterfall import render_text, waterfall_rows

        if self.console is None:
            print(render_text(spans, color=self.color, title=title), file=self.stream)
            return
        if not spans:
            self.line("(no spans)")
            return
        from rich.text import Text

        head, rows = waterfall_rows(spans)
        if title:
            self.line(title)
        self.line(head)
        for prefix, bar, tint, suffix in rows:
            style = _ERROR_STYLE if tint == "error" else _PHASE_STYLE.get(tint or "")
            self.console.print(Text.assemble(prefix, (bar, style or ""), suffix), soft_wrap=True)

    def _table(
        self, header: Sequence[str], rows: Sequence[Sequence[str]], flag: int | None, left: Sequence[int] = (0,)
    ) -> Table:
        """A borderless rich table: a rule under the header, column 0 (and ``left``) left-aligned, the rest
        right-aligned; a row whose ``flag`` cell is non-empty (an error) is red."""
        from rich import box
        from rich.table import Table

        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style=_TITLE_STYLE)
        for i, name in enumerate(header):
            table.add_column(
                name, justify="left" if i in left else "right", no_wrap=True, style="cyan" if i == 0 else None
            )
        for row in rows:
            table.add_row(*row, style=_ERROR_STYLE if flag is not None and row[flag] else None)
        return table

    def _print_table(self, table: Table) -> None:
        """Print ``table`` at its natural width even where that is wider than the console (a pipe is 80)."""
        from rich.measure import Measurement

        console = self.console
        assert console is not None
        need = Measurement.get(console, console.options.update_width(1 << 16), table).maximum
        if need > console.width:
            console.width = need
        console.print(table)


def info_stream(args: object) -> TextIO:
    """Where lines for people go: stderr under ``--json``, so stdout holds only the JSON document."""
    return sys.stderr if getattr(args, "json", False) else sys.stdout
