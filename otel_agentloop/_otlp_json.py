"""OTLP-JSON encoding and decoding, without protobuf.

The encoder writes the OTLP/JSON mapping the Collector's file exporter writes (hex ids, int64 as strings,
enums as integers): one ``{"resourceSpans": [...]}`` object per export. Building plain dicts directly is
several times cheaper than protobuf's ``json_format`` (which costs ~75 us per span here), and export shares
the GIL with training. The decoder reads the same layout, also from Jaeger's ``api_v3`` and from protobuf's
JSON (base64 ids), into :class:`SpanRecord`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from ._records import SpanRecord

_STATUS = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}


def _value(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, str):
        return {"stringValue": v}
    if isinstance(v, (bytes, bytearray)):
        return {"bytesValue": base64.b64encode(v).decode()}
    if isinstance(v, (list, tuple)):
        return {"arrayValue": {"values": [_value(x) for x in v]}}
    return {"stringValue": str(v)}


def _attrs(attrs: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return [{"key": k, "value": _value(v)} for k, v in (attrs or {}).items()]


def _span(s: ReadableSpan) -> dict[str, Any]:
    ctx = s.context
    out: dict[str, Any] = {
        "traceId": format(ctx.trace_id, "032x") if ctx else "",
        "spanId": format(ctx.span_id, "016x") if ctx else "",
        "name": s.name,
        "kind": s.kind.value + 1,  # SDK INTERNAL=0 .. ; OTLP SPAN_KIND_INTERNAL=1 ..
        "startTimeUnixNano": str(s.start_time or 0),
        "endTimeUnixNano": str(s.end_time or 0),
        "attributes": _attrs(s.attributes),
        "status": {"code": _STATUS[s.status.status_code]},
    }
    if s.parent is not None:
        out["parentSpanId"] = format(s.parent.span_id, "016x")
    if s.status.description:
        out["status"]["message"] = s.status.description
    if s.events:
        out["events"] = [
            {"name": e.name, "timeUnixNano": str(e.timestamp), "attributes": _attrs(e.attributes)} for e in s.events
        ]
    if s.links:
        out["links"] = [
            {"traceId": format(link.context.trace_id, "032x"), "spanId": format(link.context.span_id, "016x"),
             "attributes": _attrs(link.attributes)}
            for link in s.links
        ]
    dropped = s.dropped_attributes
    if dropped:
        out["droppedAttributesCount"] = dropped
    return out


def encode_spans(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """One OTLP ``ExportTraceServiceRequest`` as a JSON-ready dict, grouped by resource and scope."""
    by_resource: dict[int, tuple[Any, dict[tuple[str, str], list[dict[str, Any]]]]] = {}
    for s in spans:
        entry = by_resource.get(id(s.resource))
        if entry is None:
            entry = by_resource[id(s.resource)] = (s.resource, {})
        scope = s.instrumentation_scope
        key = (scope.name, scope.version or "") if scope is not None else ("", "")
        entry[1].setdefault(key, []).append(_span(s))
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _attrs(resource.attributes if resource is not None else None)},
                "scopeSpans": [
                    {"scope": {"name": name, "version": version}, "spans": spans_json}
                    for (name, version), spans_json in scopes.items()
                ],
            }
            for resource, scopes in by_resource.values()
        ]
    }


def dumps(request: Mapping[str, Any]) -> str:
    """Compact single-line JSON (one export per line)."""
    return json.dumps(request, separators=(",", ":"), ensure_ascii=False)


# -- decoding ---------------------------------------------------------------------------------------
def _id(raw: Any, nbytes: int) -> int:
    if not raw:
        return 0
    text = str(raw)
    if len(text) == 2 * nbytes:
        try:
            return int(text, 16)
        except ValueError:
            pass
    try:
        return int.from_bytes(base64.b64decode(text), "big")
    except (binascii.Error, ValueError):
        return 0


def _decode_value(v: Mapping[str, Any]) -> Any:
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return tuple(_decode_value(x) for x in v["arrayValue"].get("values", []))
    if "bytesValue" in v:
        return base64.b64decode(v["bytesValue"])
    if "kvlistValue" in v:
        return {kv["key"]: _decode_value(kv.get("value", {})) for kv in v["kvlistValue"].get("values", [])}
    return None


def _decode_attrs(items: Iterable[Mapping[str, Any]] | None) -> dict[str, Any]:
    return {kv["key"]: _decode_value(kv.get("value", {})) for kv in items or ()}


def _status_code(raw: Any) -> int:
    if isinstance(raw, str):  # protobuf JSON may spell enums by name
        return {"STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}.get(raw, 0)
    return int(raw or 0)


def _kind(raw: Any) -> int:
    if isinstance(raw, str):
        names = ("SPAN_KIND_UNSPECIFIED", "SPAN_KIND_INTERNAL", "SPAN_KIND_SERVER", "SPAN_KIND_CLIENT",
                 "SPAN_KIND_PRODUCER", "SPAN_KIND_CONSUMER")
        raw = names.index(raw) if raw in names else 1
    return max(int(raw or 1) - 1, 0)  # back to the SDK's SpanKind value


def decode_resource_spans(resource_spans: Iterable[Mapping[str, Any]]) -> Iterator[SpanRecord]:
    """Spans of OTLP-JSON ``resourceSpans`` entries (also accepts the legacy ``instrumentationLibrarySpans``)."""
    for rs in resource_spans:
        resource = _decode_attrs(rs.get("resource", {}).get("attributes"))
        for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ():
            for s in ss.get("spans", ()):
                status = s.get("status") or {}
                yield SpanRecord(
                    trace_id=_id(s.get("traceId"), 16),
                    span_id=_id(s.get("spanId"), 8),
                    parent_id=_id(s.get("parentSpanId"), 8),
                    name=s.get("name", ""),
                    start_ns=int(s.get("startTimeUnixNano") or 0),
                    end_ns=int(s.get("endTimeUnixNano") or 0),
                    attributes=_decode_attrs(s.get("attributes")),
                    error=_status_code(status.get("code")) == 2,
                    status_message=status.get("message", ""),
                    kind=_kind(s.get("kind")),
                    resource=resource,
                    events=tuple(
                        (e.get("name", ""), int(e.get("timeUnixNano") or 0), _decode_attrs(e.get("attributes")))
                        for e in s.get("events") or ()
                    ),
                    links=tuple((_id(link.get("traceId"), 16), _id(link.get("spanId"), 8))
                                for link in s.get("links") or ()),
                )


def read_jsonl(path: str) -> Iterator[SpanRecord]:
    """Spans of an OTLP-JSON-lines file (ours, or the Collector file exporter's). Bad lines are skipped."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            yield from decode_resource_spans(obj.get("resourceSpans", ()))
