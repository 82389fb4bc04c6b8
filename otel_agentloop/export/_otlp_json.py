"""OTLP-JSON encoding, without protobuf (decoding: :mod:`otel_agentloop.analysis._decode`).

The encoder writes the OTLP/JSON mapping the Collector's file exporter writes (hex ids, int64 as strings,
enums as integers): one ``{"resourceSpans": [...]}`` object per export, built as a string directly. Export
shares the GIL with training, so this matters. Per span on a 2-core EPYC: dicts + ``json.dumps`` ~77 us (as
much as protobuf's ``json_format``), the SDK's protobuf encoder ~150 us, these strings ~23 us.

It encodes records (:class:`~otel_agentloop.core._record.FastSpan`, from their fields: no SDK span is built;
an SDK span is adapted into one at ``core._door``); a record encodes to the same bytes as the SDK span
``core._door.materialise`` builds from it. Every field the protobuf encoder (:mod:`._otlp_proto`) writes
is written, as protobuf's JSON mapping spells it (``traceState``, span and link ``flags``, the dropped
attribute, event and link counts, scope attributes, schema URLs; uint32 as numbers, fixed64 times as strings),
grouped by resource and scope as it groups them: the JSON parses to the same ``ExportTraceServiceRequest``.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Mapping, Sequence
from json.encoder import encode_basestring
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, StatusCode, TraceState

from ..core._guard import internal_error
from ..core._record import Event, FastSpan
from ..core._values import plain_attributes
from ._clean import clean_text
from ._groups import Groups, KeyHeads

_STATUS = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}
_quote: Callable[[str], str] = encode_basestring  # C-accelerated JSON string quoting
_key_heads: KeyHeads[str] = KeyHeads(lambda key: '{"key":' + _quote(key) + ',"value":')


_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200  # SpanFlags


def _double(v: float) -> str:
    if math.isfinite(v):
        return f'{{"doubleValue":{float.__repr__(v)}}}'
    return '{"doubleValue":"' + ("NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")) + '"}'


def _value(v: Any) -> str | None:  # Any: an attribute value (the user's), dispatched on its exact type
    """One attribute value as OTLP-JSON ``AnyValue``, typed as the OTLP protobuf encoder types it (subclasses
    of bool/int/float/str such as ``np.float64`` keep their type, mappings are ``kvlistValue``, ``None`` is the
    empty value); ``None`` when protobuf cannot encode it either (an int outside int64): the key is dropped."""
    t = type(v)
    if t is str:
        return '{"stringValue":' + _quote(v) + "}"
    if t is bool:
        return '{"boolValue":true}' if v else '{"boolValue":false}'
    if t is int:
        return f'{{"intValue":"{v}"}}' if _I64_MIN <= v <= _I64_MAX else None
    if t is float:
        return _double(v)
    if t is tuple or t is list:
        values = [_value(x) for x in v]
        return None if None in values else '{"arrayValue":{"values":[' + ",".join(values) + "]}}"  # type: ignore[arg-type]
    if v is None:
        return "{}"
    return _other(v)


def _other(v: object) -> str | None:
    try:
        if isinstance(v, bool):
            return '{"boolValue":true}' if v else '{"boolValue":false}'
        if isinstance(v, int):
            n = int.__index__(v)
            return f'{{"intValue":"{n}"}}' if _I64_MIN <= n <= _I64_MAX else None
        if isinstance(v, float):
            return _double(v)
        if isinstance(v, str):
            return '{"stringValue":' + _quote(str.__str__(v)) + "}"
        if isinstance(v, (bytes, bytearray)):
            return '{"bytesValue":"' + base64.b64encode(v).decode() + '"}'
        if isinstance(v, Mapping):
            return '{"kvlistValue":{"values":' + _attrs(v) + "}}"
        if isinstance(v, Sequence):
            values = [_value(x) for x in v]
            return None if None in values else '{"arrayValue":{"values":[' + ",".join(values) + "]}}"  # type: ignore[arg-type]
        return '{"stringValue":' + _quote(str(v)) + "}"
    except Exception:
        return None


def _attrs(attrs: Mapping[str, object] | None) -> str:
    """``attrs`` as a JSON ``KeyValue`` list; items that cannot be encoded are left out."""
    if not attrs:
        return "[]"
    heads = _key_heads
    return "[" + ",".join([heads[k] + value + "}" for k, v in attrs.items() if (value := _value(v)) is not None]) + "]"


def _dropped(count: int) -> str:
    """The ``droppedAttributesCount`` member (``""`` when none were dropped, as protobuf leaves out a 0)."""
    return f',"droppedAttributesCount":{count}' if count else ""


def _flags(remote: bool) -> int:
    """Span and link ``flags``: the SDK always says whether the parent (the linked span) is remote."""
    return _HAS_IS_REMOTE | _IS_REMOTE if remote else _HAS_IS_REMOTE


def _event_json(name: str, ts: int, attributes: Mapping[str, object] | None, dropped: int) -> str:
    return f'{{"timeUnixNano":"{ts}","name":{_quote(name)},"attributes":{_attrs(attributes)}{_dropped(dropped)}}}'


def _record_events(events: Sequence[Event]) -> str:
    """A fast-path record's events: ``(name, attributes, time_ns, dropped_attributes)``."""
    return ',"events":[' + ",".join(_event_json(name, ts, attrs, dropped) for name, attrs, ts, dropped in events) + "]"


