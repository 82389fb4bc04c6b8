"""OTLP protobuf spans (``opentelemetry.proto`` messages, as Jaeger's gRPC ``api_v3`` streams them) straight into
:class:`~otel_agentloop.metrics.SpanRecord`, without the OTLP-JSON detour: the same records, read by the same
rules, as :func:`~._decode.decode_span` makes of their OTLP-JSON form (``_jaeger_grpc``'s), at a fraction of the
cost (41,000 spans of an 8,192-sample step).

Each span comes back as a :class:`~._decode.DecodedSpan` (its ids and start as OTLP-JSON keys, for the searches'
bookkeeping, and its record); :func:`~._decode.decode_resource_spans` yields its record. A span that this reader
would reject (an id of the wrong length, a time past int64, an end before its start) is handed on in
its OTLP-JSON form instead, so that the OTLP-JSON decoder skips and counts it, with its reason, exactly as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from ...metrics._records import SpanRecord
from ._decode import _INT64, LABELS, MAX_VALUE_DEPTH, TOO_DEEP, AttrValue, DecodedSpan, _label, _TooDeepError
from ._json import JsonObject, JsonValue

if TYPE_CHECKING:  # the messages' modules are imported where an answer is read (``_jaeger_grpc``)
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span

Fallback = Callable[["Span"], JsonObject]
"""The OTLP-JSON form of a protobuf span, for what this reader hands on."""


class _RejectError(ValueError):
    """A field the OTLP-JSON decoder would reject: the span is handed on in its OTLP-JSON form."""


def _value(v: AnyValue, depth: int) -> AttrValue:
    """One ``AnyValue``, as ``_decode._value`` reads its OTLP-JSON form (an empty one is ``None``)."""
    if depth > MAX_VALUE_DEPTH:
        raise _TooDeepError("too deep")
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "int_value":
        return v.int_value
    if kind == "double_value":
        return v.double_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "array_value":
        return tuple(_value(x, depth + 1) for x in v.array_value.values)
    if kind == "bytes_value":
        return bytes(v.bytes_value)
    if kind == "kvlist_value":
        return dict(_key_value(kv, depth + 1) for kv in v.kvlist_value.values)
    return None


def _key_value(kv: KeyValue, depth: int = 0) -> tuple[str, AttrValue]:
    """As ``_decode._key_value``: too deep is :data:`~._decode.TOO_DEEP` at the top, a label's list its JSON."""
    key = kv.key
    try:
        decoded = _value(kv.value, depth)
    except _TooDeepError:
        if depth:
            raise
        return key, TOO_DEEP
    if key in LABELS and isinstance(decoded, (dict, tuple)):
        return key, _label(decoded)
    return key, decoded


_SCALARS = frozenset(("string_value", "int_value", "double_value", "bool_value"))
"""The ``AnyValue`` kinds read as they are (a label's list or a nested value goes through :func:`_key_value`)."""


def attributes(kvs: Iterable[KeyValue]) -> dict[str, AttrValue]:
    """A ``repeated KeyValue`` as a dict (the last of a repeated key wins, as in ``_decode``)."""
    out: dict[str, AttrValue] = {}
    for kv in kvs:
        v = kv.value
        kind = v.WhichOneof("value")
        if kind in _SCALARS:
            out[kv.key] = getattr(v, kind)
        else:
            key, value = _key_value(kv)
            out[key] = value
    return out


def _id(raw: bytes, nbytes: int) -> int:
    if len(raw) == nbytes:
        return int.from_bytes(raw, "big")
    if not raw:
        return 0
    raise _RejectError


def _time(value: int) -> int:
    if value >= _INT64:  # fixed64: never negative
        raise _RejectError
    return value


def _record(s: Span, resource: dict[str, AttrValue]) -> SpanRecord:
    start, end = _time(s.start_time_unix_nano), _time(s.end_time_unix_nano)
    if end < start:
        raise _RejectError
    status = s.status
    events = tuple((e.name, _time(e.time_unix_nano), attributes(e.attributes)) for e in s.events)
    return SpanRecord(
        trace_id=_id(s.trace_id, 16),
        span_id=_id(s.span_id, 8),
        parent_id=_id(s.parent_span_id, 8),
        name=s.name,
        start_ns=start,
        end_ns=end,
        attributes=attributes(s.attributes),
        error=status.code == 2,
        status_message=status.message,
        kind=min(max(s.kind - 1, 0), 4),  # as ``_decode._kind``: back to the SDK's SpanKind value (0..4)
        resource=resource,
        events=events,
        links=tuple((_id(link.trace_id, 16), _id(link.span_id, 8)) for link in s.links),
    )


def _span(s: Span, resource: dict[str, AttrValue], fallback: Fallback) -> Mapping[str, object]:
    try:
        record = _record(s, resource)
    except _RejectError:
        return fallback(s)
    return DecodedSpan(
        record, traceId=s.trace_id.hex(), spanId=s.span_id.hex(), startTimeUnixNano=s.start_time_unix_nano
    )


class Resources:
    """The resources read so far in one answer, by their bytes: Jaeger sends a trace per message, each with its
    process's resource, and the spans of one process share one dict (read-only, as every record's resource is).
    Bounded: past :data:`MAX_RESOURCES` distinct ones, it starts over."""

    MAX_RESOURCES = 4096

    def __init__(self) -> None:
        self._seen: dict[bytes, dict[str, AttrValue]] = {}

    def read(self, resource: Resource) -> dict[str, AttrValue]:
        key = resource.SerializeToString(deterministic=True)
        found = self._seen.get(key)
        if found is None:
            if len(self._seen) >= self.MAX_RESOURCES:
                self._seen.clear()
            found = self._seen[key] = attributes(resource.attributes)
        return found


def resource_spans(
    rs: ResourceSpans,
    span: Fallback,
    resource_json: Callable[[Iterable[KeyValue]], list[JsonValue]],
    resources: Resources | None = None,
) -> dict[str, object]:
    """One ``ResourceSpans`` message as an OTLP-JSON ``resourceSpans`` entry whose spans are
    :class:`~._decode.DecodedSpan`, each with its resource; ``span``: a span's OTLP-JSON form, for those this reader
    hands on, and ``resource_json``: the resource's attributes' (then the entry's, for those spans); ``resources``:
    the answer's resources so far (shared with the entries before)."""
    resource = resources.read(rs.resource) if resources is not None else attributes(rs.resource.attributes)
    scopes = [[_span(s, resource, span) for s in ss.spans] for ss in rs.scope_spans]
    handed_on = any(type(s) is not DecodedSpan for spans in scopes for s in spans)
    return {
        "resource": {"attributes": resource_json(rs.resource.attributes) if handed_on else []},
        "scopeSpans": [{"spans": spans} for spans in scopes],
    }
