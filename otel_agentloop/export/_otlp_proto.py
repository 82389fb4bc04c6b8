"""OTLP protobuf encoding without protobuf objects: ``ExportTraceServiceRequest`` bytes written directly.

The SDK's encoder builds a protobuf object per span, attribute and value, then serializes them (~150 us a span
on a 2-core EPYC, on the export thread, which shares the GIL with training). This module writes the wire format
itself: varints, length-delimited nested messages, fixed64 times, fixed32 flags, every field in field-number
order as protobuf serializes it. The result is the bytes ``encode_spans(spans).SerializeToString()`` gives
(the same message: the tests parse both with the official classes and compare), grouped by resource and
instrumentation scope as the SDK's ``trace_encoder.encode_spans`` groups them (equal resources and scopes
share one entry, in the order first seen).

It encodes records (:class:`~otel_agentloop.core._record.FastSpan`, from their fields: no SDK span is built;
an SDK span is adapted into one at ``core._door``). Values are typed as the SDK types them (``bool`` before ``int``,
subclasses such as ``np.float64`` by ``isinstance``; sequences as arrays, mappings as key-value lists,
``None`` as the empty value); a value the SDK cannot encode either (an int outside int64, an unknown type)
drops its key, as the SDK does (without its logged traceback). Text UTF-8 cannot encode (lone surrogates) is
written with U+FFFD (:func:`~otel_agentloop.export._clean.clean_text`); a span that cannot be encoded at all
is left out and counted (:func:`encode_request`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, StatusCode

from ..core._guard import internal_error, warn_once
from ..core._record import FastSpan
from ..core._values import plain_attributes
from ._clean import clean_text
from ._groups import Groups, KeyHeads

_fixed64: Callable[[int], bytes] = struct.Struct("<Q").pack
_fixed32: Callable[[int], bytes] = struct.Struct("<I").pack
_double: Callable[[float], bytes] = struct.Struct("<d").pack
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_U64 = (1 << 64) - 1
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200  # SpanFlags: the SDK always says whether the parent is remote
_CODES = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}


def _varint_slow(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [_varint_slow(n) for n in range(1 << 14)]


def _varint(n: int) -> bytes:
    """``n`` (non-negative) as a protobuf varint."""
    return _SMALL[n] if n < 16384 else _varint_slow(n)


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: U+FFFD, as every exporter gets them (export._clean)
        return clean_text(text).encode("utf-8")


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: ``tag`` (one byte, already shifted), length, payload."""
    return tag + _varint(len(payload)) + payload


def _key_head(key: str) -> bytes:
    """A ``KeyValue``'s key field and the value field's tag."""
    encoded = _utf8(key)
    return b"\x0a" + _varint(len(encoded)) + encoded + b"\x12"


_key_heads: KeyHeads[bytes] = KeyHeads(_key_head)


# -- attributes (common.proto: KeyValue 1 key, 2 value; AnyValue 1 string, 2 bool, 3 int, 4 double, 5 array,
# 6 kvlist, 7 bytes) ------------------------------------------------------------------------------------------
_TRUE, _FALSE = b"\x10\x01", b"\x10\x00"


def _value(v: Any) -> bytes | None:  # Any: an attribute value (the user's), dispatched on its exact type
    """``v`` as an ``AnyValue`` message body; ``None`` when the SDK cannot encode it either."""
    t = type(v)
    if t is str:
        b = _utf8(v)
        return b"\x0a" + _varint(len(b)) + b
    if t is bool:
        return _TRUE if v else _FALSE
    if t is int:
        return b"\x18" + _varint(v & _U64) if _I64_MIN <= v <= _I64_MAX else None
    if t is float:
        return b"\x21" + _double(v)
    return _other(v)


