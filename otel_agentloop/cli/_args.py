"""The CLI's argparse pieces: a parser with one-line errors, help that shows defaults, and the argument types
that check a value where it enters (numbers in range, durations, writable output paths, a trace path)."""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable
from typing import NoReturn

from ..export._rolled import INDEX, is_one_file

MAX_SINCE_MINUTES = 5e6
"""The longest ``report --since`` (about 9.5 years)."""
_UNITS = {"s": 1 / 60, "m": 1.0, "h": 60.0, "d": 1440.0, "w": 10080.0}
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([smhdw]?)\s*")


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error: ``otel-agentloop simulate: error: argument --time-scale: ...``, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class ShowDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each option's default (``(default: 3)``); an option without one (``None``, a flag) says in
    its own help what happens without it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or action.default is False or "default" in text:
            return text
        return super()._get_help_string(action) or text


def number(low: float, high: float, *, above: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite float in [low, high] (``(low, high]`` with ``above``)."""
    span = f"{'>' if above else '>='} {low:g} and <= {high:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number (a finite number {span})") from None
        if not math.isfinite(value) or value < low or (above and value == low) or value > high:
            raise argparse.ArgumentTypeError(f"{text!r} is out of range (a finite number {span})")
        return value

    return parse


def since_minutes(text: str) -> float:
    """An argparse type: a duration back from now, ``90s``, ``30m``, ``2h``, ``7d``, ``1w`` or minutes (``90``)."""
    match = _DURATION.fullmatch(text)
    minutes = float(match.group(1)) * _UNITS[match.group(2) or "m"] if match else -1.0
    if not 0 < minutes <= MAX_SINCE_MINUTES:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration (e.g. 90s, 30m, 2h, 7d, 1w, or minutes; > 0 and <= {MAX_SINCE_MINUTES:g} min)"
        )
    return minutes


def output_file(text: str) -> str:
    """An argparse type: a file path that can be written now (its folder exists and is writable, and the path is
    not a folder), checked up front so that a long run does not fail at its end."""
    folder = os.path.dirname(text) or "."
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{text!r}: no such folder {folder!r}")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder (give a file path)")
    if not os.access(folder, os.W_OK) or (os.path.exists(text) and not os.access(text, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text!r} is not writable")
    return text


def trace_path(text: str) -> str:
    """An argparse type: where ``simulate --file`` writes, checked up front: one file (``.jsonl``/``.json``), else
    a trace folder: a writable one that is empty or already one (its ``index.jsonl``), or a new one in a writable
    folder."""
    if is_one_file(text):
        return output_file(text)
    if os.path.isdir(text):
        try:
            entries = os.listdir(text)
        except OSError:
            raise argparse.ArgumentTypeError(f"{text!r} is not readable") from None
        if entries and not os.path.exists(os.path.join(text, INDEX)):
            raise argparse.ArgumentTypeError(
                f"{text!r} is a folder that is neither empty nor a trace folder (no index.jsonl): give a new or "
                "empty folder, or a path ending .jsonl for one file"
            )
        if not os.access(text, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"{text!r} is not writable")
        return text
    if os.path.exists(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a file (give a folder, or a path ending .jsonl for one file)")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: its folder {folder!r} is missing or not writable")
    return text


def count(low: int, high: int = 1 << 31) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer (an integer >= {low})") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range (an integer >= {low} and <= {high})")
        return value

    return parse
