"""Our OTLP encoders read the fast path's records (``FastSpan``) directly: the JSON they write for a record is the
JSON of the SDK span ``materialise`` builds from it, byte for byte, and the protobuf bytes parse (with the
official ``opentelemetry.proto`` classes) to the message the SDK's own ``encode_spans`` builds from the
materialised spans. The records are made by a real ``Recorder`` through the OpenTelemetry Span API, ended and
finalized as the export pipeline does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags, TraceState

from otel_agentloop.analysis import Skipped, read_jsonl
from otel_agentloop.core._door import materialise, to_record
from otel_agentloop.core._record import FastSpan
from otel_agentloop.export import _otlp_json, _otlp_proto
from tests._support.fast_path_parity import parse_json_line
from tests._support.fast_records import RESOURCE, VALUES, end_record, new_recorder, sample_records, start_record


def _door(spans: Any) -> list[FastSpan]:
    """The encoders take records: an SDK span (or one like it) adapted at the door, as the pipeline adapts it."""
    return [s if type(s) is FastSpan else to_record(s) for s in spans]


def _json(spans: Any) -> str:
    return _otlp_json.encode_spans(_door(spans))


def _json_request(spans: Any, end: str = "") -> tuple[bytes, int]:
    return _otlp_json.encode_request(_door(spans), end)


def _proto_request(spans: Any) -> tuple[bytes, int]:
    return _otlp_proto.encode_request(_door(spans))


def _over_limits() -> FastSpan:
    """A record past the count limits: dropped attributes and events are counted."""
    rec = new_recorder(max_span_attributes=4, max_events=2)
    span = start_record(rec, "busy", {"k0": 0}, context=trace.Context())
    for i in range(1, 9):
        span.set_attribute(f"k{i}", i)
    for i in range(5):
        span.add_event(f"e{i}", {"i": i})
    return end_record(rec, span)


def _parse(data: bytes) -> ExportTraceServiceRequest:
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(data)
    return msg


def _sdk_bytes(spans: list[Any]) -> bytes:
    return sdk_encode_spans(spans).SerializeToString()


# -- JSON -----------------------------------------------------------------------------------------------------
def test_json_of_a_record_is_the_json_of_its_materialised_span() -> None:
    records = sample_records()
    for span in records:
        assert _json([span]) == _json([materialise(span)]), span.name
    assert _json_request(records) == _json_request([materialise(s) for s in records])
    text = _json(records)
    assert '"bytesValue":"AP9yYXc="' in text and '"message":"ValueError: boom"' in text
    assert text.count('"parentSpanId"') == 4  # three children, and the one under a remote parent


def test_json_batch_mixing_records_and_sdk_spans_groups_them_by_resource() -> None:
    records = sample_records()
    provider = TracerProvider(resource=RESOURCE)
    with provider.get_tracer("user.code", "1.0").start_as_current_span("user span") as sdk_span:
        sdk_span.set_attribute("x", 1)
    mixed = [records[0], sdk_span, records[1]]
    text = _json(mixed)
    assert text == _json([materialise(records[0]), sdk_span, materialise(records[1])])
    assert text.count('"resource"') == 1 and text.count('"scope"') == 2


def _sdk_batch() -> list[Any]:
    """SDK spans carrying every field the encoders write: a trace state and remote parent, links (remote, over
    the link and link-attribute limits), events over the event and event-attribute limits, dropped attributes,
    a scope with attributes and a schema URL, a second resource, and an equal resource as a distinct object."""
    limits = SpanLimits(max_span_attributes=3, max_events=2, max_links=2, max_event_attributes=1, max_link_attributes=1)
    provider = TracerProvider(resource=RESOURCE, span_limits=limits)
    other = TracerProvider(resource=Resource({"service.name": "other"}, "https://opentelemetry.io/schemas/1.20.0"))
    same = TracerProvider(resource=Resource(dict(RESOURCE.attributes)))
    tracer = provider.get_tracer(
        "user.code", "1.0", schema_url="https://opentelemetry.io/schemas/1.21.0", attributes={"lib.attr": "x"}
    )
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1), trace_state=TraceState([("k", "v")]))
    links = [  # the oldest is dropped
        Link(SpanContext(0x3, 0x4, is_remote=False)),
        Link(SpanContext(0x5, 0x6, is_remote=False)),
        Link(SpanContext(0x1, 0x2, is_remote=True), {"a": 1, "b": 2}),
    ]
    ctx = trace.set_span_in_context(NonRecordingSpan(remote))
    with tracer.start_as_current_span("user span", ctx, attributes={"x": 1, "a": ["p", "q"]}, links=links) as user:
        for i in range(4):
            user.set_attribute(f"k{i}", i)
            user.add_event(f"ev{i}", {"k": b"b", "n": i})
        user.set_status(Status(StatusCode.ERROR, "bad"))
    with other.get_tracer("other").start_as_current_span("elsewhere", kind=trace.SpanKind.CLIENT) as elsewhere:
        pass
    with same.get_tracer("otel_agentloop", "9.9.9").start_as_current_span("twin") as twin:
        pass
    return [user, elsewhere, twin]


def test_json_of_records_parses_to_the_sdk_encoders_message() -> None:
    """Every field protobuf carries, OTLP-JSON carries: the JSON parses (protobuf's JSON mapping, hex ids) to
    the message the SDK's own encoder builds from the materialised spans."""
    records = sample_records()
    expected = sdk_encode_spans([materialise(s) for s in records])
    assert parse_json_line(_json(records)) == expected
    for span in records:
        assert parse_json_line(_json([span])) == sdk_encode_spans([materialise(span)]), span.name
    joined = json.loads(_json([records[4]]))["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert joined["traceState"] == "vendor=v1,rojo=00f067aa0ba902b7" and joined["flags"] == 0x300
    assert [link["flags"] for link in joined["links"]] == [0x100, 0x300, 0x100]
    assert [len(link["attributes"]) for link in joined["links"]] == [2, 0, 1]
    local = json.loads(_json([records[0]]))["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert "traceState" not in local and local["flags"] == 0x100


def test_json_of_sdk_spans_and_mixed_batches_matches_the_sdk() -> None:
    records = sample_records()
    user, elsewhere, twin = _sdk_batch()
    assert user.dropped_events == 2 and user.dropped_links == 1 and user.events[0].dropped_attributes == 1
    mixed = [records[0], user, elsewhere, records[1], twin, records[3]]
    expected = sdk_encode_spans([materialise(s) if type(s) is FastSpan else s for s in mixed])
    text = _json(mixed)
    assert parse_json_line(text) == expected
    assert len(expected.resource_spans) == 2 and len(expected.resource_spans[0].scope_spans) == 2
    request = json.loads(text)
    scope_spans = request["resourceSpans"][0]["scopeSpans"][1]
    assert scope_spans["schemaUrl"] == "https://opentelemetry.io/schemas/1.21.0"
    assert scope_spans["scope"]["attributes"] == [{"key": "lib.attr", "value": {"stringValue": "x"}}]
    assert request["resourceSpans"][1]["schemaUrl"] == "https://opentelemetry.io/schemas/1.20.0"
    got = scope_spans["spans"][0]
    # proto3 JSON spellings: lowerCamelCase, uint32 counts and flags as numbers, fixed64 times as strings
    assert (got["droppedAttributesCount"], got["droppedEventsCount"], got["droppedLinksCount"]) == (3, 2, 1)
    assert got["traceState"] == "k=v" and got["flags"] == 0x300 and isinstance(got["startTimeUnixNano"], str)
    assert [e.get("droppedAttributesCount") for e in got["events"]] == [1, 1]
    assert [link.get("droppedAttributesCount") for link in got["links"]] == [None, 1]
    assert [link["flags"] for link in got["links"]] == [0x100, 0x300]
    # the SDK's public read surface (a ReadableSpan-like object) gives the same JSON as its private fields
    assert _json([_PublicOnly(user)]) == _json([user])


class _PublicOnly:
    """A span exposing only ``ReadableSpan``'s public properties (another SDK version's span)."""

    def __init__(self, span: Any) -> None:
        self._span = span

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._span, name)


def test_json_counts_what_a_record_dropped() -> None:
    span = _over_limits()
    assert span.dropped_attributes == 5 and span.dropped_events == 3
    got = json.loads(_json([span]))["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert (got["droppedAttributesCount"], got["droppedEventsCount"]) == (5, 3)
    assert parse_json_line(_json([span])) == sdk_encode_spans([materialise(span)])


@pytest.mark.e2e  # a subprocess
def test_json_with_every_field_is_read_back_by_the_reader_and_report(tmp_path: Path) -> None:
    """``read_jsonl`` and ``report --file`` (a subprocess) read files carrying the new fields."""
    spans = [*sample_records(), *_sdk_batch()]
    path = tmp_path / "all.jsonl"
    data, skipped = _json_request(spans, "\n")
    assert skipped == 0
    path.write_bytes(data * 2)
    bad = Skipped()
    read = list(read_jsonl(str(path), bad))
    assert bad.count == 0 and len(read) == 2 * len(spans)
    assert sorted(r.name for r in read[: len(spans)]) == sorted(s.name for s in spans)
    joined = next(r for r in read if r.parent_id == 0xB7AD6B7169203331)
    assert joined.links == ((0x1234, 0x5678), (0x9ABC, 0xDEF0), (0x77, 0x88))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    proc = subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "report", "--file", str(path), "--runs"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "skipped" not in proc.stderr, proc.stderr
    assert "encode-test" in proc.stdout and "other" in proc.stdout, proc.stdout


# -- protobuf -------------------------------------------------------------------------------------------------
def test_proto_of_records_parses_to_the_sdk_encoders_message() -> None:
    records = sample_records()
    data, skipped = _proto_request(records)
    assert skipped == 0
    materialised = [materialise(s) for s in records]
    expected = sdk_encode_spans(materialised)
    got = _parse(data)
    assert got == expected
    assert data == expected.SerializeToString()  # even the bytes: every field in field-number order
    spans = got.resource_spans[0].scope_spans[0].spans
    joined = spans[4]
    assert joined.trace_state == "vendor=v1,rojo=00f067aa0ba902b7" and joined.flags == 0x300
    assert [len(link.attributes) for link in joined.links] == [2, 0, 1] and joined.links[1].flags == 0x300
    assert spans[1].status.code == 2 and spans[1].status.message == "ValueError: boom"
    assert spans[1].events[0].name == "exception"
    assert {kv.key for kv in spans[0].attributes} >= set(VALUES)
    assert spans[5].name == "" and not spans[5].attributes


def test_proto_of_one_record_at_a_time_matches_too() -> None:
    for span in sample_records():
        assert _proto_request([span])[0] == _sdk_bytes([materialise(span)]), span.name


def test_proto_of_sdk_spans_and_mixed_batches_matches_the_sdk() -> None:
    records = sample_records()
    provider = TracerProvider(resource=RESOURCE)
    other = TracerProvider(resource=Resource({"service.name": "other"}))
    tracer = provider.get_tracer("user.code", "1.0", schema_url="https://opentelemetry.io/schemas/1.21.0")
    with tracer.start_as_current_span("user span", attributes={"x": 1, "a": ["p", "q"]}) as user:
        user.add_event("ev", {"k": b"b"})
        user.set_status(Status(StatusCode.ERROR, "bad"))
    with other.get_tracer("other").start_as_current_span("elsewhere", kind=trace.SpanKind.CLIENT) as elsewhere:
        pass
    # the same resource as an equal, distinct object: grouped with the records' (the SDK groups by equality)
    same = TracerProvider(resource=Resource(dict(RESOURCE.attributes)))
    with same.get_tracer("otel_agentloop", "9.9.9").start_as_current_span("twin") as twin:
        pass
    mixed = [records[0], user, elsewhere, records[1], twin, records[3]]
    expected = [materialise(s) if type(s) is FastSpan else s for s in mixed]
    data, skipped = _proto_request(mixed)
    assert skipped == 0
    assert _parse(data) == sdk_encode_spans(expected)
    assert data == _sdk_bytes(expected)
    assert len(_parse(data).resource_spans) == 2
    assert len(_parse(data).resource_spans[0].scope_spans) == 2


def test_proto_counts_what_a_record_dropped_as_an_sdk_span_does() -> None:
    span = _over_limits()
    provider = TracerProvider(resource=RESOURCE, span_limits=SpanLimits(max_span_attributes=4, max_events=2))
    with provider.get_tracer("t").start_as_current_span("busy", attributes={"k0": 0}) as sdk_span:
        for i in range(1, 9):
            sdk_span.set_attribute(f"k{i}", i)
        for i in range(5):
            sdk_span.add_event(f"e{i}", {"i": i})
    got = _parse(_proto_request([span])[0]).resource_spans[0].scope_spans[0].spans[0]
    want = sdk_encode_spans([sdk_span]).resource_spans[0].scope_spans[0].spans[0]
    assert got.dropped_attributes_count == want.dropped_attributes_count == 5
    assert got.dropped_events_count == want.dropped_events_count == 3
    assert [kv.key for kv in got.attributes] == [kv.key for kv in want.attributes]
    assert [e.name for e in got.events] == [e.name for e in want.events]


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        (1 << 63, False),  # outside int64: the SDK drops the key too
        ([1, 1 << 64], False),
        ({"nested": "map", "n": 1}, True),
        (None, True),
        (bytearray(b"ab"), True),
    ],
)
def test_proto_values_the_sdk_cleaning_lets_through(value: Any, kept: bool) -> None:
    """Values a record can hold when written past the SDK's cleaning (the hot path takes attributes by
    reference): each is encoded as the SDK's encoder encodes it, or its key dropped as the SDK drops it."""
    rec = new_recorder()
    span = end_record(rec, start_record(rec, "odd", {"v": value, "ok": 1}, context=trace.Context()))
    got = _parse(_proto_request([span])[0]).resource_spans[0].scope_spans[0].spans[0]
    assert [kv.key for kv in got.attributes] == (["v", "ok"] if kept else ["ok"])
    # the SDK's own encoder, on the record's attributes as they are
    from opentelemetry.exporter.otlp.proto.common._internal import _encode_attributes

    assert list(got.attributes) == _encode_attributes(span.attributes)


def test_proto_repairs_lone_surrogates_and_skips_only_a_broken_span() -> None:
    rec = new_recorder()
    bad = start_record(rec, "tool \udce9", {"k\udce9": "v\udce9", "ok": 1}, context=trace.Context())
    bad = end_record(rec, bad)
    broken = end_record(rec, start_record(rec, "broken", {}, context=trace.Context()))
    broken.status = None  # type: ignore[assignment]  # a span no encoder can read
    good = end_record(rec, start_record(rec, "good", {}, context=trace.Context()))
    data, skipped = _proto_request([bad, broken, good])
    assert skipped == 1
    spans = _parse(data).resource_spans[0].scope_spans[0].spans
    assert [s.name for s in spans] == ["tool \ufffd", "good"]
    assert spans[0].attributes[0].key == "k\ufffd" and spans[0].attributes[0].value.string_value == "v\ufffd"
