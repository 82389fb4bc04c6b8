"""Real OTLP export (gRPC and HTTP) to a receiver on 127.0.0.1, and the OTLP-JSON file, checked alike."""

from __future__ import annotations

import asyncio
import time

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.analysis import read_traces
from otel_agentloop.demo._agent import SimConfig, run_samples
from otel_agentloop.metrics import PhaseMetricsProcessor, SpanRecord, StepMetrics
from tests._support.otlp_receiver import Receiver, start_grpc, start_http
from tests._support.spans import span_metrics

CFG = SimConfig(
    prompts=3, rollout_n=2, time_scale=0.05, tool_prob=1.0, max_turns=3, tool_fail_prob=0.0, fail_samples=frozenset({2})
)


def _run(handle: oal.Handle, step: int = 1) -> StepMetrics:
    async def main() -> None:
        with oal.step(step):
            await run_samples(CFG, step, CFG.work())

    asyncio.run(main())
    return handle.metrics.collect(step)


def _wait(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def check_structure(records: list[SpanRecord], metrics: StepMetrics) -> None:
    """Span names, parent/child links and attributes of a simulated step, whatever the transport."""
    by_id = {r.span_id: r for r in records}
    roots = [r for r in records if r.name == sc.SAMPLE_SPAN]
    assert len(roots) == len(CFG.work())
    assert {(r.attributes[sc.RL_SAMPLE_INDEX], r.attributes[sc.RL_ROLLOUT_N]) for r in roots} == set(CFG.work())
    (step_span,) = [r for r in records if r.name == sc.STEP_SPAN]
    for root in roots:
        assert root.parent_id == 0 and root.links == ((step_span.trace_id, step_span.span_id),)
        assert root.attributes[sc.RL_STEP] == 1 and root.attributes[sc.RL_VALIDATE] is False
        assert root.error == (root.attributes[sc.RL_SAMPLE_INDEX] == 2)
    phases = [r for r in records if sc.RL_PHASE in r.attributes]
    assert {r.attributes[sc.RL_PHASE] for r in phases} == set(sc.PHASES)
    for r in phases:
        parent = by_id[r.parent_id]
        assert parent.name == sc.SAMPLE_SPAN and parent.trace_id == r.trace_id
        for key in (sc.RL_STEP, sc.RL_SAMPLE_INDEX, sc.RL_ROLLOUT_N, sc.RL_VALIDATE):
            assert r.attributes[key] == parent.attributes[key]
    gens = [r for r in phases if r.attributes[sc.RL_PHASE] == sc.GENERATE]
    assert all(
        r.name == "text_completion sim-7b"
        and r.attributes[sc.GEN_AI_REQUEST_MODEL] == "sim-7b"
        and r.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] > 0
        for r in gens
    )
    tools = [r for r in phases if r.attributes[sc.RL_PHASE] == sc.TOOL_CALLS]
    assert tools and all(r.name == f"execute_tool {r.attributes[sc.GEN_AI_TOOL_NAME]}" for r in tools)
    failed_reward = [r for r in phases if r.name == sc.REWARD_SPAN and r.error]
    assert [r.attributes[sc.RL_SAMPLE_INDEX] for r in failed_reward] == [2, 2]
    assert all(r.attributes[sc.ERROR_TYPE] == "otel_agentloop.demo._agent.RewardError" for r in failed_reward)
    # the stored spans rebuild the same metrics through the same code path
    rebuilt = PhaseMetricsProcessor()
    rebuilt.ingest_records(records)
    assert span_metrics(rebuilt.collect(1)) == span_metrics(metrics)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf", "http/json"])
