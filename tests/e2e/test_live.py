"""The long tail while it runs, end to end: a hung tool's snapshot in the real Jaeger before the sample ends,
and the library's histograms with exemplars on the real Collector's Prometheus endpoint (OpenMetrics)."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
import uuid

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.analysis import JaegerClient
from otel_agentloop.demo._agent import SimConfig, run_samples
from otel_agentloop.health import WatchdogSettings
from otel_agentloop.metrics import StepMetrics

HANG_S, INTERVAL_S = 0.5, 0.1


@oal.trace_generate(model="e2e")
async def generate(delay: float) -> None:
    await asyncio.sleep(delay)


@oal.trace_tool("hang")
async def hang(event: asyncio.Event) -> None:
    await event.wait()


def test_hung_tool_snapshot_is_in_jaeger_while_the_sample_runs_and_it_is_classified_hung(stack) -> None:
    service = f"e2e-live-{uuid.uuid4().hex[:6]}"
    handle = oal.configure(
        service,
        endpoint=stack.otlp_grpc_endpoint,
        protocol="grpc",
        set_global=False,
        schedule_delay_s=0.05,
        watchdog=WatchdogSettings(interval_s=INTERVAL_S, thresholds_s={"tool:hang": HANG_S}),
    )
    client = JaegerClient(stack.jaeger_url)
    seen: dict[str, object] = {}

    async def main() -> StepMetrics:
        release = asyncio.Event()
        with oal.step(1):

            async def one(i: int) -> None:
                async with oal.sample(i):
                    await generate(0.01)
                    if i == 2:
                        await hang(release)

            tasks = [asyncio.create_task(one(i)) for i in range(4)]
            deadline = time.monotonic() + 10
            while not handle.live.reports:
                assert time.monotonic() < deadline, "the watchdog did not report the hung tool"
                await asyncio.sleep(0.02)
            (running,) = handle.inflight()
            assert running.sample_index == 2 and running.overdue
            # the snapshot reaches Jaeger (via the Collector) while the sample is still running
            deadline = time.monotonic() + 60
            while True:
                spans = await asyncio.to_thread(_spans, client, running.trace_id)
                snaps = [s for s in spans if _attrs(s).get(sc.RL_SNAPSHOT) is True]
                if snaps:
                    break
                assert time.monotonic() < deadline, "snapshot not found in Jaeger"
                await asyncio.sleep(0.5)
            assert not tasks[2].done()
            seen["spans"], seen["running"] = spans, running
            metrics = handle.metrics.collect(1)  # collected while it still runs ...
            release.set()  # ... then ended
            await asyncio.gather(*tasks)
        return metrics

    try:
        metrics = asyncio.run(main())
        assert handle.force_flush(10)
    finally:
        handle.shutdown(5)
    spans, running = seen["spans"], seen["running"]
    (snap,) = [s for s in spans if _attrs(s).get(sc.RL_SNAPSHOT) is True]
    assert snap["name"] == "rl.sample (in progress)"
    assert not any(s["name"] == sc.SAMPLE_SPAN for s in spans)  # the sample span itself had not ended
    attrs = _attrs(snap)
    assert attrs[sc.RL_STEP] == 1 and attrs[sc.RL_SAMPLE_INDEX] == 2 and attrs[sc.RL_VALIDATE] is False
    assert attrs[sc.RL_PHASE] == sc.TOOL_CALLS and attrs[sc.GEN_AI_TOOL_NAME] == "hang"
    assert HANG_S <= attrs[sc.RL_SNAPSHOT_PHASE_AGE] < HANG_S + INTERVAL_S + 0.3  # threshold + one check (+jitter)
    assert snap["parentSpanId"] == running.span_id
    assert [link["spanId"] for link in snap["links"]] == [running.span_id]
    assert metrics["agent_loop/watchdog/hung"] == 1.0 and metrics.hung_trace_ids == (running.trace_id,)
    # once ended, the whole sample is in the same trace, the snapshot below its root
    final = _spans(client, running.trace_id, want=sc.SAMPLE_SPAN)
    root = next(s for s in final if s["name"] == sc.SAMPLE_SPAN)
    assert root["spanId"] == running.span_id and int(root["startTimeUnixNano"]) == int(snap["startTimeUnixNano"])


def _spans(client: JaegerClient, trace_id: str, want: str | None = None, timeout_s: float = 60) -> list[dict]:
    """The spans of ``trace_id`` in Jaeger (``[]`` while it has none); with ``want``, poll until that name is in."""
    deadline = time.monotonic() + timeout_s
    while True:
        spans = [s for rs in client.get_trace(trace_id) for ss in rs.get("scopeSpans", []) for s in ss["spans"]]
        if want is None or any(s["name"] == want for s in spans) or time.monotonic() > deadline:
            return spans
        time.sleep(0.5)


def _attrs(span: dict) -> dict:
    out = {}
    for kv in span.get("attributes", []):
        value = kv["value"]
        kind, raw = next(iter(value.items())) if value else (None, None)
        out[kv["key"]] = int(raw) if kind == "intValue" else raw
    return out


_LINE = re.compile(
    r"^(?P<name>[a-zA-Z_:][\w:]*)\{(?P<labels>[^}]*)\} (?P<value>\S+)(?: \S+)?"
    r"(?: # \{(?P<exemplar>[^}]*)\} (?P<exvalue>\S+).*)?$"
)


def _scrape(url: str) -> list[dict]:
    request = urllib.request.Request(url, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    with urllib.request.urlopen(request, timeout=5) as r:
        assert "application/openmetrics-text" in r.headers["Content-Type"]
        text = r.read().decode()
    rows = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m["labels"]))
            exemplar = dict(re.findall(r'(\w+)="([^"]*)"', m["exemplar"])) if m["exemplar"] else None
            rows.append({"name": m["name"], "labels": labels, "exemplar": exemplar})
    return rows


def test_collector_prometheus_shows_library_histograms_with_exemplars_found_in_jaeger(stack, monkeypatch) -> None:
    # One export, by the flush below: the SDK hands a histogram's exemplars to one collection only, and a later
    # periodic export without new measurements replaces them in the Collector (a scrape would race it).
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "3600000")
    service = f"e2e-metrics-{uuid.uuid4().hex[:6]}"
    handle = oal.configure(
        service, endpoint=stack.otlp_grpc_endpoint, protocol="grpc", set_global=False, schedule_delay_s=0.05
    )
    cfg = SimConfig(prompts=4, rollout_n=2, time_scale=0.05, tool_prob=1.0, tool_fail_prob=0.0, max_turns=3)

    async def main() -> None:
        with oal.step(1):
            await run_samples(cfg, 1, cfg.work())

    try:
        asyncio.run(main())
        handle.metrics.collect(1)
        handle.live.check()  # record now
        assert handle.live.force_flush(10)  # export them (the periodic reader waits an hour)
        deadline = time.monotonic() + 60
        while True:
            rows = [r for r in _scrape(stack.prometheus_url) if r["labels"].get("job") == service]
            names = {r["name"] for r in rows}
            with_exemplars = [r for r in rows if r["exemplar"] and r["name"].endswith("_bucket")]
            wanted = {
                "gen_ai_client_operation_duration_seconds_bucket",
                "gen_ai_execute_tool_duration_seconds_bucket",
                "rl_reward_duration_seconds_bucket",
                "rl_sample_duration_seconds_bucket",
            }
            if wanted <= names and {r["name"] for r in with_exemplars} >= wanted:
                break
            assert time.monotonic() < deadline, (
                sorted(wanted - names),
                sorted(wanted - {r["name"] for r in with_exemplars}),
            )
            time.sleep(0.5)
        assert handle.force_flush(10)
    finally:
        handle.shutdown(5)
    gen = [r for r in rows if r["name"] == "gen_ai_client_operation_duration_seconds_bucket"]
    assert {r["labels"]["gen_ai_operation_name"] for r in gen} == {"text_completion"}
    assert {r["labels"]["gen_ai_request_model"] for r in gen} == {"sim-7b"}
    assert {r["labels"]["rl_phase"] for r in gen} == {sc.GENERATE}
    tool_name = "gen_ai_execute_tool_duration_seconds_bucket"
    tools = {r["labels"]["gen_ai_tool_name"] for r in rows if r["name"] == tool_name}
    assert tools <= {"search", "calculator", "python"} and tools
    buckets = {r["labels"]["le"] for r in gen}
    assert {"0.005", "1800.0", "+Inf"} <= buckets or {"0.005", "1800", "+Inf"} <= buckets
    for r in rows:  # low cardinality only
        assert not any(k in r["labels"] for k in ("rl_sample_index", "rl_sample_rollout_n", "trace_id", "rl_step"))
    gauges = {r["name"] for r in rows}
    assert "rl_samples_in_flight" in gauges or any(n.startswith("rl_samples_in_flight") for n in gauges)
    client = JaegerClient(stack.jaeger_url)
    trace_ids = {r["exemplar"]["trace_id"] for r in with_exemplars}
    assert trace_ids
    for trace_id in trace_ids:
        spans = _spans(client, trace_id, want=sc.SAMPLE_SPAN)
        assert any(s["name"] == sc.SAMPLE_SPAN for s in spans), trace_id
    span_ids = {r["exemplar"]["span_id"] for r in with_exemplars}
    found = {s["spanId"] for t in trace_ids for s in _spans(client, t)}
    assert span_ids <= found
