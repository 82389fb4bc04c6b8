"""Conversions of user values: every one guarded (a failing ``__str__``, ``__int__`` or ``__repr__`` never
reaches the user's code).

Attribute values follow the SDK's rules (``opentelemetry.attributes``: ``_clean_attribute_value`` and
``BoundedAttributes``) with the same results, except: a value whose ``str()`` raises (where the SDK raises) or
that nests deeper than :data:`MAX_DEPTH` (the SDK follows any depth, raising only past Python's recursion limit,
as for a list that contains itself) becomes its guarded text (:func:`~otel_agentloop.core._guard.safe_str`), with
one warning (docs/fast-path.md)."""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Mapping, Sequence
from typing import TypeVar

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.util.types import AnyValue, AttributeValue

from ._guard import internal_error, safe_str, warn_once

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1
MAX_DEPTH = 64
"""Nesting deeper than this (sequences and mappings in one another) is not followed: the value becomes text. The
SDK (1.45) follows any depth until Python's recursion limit (then raises from the user's call); 64 keeps every
value a program really writes (a list 40 deep: nested arrays on both paths) and the encoders' recursion bounded.
``analysis._reading._decode.MAX_VALUE_DEPTH`` reads this depth back."""
PLAIN = (str, bool, int, float)
V = TypeVar("V")


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


class _UnconvertibleError(Exception):
    """Raised inside :func:`_convert` when the SDK would raise (or recurse without end)."""


def _has_own_str(value: object) -> bool:
    """The SDK's ``_is_non_custom_str``: ``str()`` says more than the default ``object`` repr."""
    cls = type(value)
    return cls.__str__ is not object.__str__ or cls.__repr__ is not object.__repr__


def _convert(value: object, length: int | None, depth: int) -> AnyValue:
    """The SDK's ``_clean_attribute_value``; raises :class:`_UnconvertibleError` where the SDK would raise."""
    if value is None or isinstance(value, (bool, int, float, bytes)):
        return value  # subclasses (np.float64, IntEnum) as the SDK keeps them
    if isinstance(value, str):
        return value if length is None or len(value) <= length else value[:length]
    if depth >= MAX_DEPTH:
        raise _UnconvertibleError
    try:
        if isinstance(value, Sequence):
            return tuple(_convert(v, length, depth + 1) for v in value)
        if isinstance(value, Mapping):
            return _convert_mapping(value, length, depth + 1)
        return str(value) if _has_own_str(value) else None
    except _UnconvertibleError:
        raise
    except Exception as exc:
        raise _UnconvertibleError from exc


def _convert_mapping(value: Mapping[object, object], length: int | None, depth: int) -> dict[str, AnyValue]:
    """The SDK's mapping rule: empty keys dropped, other keys not ``str`` as their ``str()`` (dropped without
    one); raises :class:`_UnconvertibleError` for a value that cannot be converted."""
    out: dict[str, AnyValue] = {}
    for key, val in value.items():
        if not key:
            continue
        if type(key) is not str and not isinstance(key, str):
            if not _has_own_str(key):
                continue
            key = str(key)
        out[key] = _convert(val, length, depth)
    return out


def clean_value(value: object, length: int | None = None) -> AnyValue:
    """One attribute value as the SDK stores it (strings, nested ones too, cut to ``length``). Never raises: a
    value the SDK cannot convert becomes its guarded text, with one warning."""
    try:
        return _convert(value, length, 0)
    except Exception:
        warn_once(
            "unconvertible-value",
            "otel_agentloop: an attribute value cannot be converted; kept as text: %s",
            safe_repr(value),
        )
        text = safe_str(value, 4096 if length is None else length)
        return text if length is None or len(text) <= length else text[:length]


