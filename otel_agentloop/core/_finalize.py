"""What is left of a record's span limits when it ended, applied off the hot path (the export pipeline)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._record import FastSpan
from ._values import bound_attributes


def finalize(span: FastSpan) -> None:
    """Apply what is left of the provider's span limits to an ended ``span``: the attributes it started with
    (a sample's shared dict, never written to, so not bounded when written) cleaned, cut to the length limit,
    the oldest over the count limit evicted (counted in ``dropped_attributes``), as the SDK's
    ``BoundedAttributes`` would; the links it started with bounded. What the user wrote through the ``Span`` API
    was bounded as it was written (``core._record``). Costs a type check per attribute when nothing needs
    doing, and not even that for a shared dict found clean for the span before (a sample's phases)."""
    global _clean
    limits = span.recorder.limits
    attrs = span.attributes
    key = (attrs, limits.max_span_attributes, limits.max_span_attribute_length)
    shared = not span.owned
    last = _clean  # one read: another handle's pipeline may replace it meanwhile
    if shared and last[0] is attrs and last[1:] == key[1:]:
        pass
    elif (key[1] is not None and len(attrs) > key[1]) or _too_long(attrs, key[2]):
        span.attributes, dropped = bound_attributes(attrs, key[1], key[2])
        span.owned = True
        span.dropped_attributes += dropped
    elif shared:
        _clean = key  # the dict kept alive (its id is never another dict's); a shared dict is never written to
    if span.links and not span.links_bounded:
        span.bound_links()


_clean: tuple[object, int | None, int | None] = (None, None, None)
"""The last shared attribute dict :func:`finalize` found clean, with the count and length limits it was checked
against (the dict only compared by identity)."""


def _too_long(attrs: Mapping[str, Any], length: int | None) -> bool:
    """Whether a value of ``attrs`` needs the SDK's cleaning: not a plain ``str``/``int``/``float``/``bool``,
    or a ``str`` over ``length``."""
    for value in attrs.values():
        kind = type(value)
        if kind is str:
            if length is not None and len(value) > length:
                return True
        elif kind is not int and kind is not float and kind is not bool:
            return True
    return False
