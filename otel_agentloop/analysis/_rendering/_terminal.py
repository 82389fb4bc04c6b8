"""Text for a terminal: whether a stream may get colour (no-color.org's ``NO_COLOR``, ``FORCE_COLOR``), data made
safe to print (:func:`~.._reading._text.printable`), and the CLI's output functions (:func:`say`, :func:`say_json`)."""

from __future__ import annotations

import json
import os
import sys
from typing import TextIO

from .._reading._text import printable


def color_enabled(stream: TextIO) -> bool:
    """Whether text for people on ``stream`` may carry colour: not with ``NO_COLOR`` (non-empty), yes with
    ``FORCE_COLOR`` (non-empty), else only when ``stream`` is a terminal."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return isatty(stream)


def isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # closed, or not a real file
        return False


def counted(n: int, noun: str, plural: str = "") -> str:
    """``"1 step"``, ``"3 steps"``: ``n`` and ``noun``, in the plural (``plural``, default ``noun + "s"``) unless
    ``n`` is 1."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


MAX_ERR_LINE_CHARS = 2000
"""The longest line ``report`` prints on stderr."""


def say(text: object = "", *, err: bool = False) -> None:
    """The CLI's one way to print for people (stdout, or stderr with ``err``): each line of ``text`` through
    :func:`printable`, so no control character, bidi control or lone surrogate from data reaches the terminal
    whatever the caller built the line from. Lines on stderr are cut at :data:`MAX_ERR_LINE_CHARS`; stdout lines
    are whole (tables, JSON: their cells are cut where they are made)."""
    stream = sys.stderr if err else sys.stdout
    cap = MAX_ERR_LINE_CHARS if err else None
    lines = (text if isinstance(text, str) else printable(text, max_chars=None)).split("\n")
    print("\n".join(printable(line, max_chars=cap) for line in lines), file=stream)


def say_json(value: object, indent: int | None = None, *, allow_nan: bool = True) -> None:
    """Print ``value`` as JSON on stdout: ASCII only, and DEL escaped too (``json.dumps`` leaves it raw), so the
    output is valid JSON that carries no control character to a terminal."""
    say_text = json.dumps(value, indent=indent, allow_nan=allow_nan).replace("\x7f", "\\u007f")
    print(say_text)
