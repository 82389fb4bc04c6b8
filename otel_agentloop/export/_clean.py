"""Text every exporter can encode: lone surrogates (``os.fsdecode`` of a non-UTF-8 name, ``surrogateescape``
input) replaced by U+FFFD. UTF-8 encoding of a ``str`` fails on surrogate code points only, so this is the one
repair an encoder needs. Our OTLP-JSON encoder repairs its output only when the plain encode fails; for other
exporters (the SDK's protobuf encoder fails the whole batch on one such span name, and drops such an attribute
with a logged traceback each time) :func:`repaired` copies just the spans that need it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, Status
from opentelemetry.util.types import AttributeValue

from ..core._guard import internal_error
from ..core._values import plain_attributes

_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD; a well-formed surrogate pair becomes its character."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _clean(value: Any) -> Any:  # Any: an attribute value (the user's), any kind the SDK keeps, as it came
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, (bytes, bytearray)):
        return value
    if isinstance(value, Mapping):
        return _clean_attrs(value)
    if isinstance(value, Sequence):
        return type(value)(_clean(v) for v in value) if isinstance(value, (tuple, list)) else [_clean(v) for v in value]
    return value


def _clean_attrs(attrs: Mapping[str, object] | None) -> dict[str, AttributeValue]:
    return {_clean(k): _clean(v) for k, v in (attrs or {}).items()}


class SpanCleaner:
    """Builds encodable copies of spans for one batch (resources and scopes are cleaned once and shared, so an
    encoder that groups spans by resource still groups them)."""

    def __init__(self) -> None:
        # id -> (the original, kept alive while its id is a key; its copy)
        self._resources: dict[int, tuple[Resource | None, Resource]] = {}
        self._scopes: dict[int, tuple[InstrumentationScope | None, InstrumentationScope | None]] = {}

    def _resource(self, resource: Resource | None) -> Resource:
        entry = self._resources.get(id(resource))
        if entry is None:
            attrs = resource.attributes if resource is not None else {}
            schema = resource.schema_url if resource is not None else None
            entry = self._resources[id(resource)] = (resource, Resource(_clean_attrs(attrs), schema))
        return entry[1]

    def _scope(self, scope: InstrumentationScope | None) -> InstrumentationScope | None:
        entry = self._scopes.get(id(scope))
        if entry is None:
            clean = None
            if scope is not None:
                clean = InstrumentationScope(
                    clean_text(scope.name),
                    _clean(scope.version),
                    _clean(scope.schema_url),
                    _clean_attrs(scope.attributes),
                )
            entry = self._scopes[id(scope)] = (scope, clean)
        return entry[1]

    def span(self, s: ReadableSpan) -> ReadableSpan:
        """A copy of ``s`` with every string cleaned (name, attribute keys and values, nested ones too, events,
        links, status message, resource, scope)."""
        status = s.status
        return ReadableSpan(
            name=clean_text(s.name),
            context=s.context,
            parent=s.parent,
            resource=self._resource(s.resource),
            attributes=_clean_attrs(s.attributes),
            events=[Event(clean_text(e.name), _clean_attrs(e.attributes), e.timestamp) for e in s.events],
            links=[Link(link.context, _clean_attrs(link.attributes)) for link in s.links],
            kind=s.kind,
            status=Status(status.status_code, _clean(status.description)),
            start_time=s.start_time,
            end_time=s.end_time,
            instrumentation_scope=self._scope(s.instrumentation_scope),
        )


def _bad(value: object) -> bool:
    """``value`` (or a key or item inside it) is text UTF-8 cannot encode."""
    if isinstance(value, str):
        return not value.isascii() and _SURROGATE.search(value) is not None
    if isinstance(value, Mapping):
        return _bad_attrs(value)
    if isinstance(value, (tuple, list)):
        return any(_bad(v) for v in value)
    return False


_PLAIN = (int, float, bool, type(None))


def _bad_attrs(attrs: Mapping[str, object] | None) -> bool:
    inner = plain_attributes(attrs)
    if not inner:
        return False
    for key, value in inner.items():
        if type(value) is str:
            if not value.isascii() and _SURROGATE.search(value) is not None:
                return True
        elif type(value) not in _PLAIN and _bad(value):
            return True
        if not (type(key) is str and key.isascii()) and _bad(key):
            return True
    return False


def needs_repair(s: ReadableSpan, resources: dict[int, bool] | None = None) -> bool:
    """Some text of ``s`` (or of its resource or scope) cannot be encoded as UTF-8. ``resources`` caches the
    answer per resource within a batch."""
    try:  # the SDK's own fields: each public property costs a call (and copies events and links)
        name, attrs, events, links, status = s._name, s._attributes, s._events, s._links, s._status
    except AttributeError:
        name, attrs, events, links, status = s.name, s.attributes, s.events, s.links, s.status
    if (
        _bad(name)
        or _bad_attrs(attrs)
        or (status.description is not None and _bad(status.description))
        or (events and any(_bad(e.name) or _bad_attrs(e.attributes) for e in events))
        or (links and any(_bad_attrs(link.attributes) for link in links))
    ):
        return True
    resource = getattr(s, "resource", None)  # a ReadableSpan-like object may have none
    if resource is not None:
        bad = None if resources is None else resources.get(id(resource))
        if bad is None:
            bad = _bad_attrs(resource.attributes)
            if resources is not None:
                resources[id(resource)] = bad
        if bad:
            return True
    scope = s.instrumentation_scope
    return scope is not None and (_bad(scope.name) or _bad(scope.version) or _bad_attrs(scope.attributes))


def repaired(batch: Sequence[ReadableSpan]) -> tuple[Sequence[ReadableSpan], int]:
    """``batch`` with each span whose text cannot be encoded replaced by a repaired copy (``batch`` itself when
    none needs it), and how many spans could not be checked or copied: those are left out (to be counted as
    dropped)."""
    cleaner: SpanCleaner | None = None
    out: list[ReadableSpan] = []
    lost = 0
    resources: dict[int, bool] = {}
    for span in batch:
        try:
            if needs_repair(span, resources):
                cleaner = cleaner or SpanCleaner()
                span = cleaner.span(span)
            out.append(span)
        except Exception:
            lost += 1
            internal_error("repairing a span's text (the span is dropped and counted)")
    return (out if cleaner is not None or lost else batch), lost