def clean_mapping(attributes: object, length: int | None = None) -> tuple[dict[str, AnyValue], int]:
    """``attributes`` (a mapping, or ``None``) as the SDK's ``BoundedAttributes`` cleans them before any count
    limit: ``(cleaned, number of keys dropped)``. Never raises: what cannot be read gives ``({}, 0)``."""
    if not attributes:
        return {}, 0
    out: dict[str, AnyValue] = {}
    try:
        items = attributes.items()  # type: ignore[attr-defined]
        for key, value in items:
            if not key:
                continue
            if type(key) is not str:
                if not isinstance(key, str) and not _has_own_str(key):
                    continue
                key = safe_str(key, 1 << 20)
            out[key] = clean_value(value, length)
        return out, len(attributes) - len(out)  # type: ignore[arg-type]
    except Exception:
        internal_error("clean_mapping")
        return out, 0


def bound_attributes(attributes: object, count: int | None, length: int | None) -> tuple[dict[str, AnyValue], int]:
    """``attributes`` as ``BoundedAttributes(count, attributes, max_value_len=length)`` keeps them: cleaned,
    the newest ``count`` kept; ``(kept, dropped)``. Never raises."""
    if count == 0:
        try:
            return {}, len(attributes) if attributes else 0  # type: ignore[arg-type]
        except Exception:
            return {}, 0
    cleaned, dropped = clean_mapping(attributes, length)
    if count is not None and len(cleaned) > count:
        over = len(cleaned) - count
        cleaned = dict(list(cleaned.items())[over:])
        dropped += over
    return cleaned, dropped


def frozen_attributes(attributes: Mapping[str, AnyValue], dropped: int) -> BoundedAttributes:
    """Already bounded ``attributes`` as the SDK's immutable mapping that reports ``dropped`` (what a
    ``trace.Link`` reads its dropped count from)."""
    frozen = BoundedAttributes(None, attributes, immutable=True)
    frozen.dropped = dropped
    return frozen


def plain_attributes(attributes: Mapping[str, V] | None) -> Mapping[str, V] | None:
    """The plain dict behind the SDK's ``BoundedAttributes`` when it is there (iterating the public view costs a
    Python-level call per item); the mapping itself otherwise. For code that only reads (the encoders, the door)."""
    inner: Mapping[str, V] | None = getattr(attributes, "_dict", None)
    return inner if inner is not None else attributes


def clean_attributes(attributes: Mapping[str, object] | None) -> dict[str, AttributeValue]:
    """User-supplied ``attributes=`` (a phase, sample or step) made safe for both paths: converted as the SDK
    converts them (no length limit here: each path applies it), with every failure guarded (the SDK calls
    ``__str__`` unguarded, and one failure would drop the whole span)."""
    return clean_mapping(attributes)[0]


def timestamp_ns(value: object, default: int | None = None) -> int:
    """A user's timestamp (ns since the epoch) as an int OTLP can carry. ``None``: now. A finite number that is
    not an int (``time.time() * 1e9``, a numpy scalar) is read as nanoseconds (one warning); anything that
    cannot be a time (NaN, negative, past 2**64, not a number) gives ``default`` (``None``: now), with one
    warning. Never raises."""
    if type(value) is int and 0 <= value <= UINT64_MAX:
        return value
    if value is None:
        return time.time_ns()
    try:
        if isinstance(value, bool):
            raise TypeError("a bool")
        if isinstance(value, numbers.Integral):
            ns = int(value)
        elif isinstance(value, numbers.Real) and math.isfinite(number := float(value)):
            ns = int(number)
            warn_once(
                "float-timestamp",
                "otel_agentloop: a timestamp that is not an int is read as nanoseconds since the epoch: %s",
                safe_repr(value),
            )
        else:
            raise TypeError("not a number")
        if 0 <= ns <= UINT64_MAX:
            return ns
    except Exception:
        pass
    warn_once(
        "bad-timestamp", "otel_agentloop: not a timestamp, replaced by the time of the call: %s", safe_repr(value)
    )
    return time.time_ns() if default is None else default
