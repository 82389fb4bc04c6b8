"""Text for a terminal: whether a stream may get colour (no-color.org's ``NO_COLOR``, ``FORCE_COLOR``), data made
safe to print (:func:`printable`), and the CLI's output functions (:func:`say`, :func:`say_json`)."""

from __future__ import annotations

import json
import os
import sys
from typing import TextIO


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


MAX_DATA_CHARS = 160
"""The longest a string from trace data is printed (a 2 MB ``error.type`` is one line, not 2 MB)."""

# Bidi embeddings, overrides and isolates, and the marks: they reorder what follows on the line ("Trojan source").
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_LINE_BREAKS = frozenset("\u2028\u2029\u0085")


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _unsafe(ch: str) -> bool:
    code = ord(ch)
    return (
        code < 0x20  # C0, with ESC, BEL, CR, LF, TAB
        or 0x7F <= code <= 0x9F  # DEL and C1 (CSI 0x9b, OSC 0x9d ...)
        or 0xD800 <= code <= 0xDFFF  # a lone surrogate cannot be encoded for the terminal
        or ch in _BIDI
        or ch in _LINE_BREAKS
    )


def printable(value: object, max_chars: int | None = MAX_DATA_CHARS) -> str:
    """``value`` as text that is safe to print on a terminal: every control character (C0, DEL, C1), bidi
    control, line separator and lone surrogate is shown escaped (``\\x1b``, ``\\u202e``), so none reaches the
    terminal as a command; at most ``max_chars`` characters (``None``: no cap), a cut ending in ``…``.

    Never raises. Idempotent: the escapes are plain ASCII. Rich markup is not special here; the renderers print
    with markup off, so ``[red]`` is shown as written.
    """
    try:
        text = value if isinstance(value, str) else str(value)
    except Exception:  # a user object whose __str__ raises
        text = f"<{type(value).__name__}>"
    if max_chars is not None and len(text) > max_chars:
        text = text[: max_chars + 1]  # an escape never shortens, so this is enough to fill max_chars
    if any(_unsafe(ch) for ch in text):
        text = "".join(_escape(ch) if _unsafe(ch) else ch for ch in text)
    if max_chars is not None and len(text) > max_chars:
        text = text[: max(max_chars - 1, 0)] + "…"
    return text


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
