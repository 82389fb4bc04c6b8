"""Checks on the values of a stored step summary (JSON read back from a file or Jaeger: untrusted data). Each
returns the value, typed, or raises ``ValueError`` saying what is wrong."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TypeGuard

from ._table import OverdueSample


def sample_key(raw: object) -> tuple[int, int]:
    if not (isinstance(raw, list) and len(raw) == 2 and is_int(raw[0]) and is_int(raw[1])):
        raise ValueError("a summary's sample key is malformed")
    return raw[0], raw[1]


def is_int(v: object) -> TypeGuard[int]:
    return type(v) is int and -(1 << 63) <= v < (1 << 63)


def finite(v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{v!r:.40} is not a finite number")
    return float(v)


def seconds(v: object) -> float:
    """A duration: a finite number, not negative (no phase, tool call or sample takes negative time)."""
    out = finite(v)
    if out < 0:
        raise ValueError(f"{v!r:.40} seconds is negative")
    return out


def count(v: object, what: str) -> int:
    """A count: an int (JSON ``3``, or ``3.0`` as some writers spell it), not negative."""
    out = finite(v)
    if out < 0 or not out.is_integer() or out >= 1 << 63:
        raise ValueError(f"the summary's {what} {v!r:.40} is not a count")
    return int(out)


def times(raw: object) -> tuple[int, int, int, int]:
    """The summary's ``t``: first start, median end, last end, collected (Unix ns, 0: unknown), in that order
    where known (the median sample ends by the last one, and after the first started)."""
    if not isinstance(raw, list) or len(raw) != 4 or not all(is_int(t) and t >= 0 for t in raw):
        raise ValueError("the summary's times are not 4 non-negative integers")
    start, median, end, collected = raw
    if median > end or (start and median and start > median):
        raise ValueError("the summary's times are out of order")
    return start, median, end, collected


def string(v: object) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{v!r:.40} is not a string")
    return v


def causes_of(raw: object) -> dict[tuple[int, int], str]:
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise ValueError("the summary's causes are not a list")
    out = {}
    for item in raw:
        if not (isinstance(item, list) and len(item) == 3 and is_int(item[0]) and is_int(item[1])):
            raise ValueError("a cause is malformed")
        out[(item[0], item[1])] = string(item[2])
    return out


def mapping(raw: object, what: str) -> Mapping[str, object]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"the summary's {what} is not an object")
    return raw


def overdue(raw: object) -> tuple[OverdueSample, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError("the summary's watchdog samples are not a list")
    out = []
    for item in raw:
        if not isinstance(item, list) or len(item) != 5:
            raise ValueError("a watchdog sample is malformed")
        index, rollout, trace_id, phase, tool = item
        out.append(
            OverdueSample(
                index if is_int(index) else None,
                rollout if is_int(rollout) else None,
                str(trace_id),
                str(phase),
                None if tool is None else str(tool),
            )
        )
    return tuple(out)
