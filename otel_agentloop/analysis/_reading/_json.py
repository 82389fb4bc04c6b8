"""JSON as the views read and write it: what ``json.loads`` makes, and what ``json.dumps`` is given."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None
"""A JSON value (a float may be NaN or infinite: Python's JSON reads and writes those)."""
JsonObject: TypeAlias = dict[str, JsonValue]
"""A JSON object: a query body sent, a page's data, a Perfetto event."""


def dig(value: object, *keys: str) -> object:
    """``value[k1][k2]...`` of JSON read or made; ``KeyError`` where a level is missing or not an object."""
    for key in keys:
        if not isinstance(value, Mapping) or key not in value:
            raise KeyError(key)
        value = value[key]
    return value
