"""Whether a stream is a terminal that may get colour (no-color.org's ``NO_COLOR``, ``FORCE_COLOR``)."""

from __future__ import annotations

import os
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