def _other(v: object) -> bytes | None:
    """The SDK's ``_encode_value`` order for anything not of an exact scalar type."""
    try:
        if v is None:
            return b""
        if isinstance(v, bool):
            return _TRUE if v else _FALSE
        if isinstance(v, str):
            b = _utf8(str.__str__(v))
            return b"\x0a" + _varint(len(b)) + b
        if isinstance(v, int):
            n = int.__index__(v)
            return b"\x18" + _varint(n & _U64) if _I64_MIN <= n <= _I64_MAX else None
        if isinstance(v, float):
            return b"\x21" + _double(float(v))
        if isinstance(v, bytes):
            return b"\x3a" + _varint(len(v)) + bytes(v)
        if isinstance(v, Sequence):
            parts = []
            for x in v:
                item = _value(x)
                if item is None:
                    return None
                parts.append(b"\x0a" + _varint(len(item)) + item)
            return _field(b"\x2a", b"".join(parts))
        if isinstance(v, Mapping):
            return _field(b"\x32", _key_values(v, b"\x0a"))
    except Exception:
        return None
    return None


def _key_values(attrs: Mapping[str, object] | None, tag: bytes) -> bytes:
    """Each item of ``attrs`` as a ``KeyValue`` field ``tag``; items that cannot be encoded are left out."""
    if not attrs:
        return b""
    heads = _key_heads
    return b"".join(
        [
            tag + _varint(len(kv)) + kv
            for k, v in attrs.items()
            if (value := _value(v)) is not None
            for kv in [heads[k] + _varint(len(value)) + value]
        ]
    )


# -- spans: events, links, the span ----------------------------------------------------------------------------
def _event(name: str, attributes: Mapping[str, object] | None, ts: int, dropped: int) -> bytes:
    """One ``events`` field (Event: 1 time, 2 name, 3 attributes, 4 dropped_attributes_count)."""
    body = b"\x09" + _fixed64(ts) if ts else b""
    if name:
        body += _field(b"\x12", _utf8(name))
    body += _key_values(attributes, b"\x1a")
    if dropped:
        body += b"\x20" + _varint(dropped)
    return _field(b"\x5a", body)


def _links(links: Sequence[Link]) -> bytes:
    """The ``links`` fields (Link: 1 trace_id, 2 span_id, 4 attributes, 5 dropped_attributes_count, 6 flags;
    the SDK writes no link trace_state)."""
    parts = []
    for link in links:
        ctx = link.context
        body = b"\x0a\x10" + ctx.trace_id.to_bytes(16, "big") + b"\x12\x08" + ctx.span_id.to_bytes(8, "big")
        body += _key_values(plain_attributes(link.attributes), b"\x22")
        dropped = link.dropped_attributes
        if dropped:
            body += b"\x28" + _varint(dropped)
        body += b"\x35" + _fixed32(_HAS_IS_REMOTE | _IS_REMOTE if ctx.is_remote else _HAS_IS_REMOTE)
        parts.append(_field(b"\x6a", body))
    return b"".join(parts)


# trace.proto Span: 1 trace_id, 2 span_id, 3 trace_state, 4 parent_span_id, 5 name, 6 kind, 7 start,
# 8 end, 9 attributes, 10 dropped_attributes_count, 11 events, 12 dropped_events_count, 13 links,
# 14 dropped_links_count, 15 status, 16 flags.
def _record(f: FastSpan) -> bytes:
    """One ``Span`` message body, from a record's fields (its values were bounded when written, or by the SDK)."""
    out = [b"\x0a\x10", f.trace_id.to_bytes(16, "big"), b"\x12\x08", f.span_id.to_bytes(8, "big")]
    if f.trace_state:
        state = _utf8(",".join(f"{k}={v}" for k, v in f.trace_state.items()))
        if state:
            out.append(_field(b"\x1a", state))
    if f.parent_id:
        out += (b"\x22\x08", f.parent_id.to_bytes(8, "big"))
    if f.name:
        out.append(_field(b"\x2a", _utf8(f.name)))
    out += (b"\x30", _varint(f.kind_value + 1))  # SDK SpanKind INTERNAL=0 ...; OTLP SPAN_KIND_INTERNAL=1 ...
    if f.start_ns:
        out += (b"\x39", _fixed64(f.start_ns))
    if f.end_ns:
        out += (b"\x41", _fixed64(f.end_ns))
    if f.attributes:
        out.append(_key_values(f.attributes, b"\x4a"))
    if f.dropped_attributes:
        out += (b"\x50", _varint(f.dropped_attributes))
    if f.events:
        out += [_event(name, attrs, ts, dropped) for name, attrs, ts, dropped in f.events]
    if f.dropped_events:
        out += (b"\x60", _varint(f.dropped_events))
    if f.links:
        out.append(_links(f.links))
    if f.dropped_links:
        out += (b"\x70", _varint(f.dropped_links))
    status = f.status
    code, description = _CODES[status.status_code], status.description
    body = _field(b"\x12", _utf8(description)) if description else b""
    if code:
        body += b"\x18" + _varint(code)
    out += (b"\x7a", _varint(len(body)), body)
    out += (b"\x85\x01", _fixed32(_HAS_IS_REMOTE | _IS_REMOTE if f.parent_remote else _HAS_IS_REMOTE))
    return b"".join(out)


