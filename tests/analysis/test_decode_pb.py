"""Spans read straight from OTLP protobuf (``_decode_pb``, what ``report --jaeger`` reads over gRPC) are the records
the OTLP-JSON decoder makes of the same spans' OTLP-JSON form: every value kind, labels, nesting past the bound,
and the malformed spans it skips, with the same reasons."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import Skipped, decode_resource_spans
from otel_agentloop.analysis._reading._decode import MAX_VALUE_DEPTH, TOO_DEEP, DecodedSpan
from otel_agentloop.analysis._reading._decode_pb import Resources, resource_spans
from otel_agentloop.analysis._reading._jaeger_grpc import _attributes, _span

TRACE, SPAN, PARENT = bytes(range(1, 17)), bytes(range(1, 9)), bytes(range(9, 17))


def _kv(key: str, value: AnyValue) -> KeyValue:
    return KeyValue(key=key, value=value)


def _add_nested(attributes: Any, levels: int) -> None:
    """A value ``levels`` arrays and key-value lists deep, added in place (upb parses about 50 at most)."""
    kv = attributes.add(key="deep" if levels > MAX_VALUE_DEPTH else "just")
    value = kv.value
    for i in range(levels):
        if i % 2:
            inner = value.kvlist_value.values.add(key=f"k{i}")
            value = inner.value
        else:
            value = value.array_value.values.add()
    value.string_value = "bottom"


def _add_attributes(attributes: Any) -> None:
    attributes.extend(_every_kind())
    _add_nested(attributes, MAX_VALUE_DEPTH + 3)
    _add_nested(attributes, MAX_VALUE_DEPTH)
    attributes.add(key="s").value.string_value = "last wins"


def _every_kind() -> list[KeyValue]:
    return [
        _kv("s", AnyValue(string_value="x")),
        _kv("i", AnyValue(int_value=-(1 << 63))),
        _kv("d", AnyValue(double_value=float("inf"))),
        _kv("b", AnyValue(bool_value=False)),
        _kv("raw", AnyValue(bytes_value=b"\x00\xff")),
        _kv("empty", AnyValue()),
        _kv("list", AnyValue(array_value={"values": [AnyValue(int_value=1), AnyValue(string_value="a")]})),
        _kv(
            "map",
            AnyValue(
                kvlist_value={
                    "values": [_kv(sc.RL_PHASE, AnyValue(array_value={"values": [AnyValue(bool_value=True)]}))]
                }
            ),
        ),
        _kv(
            sc.RL_PHASE, AnyValue(array_value={"values": [AnyValue(string_value="gen"), AnyValue(bytes_value=b"\x01")]})
        ),
        _kv(sc.GEN_AI_TOOL_NAME, AnyValue(kvlist_value={"values": [_kv("a", AnyValue(double_value=1.5))]})),
    ]


def _good(kind: int = 1, **fields: Any) -> Span:
    span = Span(
        trace_id=TRACE,
        span_id=SPAN,
        parent_span_id=PARENT,
        name="rl.sample",
        kind=kind,
        start_time_unix_nano=1_000,
        end_time_unix_nano=2_000,
        status={"code": 2, "message": "boom"},
        events=[Span.Event(name="e", time_unix_nano=1_500)],
        links=[Span.Link(trace_id=TRACE[::-1], span_id=SPAN[::-1])],
    )
    _add_attributes(span.attributes)
    _add_attributes(span.events[0].attributes)
    for name, value in fields.items():
        setattr(span, name, value)
    return span


def _message(spans: list[Span]) -> ResourceSpans:
    rs = ResourceSpans()
    rs.resource.attributes.append(_kv("service.name", AnyValue(array_value={"values": [AnyValue(int_value=3)]})))
    for part in (spans[:2], spans[2:]):
        scope = rs.scope_spans.add()
        for span in part:
            scope.spans.add().CopyFrom(span)
    return rs


def _json(rs: ResourceSpans) -> dict[str, Any]:
    """The OTLP-JSON form ``_jaeger_grpc`` made of a ``ResourceSpans`` before (and makes of a span it hands on)."""
    return {
        "resource": {"attributes": _attributes(rs.resource.attributes)},
        "scopeSpans": [{"spans": [_span(s) for s in ss.spans]} for ss in rs.scope_spans],
    }


def _both(rs: ResourceSpans) -> tuple[list[Any], Skipped, list[Any], Skipped]:
    direct, via_json = Skipped(), Skipped()
    records = list(decode_resource_spans([resource_spans(rs, _span, _attributes)], direct))
    expected = list(decode_resource_spans([_json(rs)], via_json))
    return records, direct, expected, via_json


def test_the_records_are_the_otlp_json_decoders() -> None:
    spans = [_good(kind) for kind in (0, 1, 2, 3, 4, 5, 6, 9)] + [_good(parent_span_id=b"", name="root")]
    spans[1].status.code = 1
    records, direct, expected, via_json = _both(_message(spans))
    assert records == expected and len(records) == len(spans)
    assert direct.count == via_json.count == 0
    first = records[0]
    assert first.attributes["deep"] == TOO_DEEP and first.attributes["just"] != TOO_DEEP
    assert first.attributes[sc.RL_PHASE] == '["gen", "01"]' and first.attributes["s"] == "last wins"
    assert first.resource == {"service.name": "[3]"} and first.error and first.parent_id
    assert [r.kind for r in records[:8]] == [0, 0, 1, 2, 3, 4, 4, 4]


@pytest.mark.parametrize(
    "fields",
    [
        {"trace_id": TRACE[:12]},
        {"span_id": SPAN[:5]},
        {"parent_span_id": PARENT + b"\x00"},
        {"end_time_unix_nano": 999},
        {"start_time_unix_nano": 1 << 63, "end_time_unix_nano": (1 << 64) - 1},
    ],
)
def test_a_span_the_otlp_json_decoder_skips_is_skipped_alike(fields: dict[str, Any]) -> None:
    spans = [_good(), _good(**fields), _good(span_id=SPAN[::-1])]
    records, direct, expected, via_json = _both(_message(spans))
    assert records == expected and len(records) == 2
    assert (direct.count, direct.first) == (via_json.count, via_json.first) and direct.count == 1


@pytest.mark.parametrize("which", ["event", "link"])
def test_a_bad_event_or_link_is_skipped_alike(which: str) -> None:
    bad = _good()
    if which == "event":
        bad.events[0].time_unix_nano = 1 << 63
    else:
        bad.links[0].trace_id = b"\x01\x02"
    records, direct, expected, via_json = _both(_message([_good(), bad]))
    assert records == expected and len(records) == 1
    assert (direct.count, direct.first) == (via_json.count, via_json.first) and direct.count == 1


def test_the_searches_read_a_decoded_spans_ids_and_start() -> None:
    entry = resource_spans(_message([_good()]), _span, _attributes)
    span = entry["scopeSpans"][0]["spans"][0]
    assert isinstance(span, DecodedSpan)
    assert dict(span) == {"traceId": TRACE.hex(), "spanId": SPAN.hex(), "startTimeUnixNano": 1_000}


def test_one_answers_spans_of_one_resource_share_its_dict() -> None:
    """Jaeger sends a trace per message, each with its resource: the spans of one process share one resource
    dict (as read alone), another resource gets its own, and the set of them is bounded."""
    resources = Resources()
    first, again = _message([_good()]), _message([_good(span_id=SPAN[::-1])])
    other = _message([_good()])
    other.resource.attributes.add(key="host.name").value.string_value = "b"
    a, b, c = (
        next(iter(decode_resource_spans([resource_spans(rs, _span, _attributes, resources)])))
        for rs in (first, again, other)
    )
    assert a.resource is b.resource and a.resource == next(iter(decode_resource_spans([_json(first)]))).resource
    assert c.resource is not a.resource and c.resource["host.name"] == "b"
    many = Resources()
    for i in range(Resources.MAX_RESOURCES + 10):
        rs = _message([_good()])
        rs.resource.attributes.add(key="n").value.int_value = i
        assert many.read(rs.resource)["n"] == i
    assert len(many._seen) <= Resources.MAX_RESOURCES
