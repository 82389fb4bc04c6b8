"""Data from traces made safe to print on a terminal (:func:`printable`): the one sanitiser every line the
CLI prints and every message built from trace data goes through."""

from __future__ import annotations

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