def test_otlp_export_reaches_a_real_receiver(protocol: str) -> None:
    receiver = Receiver()
    server, endpoint = start_grpc(receiver) if protocol == "grpc" else start_http(receiver)
    handle = oal.configure(
        "export-test",
        endpoint=endpoint,
        protocol=protocol,
        headers={"x-team": "rl"},
        set_global=False,
        schedule_delay_s=0.05,
    )
    try:
        metrics = _run(handle)
        assert handle.force_flush(10)
        stats = handle.stats
        assert stats["exported"] == stats["queued"] > 0 and stats["dropped"] == 0
        _wait(lambda: len(receiver.records) >= stats["exported"])
        assert len(receiver.records) == stats["exported"]
        assert all(h.get("x-team") == "rl" for h in receiver.headers)
        assert receiver.records[0].resource["service.name"] == "export-test"
        check_structure(receiver.records, metrics)
    finally:
        handle.shutdown(5)
        server.shutdown() if protocol != "grpc" else server.stop(0)


def test_env_endpoint_protocol_and_headers_are_honoured(monkeypatch) -> None:
    receiver = Receiver()
    server, endpoint = start_http(receiver)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20t0k,x-env=1")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci,rl.run.id=r1")
    handle = oal.configure(set_global=False, schedule_delay_s=0.05)
    try:
        assert "otlp/http/protobuf" in handle.description
        _run(handle)
        assert handle.force_flush(10)
        _wait(lambda: receiver.records)
        assert receiver.headers[0]["authorization"] == "Bearer t0k" and receiver.headers[0]["x-env"] == "1"
        resource = receiver.records[0].resource
        assert resource["service.name"] == "from-env"
        assert resource["deployment.environment"] == "ci" and resource["rl.run.id"] == "r1"
    finally:
        handle.shutdown(5)
        server.shutdown()


def test_file_export_round_trips(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    handle = oal.configure("file-test", set_global=False, schedule_delay_s=0.05)
    assert handle.description == "file otel-agentloop-traces"  # the default: the rolled directory
    try:
        metrics = _run(handle)
        assert handle.force_flush(10)
    finally:
        handle.shutdown(5)
    segments = [p for p in (tmp_path / "otel-agentloop-traces").rglob("*.jsonl") if p.name != "index.jsonl"]
    lines = [line for p in segments for line in p.read_text().splitlines()]
    assert lines and all(line.startswith('{"resourceSpans":[') for line in lines)
    records = list(read_traces(str(tmp_path / "otel-agentloop-traces")))
    assert len(records) == handle.stats["exported"]
    assert records[0].resource["service.name"] == "file-test"
    check_structure(records, metrics)


class _CountEnded(SpanProcessor):
    """Counts every span that ends: what the export counters must account for, one by one."""

    def __init__(self) -> None:
        self.ended = 0

    def on_end(self, span: ReadableSpan) -> None:
        self.ended += 1


def test_endpoint_down_never_blocks_and_counts_drops() -> None:
    receiver = Receiver()
    receiver.fail = True
    server, endpoint = start_http(receiver)
    counter = _CountEnded()
    handle = oal.configure(
        "down",
        endpoint=endpoint,
        protocol="http/protobuf",
        set_global=False,
        processors=[counter],
        max_queue_size=16,
        max_export_batch_size=4,
        schedule_delay_s=0.05,
    )
    try:
        t0 = time.perf_counter()
        _run(handle)
        flushed = handle.force_flush(0.5)
        elapsed = time.perf_counter() - t0
        stats = handle.stats
    finally:
        t1 = time.perf_counter()
        handle.shutdown(1.0)
        shutdown_s = time.perf_counter() - t1
        server.shutdown()
    after = handle.stats
    created = counter.ended + after["summaries_written"]  # summary spans skip the provider's processors
    assert after["summaries_written"] >= 1
    assert not flushed
    assert elapsed < 10
    assert shutdown_s < 2.5
    # the queue (16) was overfilled: the spans that did not fit are dropped and counted, one by one
    assert created > 2 * 16
    assert stats["exported"] == 0
    assert stats["dropped"] > 0
    assert stats["queued"] + stats["dropped"] == created, (created, stats)
    assert stats["queued"] == stats["exported"] + stats["failed"] + stats["pending"], stats
    # after shutdown nothing is pending: every span created is exported, failed or dropped
    assert after["pending"] == 0 and after["exported"] == 0
    assert after["exported"] + after["failed"] + after["dropped"] == created, (created, after)
