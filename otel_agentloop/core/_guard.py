"""Failure containment: our own bugs are logged once per call site and never reach user code."""

from __future__ import annotations

from ..config._values import forget_warnings as forget_warnings  # the one warn-once registry, for every layer
from ..config._values import logger as logger
from ..config._values import warn_once as warn_once


def internal_error(where: str) -> None:
    """Report an exception raised inside instrumentation (call from an ``except`` block), once per site."""
    warn_once(
        "internal:" + where,
        "otel_agentloop: internal error in %s (suppressed; training continues)",
        where,
        exc_info=True,
    )


def safe_str(value: object, limit: int = 1024) -> str:
    """``str(value)`` truncated to ``limit``; never raises, even when ``__str__`` raises a ``BaseException``
    (a user's exception in flight must never be replaced by one from its own ``__str__``)."""
    try:
        text = value if type(value) is str else str(value)
    except BaseException:
        try:
            text = f"<unprintable {type(value).__qualname__}>"
        except BaseException:
            text = "<unprintable>"
    return text if len(text) <= limit else text[:limit] + "…"
