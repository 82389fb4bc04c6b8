"""``report``'s run flags: ``--runs``, ``--run-id``, ``--run``, ``--steps``, ``--step-pages``."""

from __future__ import annotations

import argparse

from ..analysis._reading._run_load import FULL_READ_BYTES
from ._run import DEFAULT_STEP_PAGES


def _step_range(text: str) -> tuple[int | None, int | None]:
    """An argparse type: ``A:B`` (inclusive), ``A:``, ``:B`` or ``N``."""
    lo, sep, hi = text.partition(":")
    try:
        first = int(lo) if lo.strip() else None
        last = (int(hi) if hi.strip() else None) if sep else first
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a step range (A:B, A:, :B or N)") from None
    if first is not None and last is not None and last < first:
        raise argparse.ArgumentTypeError(f"{text!r}: the range ends before it starts")
    return first, last


def _pages(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer (>= 0)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is out of range (an integer >= 0)")
    return value


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """``report``'s run flags: ``--runs``, ``--run-id``, ``--run``, ``--steps``, ``--step-pages``."""
    parser.add_argument(
        "--runs", action="store_true", help="list the runs in the source (id, attempts, steps, samples, times)"
    )
    parser.add_argument(
        "--run-id", metavar="ID", help="read this run (default: the latest, the one that started last; see --runs)"
    )
    parser.add_argument(
        "--run",
        action="store_true",
        help="the whole run, one line per step; with --html FILE the run page (each step linked to its timeline)",
    )
    parser.add_argument("--steps", metavar="A:B", type=_step_range, help="with --run: only steps A to B (inclusive)")
    parser.add_argument(
        "--step-pages",
        metavar="N",
        type=_pages,
        help="with --run --html: timeline pages for at most N steps (all of the range if it has at most N, else "
        f"the N with the longest rollout wall time; from Jaeger each page's step is fetched); default "
        f"{DEFAULT_STEP_PAGES}, 0 for a file over {FULL_READ_BYTES >> 20} MiB (read for its step summaries only)",
    )
