"""Failure containment: our own bugs are logged once per call site and never reach user code."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable

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


# -- fork safety --------------------------------------------------------------------------------------
_fork_hooks: list[weakref.WeakMethod[Callable[[], object]]] = []
_fork_hooks_lock = threading.Lock()


def after_fork_in_child(owner: object, method: str) -> None:
    """Call ``owner.<method>()`` in a forked child (before anything else of ours runs there), while ``owner``
    lives. Every lock and thread this library owns registers here: a child inherits locks held by threads
    that do not exist in it."""
    with _fork_hooks_lock:
        if len(_fork_hooks) >= 256:  # forget owners that are gone
            _fork_hooks[:] = [ref for ref in _fork_hooks if ref() is not None]
        _fork_hooks.append(weakref.WeakMethod(getattr(owner, method)))


def _run_fork_hooks() -> None:
    global _fork_hooks_lock
    _fork_hooks_lock = threading.Lock()
    alive = []
    for ref in _fork_hooks:
        hook = ref()
        if hook is None:
            continue
        alive.append(ref)
        try:
            hook()
        except Exception:
            internal_error("after_fork")
    _fork_hooks[:] = alive


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_run_fork_hooks)
