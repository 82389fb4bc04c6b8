"""One scenario exported over OTLP/HTTP to a real receiver on each span path (fast and SDK), and the check that
both paths sent the same spans (ids, times and flags aside)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry.proto.trace.v1 import trace_pb2

import otel_agentloop as oal
from tests._support.fast_path_parity import RawReceiver
from tests._support.otlp_receiver import start_grpc, wait_for

PATHS = (True, False)  # fast_path


@dataclass
class Exported:
    """What one run sent over gRPC: its spans by name, the handle's stats, the scenario's result."""

    spans: dict[str, trace_pb2.Span]
    stats: dict[str, int]
    result: Any


def export(fast: bool, scenario: Callable[[oal.Handle], Any], monkeypatch: pytest.MonkeyPatch, **env: str) -> Exported:
    """``scenario(handle)`` under ``configure(fast_path=fast)`` exporting over gRPC to a loopback receiver."""
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    receiver = RawReceiver()
    server, endpoint = start_grpc(receiver)
    try:
        handle = oal.configure(
            "boundary", endpoint=endpoint, protocol="grpc", set_global=False, schedule_delay_s=0.05, fast_path=fast
        )
        try:
            result = scenario(handle)
            assert handle.force_flush(5)
            stats = handle.stats
        finally:
            handle.shutdown(5)
        assert wait_for(lambda: len(receiver.records) >= stats["exported"], 10)
    finally:
        server.stop(0)
    spans = {s.name: s for r in receiver.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans}
    return Exported(spans, stats, result)


def canonical(span: trace_pb2.Span, run: Exported) -> dict[str, Any]:
    """Every field as OTLP carries it, but ids, times and flags (which differ from run to run); a link to a span
    of the run names it."""
    names = {s.span_id: name for name, s in run.spans.items()}
    out: dict[str, Any] = json_format.MessageToDict(span)
    for key in ("traceId", "spanId", "parentSpanId", "startTimeUnixNano", "endTimeUnixNano", "flags"):
        out.pop(key, None)
    for event in out.get("events", ()):
        event.pop("timeUnixNano", None)
    for got, link in zip(out.get("links", ()), span.links, strict=True):
        if link.span_id in names:
            got["traceId"] = got["spanId"] = names[link.span_id]
    return out


def attrs(span: trace_pb2.Span) -> dict[str, Any]:
    return {kv.key: json_format.MessageToDict(kv.value) for kv in span.attributes}


def strings(value: Any) -> Iterator[str]:
    """Every string value inside an ``AnyValue`` as ``MessageToDict`` gives it."""
    if isinstance(value, dict):
        for key, inner in value.items():
            if key == "stringValue":
                yield inner
            else:
                yield from strings(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from strings(inner)


def both(scenario: Callable[[oal.Handle], Any], monkeypatch: pytest.MonkeyPatch, **env: str) -> dict[bool, Exported]:
    runs = {fast: export(fast, scenario, monkeypatch, **env) for fast in PATHS}
    for fast, run in runs.items():
        assert run.stats["failed"] == run.stats["dropped"] == 0, (fast, run.stats)
        assert run.stats["exported"] == len(run.spans), (fast, run.stats, sorted(run.spans))
    return runs


def assert_same(runs: dict[bool, Exported]) -> None:
    fast, sdk = runs[True], runs[False]
    assert sorted(fast.spans) == sorted(sdk.spans)
    for name in fast.spans:
        assert canonical(fast.spans[name], fast) == canonical(sdk.spans[name], sdk), name
