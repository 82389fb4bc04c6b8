"""Our OTLP-JSON, read by the real OpenTelemetry Collector: the library exports over http/json to a Collector
that forwards over OTLP/gRPC to a loopback receiver. Every span arrives with every field our OTLP-JSON file
holds for it (the Collector's own JSON reader parsed them): trace state, span and link flags, the dropped
attribute, event and link counts."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

import otel_agentloop as oal
from tests._support.fast_path_parity import RawReceiver, parse_json_line
from tests._support.otlp_receiver import start_grpc, wait_for

from .conftest import stack_mod

CONFIG = """
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{http_port}
exporters:
  otlp:
    endpoint: 127.0.0.1:{grpc_port}
    tls:
      insecure: true
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [otlp]
"""
LIMITS = {
    "OTEL_SPAN_EVENT_COUNT_LIMIT": "1",
    "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT": "1",
    "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT": "1",
    "OTEL_SPAN_LINK_COUNT_LIMIT": "1",
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "12",
}


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _program() -> None:
    """A sample under a remote parent with a trace state, one phase over every limit above."""
    remote = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(1),
        trace_state=TraceState([("vendor", "v1")]),
    )
    token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(remote)))
    try:
        with oal.step(1, trace_per="step"), oal.sample(0), oal.span("tool", tool="search"):
            span = trace.get_current_span()
            for i in range(20):
                span.set_attribute(f"user.{i}", i)
            span.add_event("first", {"a": 1, "b": 2})
            span.add_event("second", {"a": 1, "b": 2})
            span.add_link(SpanContext(0x1, 0x2, is_remote=True), {"a": 1, "b": 2})
            span.add_link(SpanContext(0x3, 0x4, is_remote=False), {"a": 1, "b": 2})
    finally:
        otel_context.detach(token)


def test_the_collector_reads_every_field_of_our_otlp_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if stack_mod.missing():
        pytest.fail(
            f"the Collector is not built: {stack_mod.missing()} (python3 scripts/stack.py build)", pytrace=False
        )
    receiver = RawReceiver()
    server, grpc_endpoint = start_grpc(receiver)
    http_port = stack_mod.free_port()
    config = tmp_path / "collector.yaml"
    config.write_text(CONFIG.format(http_port=http_port, grpc_port=grpc_endpoint.rsplit(":", 1)[1]))
    log = (tmp_path / "collector.log").open("wb")
    collector = subprocess.Popen(
        [str(stack_mod.COLLECTOR_BIN), "--config", str(config)], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        assert wait_for(lambda: _listening(http_port), 30), (tmp_path / "collector.log").read_text()
        for key, value in {**LIMITS, "OTEL_METRICS_EXPORTER": "none"}.items():
            monkeypatch.setenv(key, value)
        path = tmp_path / "spans.jsonl"
        handle = oal.configure(
            "json-collector",
            endpoint=f"http://127.0.0.1:{http_port}",
            protocol="http/json",
            file=str(path),
            set_global=False,
            schedule_delay_s=0.05,
        )
        try:
            _program()
            handle.metrics.collect(1)
            assert handle.force_flush(10)
        finally:
            handle.shutdown(10)
        ours = {s.span_id: s for line in path.read_text().split("\n") if line for s in _spans(parse_json_line(line))}
        assert wait_for(lambda: len(_received(receiver)) >= len(ours), 30), (len(_received(receiver)), len(ours))
    finally:
        collector.terminate()
        collector.wait(30)
        log.close()
        server.stop(0)
    received = _received(receiver)
    assert set(received) == set(ours)
    for span_id, span in ours.items():
        assert received[span_id] == span, span.name
    tool = next(s for s in ours.values() if s.name == "execute_tool search")
    assert tool.trace_state == "vendor=v1" and tool.flags & 0x300 == 0x100  # the remote parent is the step's
    assert (tool.dropped_attributes_count, tool.dropped_events_count, tool.dropped_links_count) != (0, 0, 0)
    assert tool.dropped_events_count == 1 and tool.dropped_links_count == 1
    assert tool.events[0].dropped_attributes_count == 1 and tool.links[0].dropped_attributes_count == 1
    assert tool.links[0].flags == 0x100
    step = next(s for s in ours.values() if s.name == "rl.step")
    assert step.flags == 0x300 and step.trace_state == "vendor=v1"


def _spans(request: Any) -> list[Any]:
    return [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]


def _received(receiver: RawReceiver) -> dict[bytes, Any]:
    with receiver.lock:
        requests = list(receiver.requests)
    return {s.span_id: s for request in requests for s in _spans(request)}
