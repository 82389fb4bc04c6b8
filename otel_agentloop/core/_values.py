"""Conversions of user values: every one guarded (a failing ``__str__``, ``__int__`` or ``__repr__`` never
reaches the user's code)."""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.util.types import AttributeValue

from ._guard import internal_error, safe_str, warn_once

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def safe_repr(value: object, limit: int = 200) -> str:
    """``repr(value)``, bounded; never raises."""
    try:
        return safe_str(repr(value), limit)
    except BaseException:
        return safe_str(value, limit)


def coerce_number(value: object, kind: type[int] | type[float], key: str) -> int | float | None:
    """``value`` as ``kind`` (numpy scalars and numeric strings included), or ``None`` with a one-time warning.

    Whatever the conversion raises (a multi-element tensor, ``np.ma.masked``, a failing ``__int__``) and ints
    outside int64 (what OTLP can carry) give ``None``. Never raises an ``Exception``."""
    try:
        if isinstance(value, bool):
            raise TypeError("bool")
        number = kind(value)  # type: ignore[call-overload,arg-type]  # any value: what kind() raises is caught
        if kind is int and not INT64_MIN <= number <= INT64_MAX:
            raise OverflowError("outside int64")
        return number
    except Exception:
        warn_once("bad-value:" + key, "otel_agentloop: dropping non-numeric value for %s: %s", key, safe_repr(value))
        return None


_SCALARS = (str, bool, int, float)


def _clean_value(value: object, depth: int = 0) -> object:
    if value is None or type(value) in _SCALARS:
        return value
    if isinstance(value, _SCALARS):  # subclasses (np.float64, str enums) as the SDK accepts them
        return value
    if isinstance(value, (list, tuple)) and depth == 0:
        return tuple(_clean_value(v, 1) for v in value)
    if isinstance(value, Mapping) and depth < 4:
        return {safe_str(k): _clean_value(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    text = safe_str(value, 4096)
    return text


def clean_attributes(attributes: Mapping[str, object] | None) -> dict[str, AttributeValue]:
    """User-supplied attributes made safe for the SDK: values it would stringify are stringified here, with
    every failure guarded (the SDK calls ``__str__`` unguarded, and one failure would drop the whole span)."""
    out: dict[str, AttributeValue] = {}
    if not attributes:
        return out
    try:
        for key, value in attributes.items():
            if isinstance(key, str):
                out[key] = _clean_value(value)  # type: ignore[assignment]
    except Exception:
        internal_error("clean_attributes")
    return out