def _links(links: Sequence[Link]) -> str:
    """The ``links`` member (the SDK writes no link trace state)."""
    return (
        ',"links":['
        + ",".join(
            f'{{"traceId":"{link.context.trace_id:032x}","spanId":"{link.context.span_id:016x}",'
            f'"attributes":{_attrs(plain_attributes(link.attributes))}{_dropped(link.dropped_attributes)},'
            f'"flags":{_flags(link.context.is_remote)}}}'
            for link in links
        )
        + "]"
    )


def _trace_state(state: TraceState | None) -> str:
    """The ``traceState`` member: the W3C header form, as the protobuf encoders write it."""
    if not state:
        return ""
    text = ",".join(f"{k}={v}" for k, v in state.items())
    return f'"traceState":{_quote(text)},' if text else ""


def _span(f: FastSpan) -> str:
    """One record as OTLP-JSON: every field the protobuf encoder writes (:mod:`._otlp_proto`), in field-number
    order as protobuf's JSON writes them."""
    out = f'{{"traceId":"{f.trace_id:032x}","spanId":"{f.span_id:016x}",' + _trace_state(f.trace_state)
    if f.parent_id:
        out += f'"parentSpanId":"{f.parent_id:016x}",'
    # SDK SpanKind INTERNAL=0 ...; OTLP SPAN_KIND_INTERNAL=1 ...
    out += (
        f'"name":{_quote(f.name)},"kind":{f.kind_value + 1},"startTimeUnixNano":"{f.start_ns or 0}",'
        f'"endTimeUnixNano":"{f.end_ns or 0}","attributes":{_attrs(f.attributes)}{_dropped(f.dropped_attributes)}'
    )
    if f.events:
        out += _record_events(f.events)
    if f.dropped_events:
        out += f',"droppedEventsCount":{f.dropped_events}'
    if f.links:
        out += _links(f.links)
    if f.dropped_links:
        out += f',"droppedLinksCount":{f.dropped_links}'
    status = f.status
    code, description = _STATUS[status.status_code], status.description
    if description:
        out += f',"status":{{"message":{_quote(description)},"code":{code}}}'
    else:
        out += f',"status":{{"code":{code}}}'
    return out + f',"flags":{_flags(f.parent_remote)}}}'


def _scope_json(scope: InstrumentationScope | None, spans: list[str]) -> str:
    """One ``scopeSpans`` entry (InstrumentationScope: name, version, attributes; then the schema URL)."""
    head = ""
    if scope is not None:
        head = f'"name":{_quote(str(scope.name or ""))},"version":{_quote(str(scope.version or ""))}'
        attributes = plain_attributes(getattr(scope, "attributes", None))
        if attributes:
            head += f',"attributes":{_attrs(attributes)}'
    schema = getattr(scope, "schema_url", None) if scope is not None else None
    tail = f',"schemaUrl":{_quote(str(schema))}' if schema else ""
    return f'{{"scope":{{{head}}},"spans":[{",".join(spans)}]{tail}}}'


def _resource_json(resource: Resource | None, scopes: list[tuple[InstrumentationScope | None, list[str]]]) -> str:
    """One ``resourceSpans`` entry."""
    try:
        attributes = _attrs(plain_attributes(resource.attributes) if resource is not None else None)
    except Exception:
        internal_error("otlp_json.encode resource")
        attributes = "[]"
    schema = getattr(resource, "schema_url", None) if resource is not None else None
    tail = f',"schemaUrl":{_quote(str(schema))}' if schema else ""
    scope_json = ",".join(_scope_json(scope, spans) for scope, spans in scopes)
    return f'{{"resource":{{"attributes":{attributes}}},"scopeSpans":[{scope_json}]{tail}}}'


def _encode(spans: Sequence[FastSpan]) -> tuple[str, int]:
    """The request as text, and how many spans were left out because they could not be encoded at all (each
    span is encoded on its own: one broken span never costs the batch). Grouped by resource and scope as the
    protobuf encoder groups them."""
    groups: Groups[str] = Groups()
    skipped = 0
    for s in spans:
        try:
            span_json = _span(s)
            recorder = s.recorder
            groups.spans_of(recorder.resource, recorder.scope).append(span_json)
        except Exception:
            skipped += 1
            internal_error("otlp_json.encode (the span is dropped and counted)")
    resources = [_resource_json(resource, scopes) for resource, scopes in groups.resources]
    return '{"resourceSpans":[' + ",".join(resources) + "]}", skipped


def encode_spans(spans: Sequence[FastSpan]) -> str:
    """One OTLP ``ExportTraceServiceRequest`` as a single line of OTLP-JSON, grouped by resource and scope;
    spans that cannot be encoded are left out (see :func:`encode_request`)."""
    return _encode(spans)[0]


def encode_request(spans: Sequence[FastSpan], end: str = "") -> tuple[bytes, int]:
    """The request as UTF-8 (``end`` appended), and the number of spans left out because they could not be
    encoded. Never raises on user text: a lone surrogate anywhere (span or event name, attribute key or value,
    nested ones too, status message, resource, scope) becomes U+FFFD; the repair runs only when the plain
    encode fails."""
    text, skipped = _encode(spans)
    text += end
    try:
        return text.encode("utf-8"), skipped
    except UnicodeEncodeError:
        return clean_text(text).encode("utf-8"), skipped


def encode_line(spans: Sequence[FastSpan]) -> tuple[bytes, int]:
    """:func:`encode_request` ending in a newline: one line of an OTLP-JSON lines file."""
    return encode_request(spans, "\n")
