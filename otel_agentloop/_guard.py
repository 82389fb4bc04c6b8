"""Failure containment: our own bugs are logged once per call site and never reach user code."""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("otel_agentloop")

_seen: set[str] = set()
_seen_lock = threading.Lock()


def warn_once(key: str, message: str, *args: object, exc_info: bool = False) -> None:
    """Log ``message`` at WARNING the first time ``key`` is seen in this process; later calls are free."""
    if key in _seen:
        return
    with _seen_lock:
        if key in _seen:
            return
        _seen.add(key)
    logger.warning(message, *args, exc_info=exc_info)


def internal_error(where: str) -> None:
    """Report an exception raised inside instrumentation (call from an ``except`` block), once per site."""
    warn_once("internal:" + where, "otel_agentloop: internal error in %s (suppressed; training continues)", where,
              exc_info=True)


def reset_warnings() -> None:
    """Forget which warnings were issued (tests)."""
    with _seen_lock:
        _seen.clear()
