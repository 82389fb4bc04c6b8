"""The recording path a benchmark runs on (issue 20): the fast path (the default) or every span through the SDK.

The switch is the setting ``fast_path``: ``configure(fast_path=...)`` and ``OTEL_AGENTLOOP_FAST_PATH``. A tree
without the fast path does not know the setting: :func:`configure_on` then configures as usual (the variable is
ignored there) and :func:`path_used` says so, so the same benchmark runs, and labels its numbers honestly, on
the trees before and after the fast path.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator
from typing import Any

import otel_agentloop as oal

FAST_PATH_VARIABLE = "OTEL_AGENTLOOP_FAST_PATH"
PATHS = ("fast", "sdk")


@contextlib.contextmanager
def _variable(name: str, value: str) -> Generator[None, None, None]:
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def configure_on(path: str, **kwargs: Any) -> oal.Handle:
    """``oal.configure(**kwargs)`` on ``path`` ("fast" or "sdk"): through the keyword where ``configure`` takes
    it, else through the variable where the settings declare ``fast_path``, else (a tree without the fast
    path) as usual."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, not {path!r}")
    fast = path == "fast"
    try:
        return oal.configure(fast_path=fast, **kwargs)  # type: ignore[call-arg]
    except TypeError as e:
        if "fast_path" not in str(e):
            raise
    if not has_fast_path():
        return oal.configure(**kwargs)
    with _variable(FAST_PATH_VARIABLE, "true" if fast else "false"):
        return oal.configure(**kwargs)


def has_fast_path() -> bool:
    """Whether this tree declares the ``fast_path`` setting."""
    from otel_agentloop.config._settings import Settings

    return hasattr(Settings(), "fast_path")


def path_used(handle: oal.Handle) -> str:
    """The path ``handle`` records on, from its resolved settings: "fast", "sdk", or "sdk (no fast path in this
    tree)"."""
    fast = getattr(handle.settings, "fast_path", None)
    if fast is None:
        return "sdk (no fast path in this tree)"
    return "fast" if fast else "sdk"