# -- the request (ExportTraceServiceRequest 1 resource_spans; ResourceSpans 1 resource, 2 scope_spans,
# 3 schema_url; ScopeSpans 1 scope, 2 spans, 3 schema_url; Resource 1 attributes; InstrumentationScope 1 name,
# 2 version, 3 attributes) -----------------------------------------------------------------------------------
def _resource(resource: Resource | None) -> bytes:
    body = _key_values(plain_attributes(resource.attributes), b"\x0a") if resource is not None else b""
    return _field(b"\x0a", body)


def _scope(scope: InstrumentationScope | None) -> bytes:
    body = b""
    if scope is not None:
        if scope.name:
            body += _field(b"\x0a", _utf8(scope.name))
        if scope.version:
            body += _field(b"\x12", _utf8(scope.version))
        body += _key_values(plain_attributes(scope.attributes), b"\x1a")
    return _field(b"\x0a", body)


def _encode_groups(groups: Groups[bytes]) -> bytes:
    """The ``resource_spans`` fields of one request: each resource, its scopes, their encoded spans."""
    out = []
    for resource, scopes in groups.resources:
        body = [_resource(resource)]
        for scope, spans in scopes:
            scope_body = _scope(scope) + b"".join(spans)
            schema = getattr(scope, "schema_url", None) if scope is not None else None
            if schema:
                scope_body += _field(b"\x1a", _utf8(schema))
            body.append(_field(b"\x12", scope_body))
        schema = getattr(resource, "schema_url", None) if resource is not None else None
        if schema:
            body.append(_field(b"\x1a", _utf8(schema)))
        out.append(_field(b"\x0a", b"".join(body)))
    return b"".join(out)


def encode_request(spans: Sequence[FastSpan]) -> tuple[bytes, int]:
    """One serialized ``ExportTraceServiceRequest`` for ``spans``, and how many spans were left out because
    they could not be encoded at all (each span is encoded on its own: one broken span never costs the
    batch). Never raises."""
    groups: Groups[bytes] = Groups()
    skipped = 0
    for s in spans:
        try:
            recorder = s.recorder
            body = _record(s)
            groups.spans_of(recorder.resource, recorder.scope).append(b"\x12" + _varint(len(body)) + body)
        except Exception:
            skipped += 1
            internal_error("otlp_proto.encode (the span is dropped and counted)")
    try:
        return _encode_groups(groups), skipped
    except Exception:
        internal_error("otlp_proto.encode")
        return b"", len(spans)


def rejected(answer: bytes) -> tuple[int, str] | None:
    """An ``ExportTraceServiceResponse``'s partial success, ``(rejected_spans, error_message)``; ``None`` when the
    answer reports none or does not parse."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    try:
        partial = ExportTraceServiceResponse.FromString(answer).partial_success
    except Exception:
        return None
    if not (partial.rejected_spans or partial.error_message):
        return None
    return int(partial.rejected_spans), str(partial.error_message)


def warn_rejected(answer: bytes, endpoint: str) -> None:
    """Warn (once per endpoint) when the receiver accepted only part of a request."""
    partial = rejected(answer)
    if partial is not None:
        count, message = partial
        warn_once(
            f"otlp-partial-success:{endpoint}",
            "otel_agentloop: the OTLP receiver at %s rejected %d span(s) of an export: %s",
            endpoint,
            count,
            message or "(no message)",
        )
