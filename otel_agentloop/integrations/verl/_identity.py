"""A sample's identity on verl's agent-loop worker where verl's own cannot key it (its arrival order in its
step), verl's fields read safely, and the per-step tables nobody collects (V1, fully-async) released."""

from __future__ import annotations

import itertools
from typing import Any

from ...core._guard import internal_error
from ...setup import current_handle
from . import _patching as patching
from ._rows import identity_int

_arrivals: dict[tuple[int, bool], dict[str, int]] = {}


def arrival_index(step: int, validate: bool, uid: str, keep: int = 8) -> int:
    """V1 without the dispatching process's position (it was not instrumented): the order in which this worker
    received the prompt in its step. verl's dataset index is not unique, and the index keys a sample's row."""
    with patching.lock:
        seen = _arrivals.get((step, validate))
        if seen is None:
            seen = _arrivals[(step, validate)] = {}
            for old in [k for k in _arrivals if k[1] == validate and k[0] < step - keep]:
                del _arrivals[old]
        return seen.setdefault(uid, len(seen))


_released_before: dict[bool, int] = {}


def release_stale(step: int, validate: bool, keep: int = 4) -> None:
    """Nobody collects the worker's per-step tables in V1 and fully-async (the trainer gets per-trajectory rows):
    release steps more than ``keep`` behind the newest dispatch, so they are not evicted with a warning."""
    if _released_before.get(validate, -1) >= step - keep:
        return
    _released_before[validate] = step - keep
    handle = current_handle()
    if handle is None:
        return
    try:
        for old, old_validate in handle.metrics.open_steps():
            if old_validate == validate and isinstance(old, int) and old < step - keep:
                handle.metrics.take(old, old_validate)
    except Exception:
        internal_error("verl.v1.release_stale")


def as_int(value: Any) -> int:
    """verl's identity value as an int (see :func:`._rows.identity_int`); raises ``ValueError`` when it is not one."""
    number = identity_int(value)
    if number is None:
        raise ValueError(f"not an int identity: a {type(value).__qualname__}")
    return number


def field_of(trajectory: Any, key: str) -> Any:
    """``trajectory[key]``, ``None`` when missing."""
    try:
        return trajectory[key]
    except Exception:
        return None


_unique_ids = itertools.count()


def unique_key() -> str:
    """A key that :func:`arrival_index` never saw: the sample's own arrival number."""
    return f"#{next(_unique_ids)}"
