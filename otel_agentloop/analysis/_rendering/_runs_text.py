"""Runs and a run's steps as terminal tables: ``report --runs`` (:func:`runs_table`) and ``report --run``
(:func:`run_steps_rows`), laid out by :func:`format_table`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone

from .._reading._runs import MAX_ID_CHARS, Run, RunSteps
from .._reading._text import printable


def _time(ns: int) -> str:
    if not ns:
        return "-"
    return datetime.fromtimestamp(ns / 1e9, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def runs_table(runs: Sequence[Run]) -> list[list[str]]:
    """The ``report --runs`` rows (a header first): the latest run last, marked ``*``."""
    rows = [["run", "attempts", "steps", "val", "samples", "first (UTC)", "last (UTC)", "service"]]
    latest = max(runs, key=lambda r: (r.first_ns, r.key)) if runs else None
    for run in runs:
        steps = run.steps()
        train = [s for s, v in steps if not v]
        val = sum(v for _, v in steps)
        span = f"{min(train)}..{max(train)} ({len(train)})" if train else "0"
        rows.append(
            [
                ("* " if run is latest else "  ") + printable(run.label, max_chars=MAX_ID_CHARS),
                ",".join(a or "-" for a in run.attempts),
                span,
                str(val),
                str(run.samples()),
                _time(run.first_ns),
                _time(run.last_ns),
                printable(run.service, max_chars=MAX_ID_CHARS),
            ]
        )
    return rows


def format_table(rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns, two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))] if rows else []
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def run_steps_rows(steps: RunSteps) -> list[list[str]]:
    rows = [
        ["step", "samples", "wall s", "to median", "tail", "slowest", "gen/tool/score s", "failed/hung/slow", "trace"]
    ]
    for (step, validate), s in steps.summaries.items():
        slow = s.slowest
        rows.append(
            [
                f"{step}{' val' if validate else ''}{' *' if (step, validate) in steps.rebuilt else ''}",
                str(s.num_samples),
                f"{s.wall_s:.2f}",
                f"{s.median_s:.2f}",
                f"{s.tail_s:.2f}",
                f"{slow.index}/{slow.rollout}" if slow else "-",
                f"{slow.generate_s:.2f}/{slow.tool_s:.2f}/{slow.score_s:.2f}" if slow else "-",
                f"{s.counts.get('failed', 0)}/{s.counts.get('hung', 0)}/{s.counts.get('slow', 0)}",
                (slow.trace_id or "-") if slow else "-",
            ]
        )
    return rows
