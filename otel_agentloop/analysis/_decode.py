"""Reading stored spans: OTLP-JSON ``resourceSpans`` (the file exporters', Jaeger's ``api_v3``, protobuf's JSON
with base64 ids) into :class:`~otel_agentloop.metrics.SpanRecord`."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ..metrics._records import SpanRecord


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
        names = (
            "SPAN_KIND_UNSPECIFIED",
            "SPAN_KIND_INTERNAL",
            "SPAN_KIND_SERVER",
            "SPAN_KIND_CLIENT",
            "SPAN_KIND_PRODUCER",
            "SPAN_KIND_CONSUMER",
        )
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
                    links=tuple(
                        (_id(link.get("traceId"), 16), _id(link.get("spanId"), 8)) for link in s.get("links") or ()
                    ),
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
