"""End to end: the simulated agent loop -> real Collector -> real Jaeger, read back through api_v3."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.analysis import JaegerClient, build_report, decode_resource_spans
from otel_agentloop.demo._agent import SimConfig, run_samples
from otel_agentloop.metrics import StepMetrics
from tests._support.spans import span_metrics

from .conftest import stack_mod, stack_store

ROOT = Path(__file__).resolve().parents[2]
CFG = SimConfig(prompts=3, rollout_n=2, time_scale=0.05, tool_prob=1.0, tool_fail_prob=0.0)


def test_compose_and_native_stack_use_the_same_services_ports_and_configs() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"jaeger", "otel-collector"}
    jaeger, collector = services["jaeger"], services["otel-collector"]
    mounts = {v.split(":")[1]: (ROOT / v.split(":")[0]).resolve() for s in (jaeger, collector) for v in s["volumes"]}
    assert mounts["/etc/jaeger/jaeger.yaml"] == (ROOT / "collector" / "jaeger.yaml").resolve()
    assert mounts["/etc/otelcol/collector.yaml"] == (ROOT / "collector" / "collector.yaml").resolve()
    assert "/etc/jaeger/jaeger.yaml" in jaeger["command"]
    assert "--config=/etc/otelcol/collector.yaml" in collector["command"]
    ports = stack_mod.DEFAULT_PORTS
    assert {p.split(":")[0] for p in collector["ports"]} == {str(ports[k]) for k in ("grpc", "http", "prometheus")}
    assert all(a == b for a, b in (p.split(":") for p in collector["ports"] + jaeger["ports"]))
    assert jaeger["ports"] == [f"{ports['query']}:{ports['query']}"]
    assert collector["environment"]["JAEGER_OTLP_ENDPOINT"] == f"jaeger:{ports['jaeger_otlp_grpc']}"
    assert collector["environment"]["OTELCOL_HOST"] == jaeger["environment"]["JAEGER_HOST"] == "0.0.0.0"
    # images pinned to exactly the versions the native stack builds
    assert jaeger["image"] == "jaegertracing/jaeger:2.13.0" and stack_mod.JAEGER_VERSION == "v1.76.0"
    assert collector["image"] == f"otel/opentelemetry-collector-contrib:{stack_mod.COLLECTOR_VERSION[1:]}"
    manifest = (ROOT / "collector" / "manifest.yaml").read_text()
    assert set(re.findall(r" (v\d+\.\d+\.\d+)\n", manifest)) == {stack_mod.COLLECTOR_VERSION}
    # the defaults in the config files are the native stack's ports
    text = (ROOT / "collector" / "collector.yaml").read_text() + (ROOT / "collector" / "jaeger.yaml").read_text()
    for var, key in (
        ("OTELCOL_GRPC_PORT", "grpc"),
        ("OTELCOL_HTTP_PORT", "http"),
        ("JAEGER_QUERY_PORT", "query"),
        ("OTELCOL_PROMETHEUS_PORT", "prometheus"),
        ("JAEGER_OTLP_GRPC_PORT", "jaeger_otlp_grpc"),
    ):
        assert f"${{env:{var}:-{ports[key]}}}" in text, var


def test_collector_config_is_validated_by_the_real_binary(stack, tmp_path) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}, **stack_mod.config_env(stack.ports)}
    config = str(ROOT / "collector/collector.yaml")
    good = subprocess.run(
        [str(stack_mod.COLLECTOR_BIN), "validate", "--config", config],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert good.returncode == 0, good.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        (ROOT / "collector/collector.yaml")
        .read_text()
        .replace("exporters: [prometheus]", "exporters: [prometheus, nope]")
    )
    bad = subprocess.run(
        [str(stack_mod.COLLECTOR_BIN), "validate", "--config", str(broken)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0 and "nope" in (bad.stderr + bad.stdout)


def test_opensearch_compose_and_native_store_use_the_same_config() -> None:
    """docker-compose.opensearch.yml: 3 nodes of the official image of the version the native store runs, Jaeger
    (the same image as docker-compose.yml) with collector/jaeger-opensearch.yaml on all 3, the retention job with
    the native store's prefix and interval, and the same Collector as docker-compose.yml."""
    compose = yaml.safe_load((ROOT / "docker-compose.opensearch.yml").read_text())
    plain = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    services = compose["services"]
    assert set(services) == {"os1", "os2", "os3", "jaeger", "retention", "otel-collector"}
    nodes = [services[f"os{i}"] for i in (1, 2, 3)]
    assert stack_store.OPENSEARCH_VERSION == "2.19.1.0"
    assert {n["image"] for n in nodes} == {"opensearchproject/opensearch:2.19.1"}
    assert [n["environment"]["node.name"] for n in nodes] == ["os1", "os2", "os3"]
    assert {n["environment"]["discovery.seed_hosts"] for n in nodes} == {"os1,os2,os3"}
    assert len({v for n in nodes for v in n["volumes"]}) == 3  # each node its own data volume
    jaeger, retention, collector = services["jaeger"], services["retention"], services["otel-collector"]
    assert jaeger["image"] == plain["jaeger"]["image"] and jaeger["command"] == plain["jaeger"]["command"]
    assert jaeger["volumes"] == ["./collector/jaeger-opensearch.yaml:/etc/jaeger/jaeger.yaml:ro"]
    urls = yaml.safe_load(jaeger["environment"]["OPENSEARCH_URLS"])
    assert urls == [f"http://os{i}:9200" for i in (1, 2, 3)]
    assert jaeger["environment"]["JAEGER_INDEX_PREFIX"] == stack_store.INDEX_PREFIX
    command = retention["command"]
    assert command[1:5] == ["/repo/scripts/stack_store.py", "retention", ",".join(urls), stack_store.INDEX_PREFIX]
    assert float(command[6]) == stack_store.RETENTION_INTERVAL_S
    assert {k: v for k, v in collector.items() if k != "depends_on"} == {
        k: v for k, v in plain["otel-collector"].items() if k != "depends_on"
    }
    assert collector["depends_on"] == {"retention": {"condition": "service_healthy"}}


def test_jaeger_opensearch_config_is_validated_by_the_real_binary(tmp_path) -> None:
    if not stack_mod.JAEGER_BIN.exists():
        pytest.fail(f"Jaeger is not built ({stack_mod.JAEGER_BIN}): run `make stack-build`", pytrace=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OPENSEARCH_URLS"] = "[http://127.0.0.1:9201,http://127.0.0.1:9202,http://127.0.0.1:9203]"
    config = ROOT / "collector" / "jaeger-opensearch.yaml"

    def validate(path: Path) -> subprocess.CompletedProcess[str]:
        cmd = [str(stack_mod.JAEGER_BIN), "validate", "--config", str(path)]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)

    good = validate(config)
    assert good.returncode == 0, good.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text(config.read_text().replace("use_aliases: true", "use_aliasez: true"))
    bad = validate(broken)
    assert bad.returncode != 0 and "use_aliasez" in (bad.stderr + bad.stdout)


def _run_step(handle: oal.Handle, step: int) -> StepMetrics:
    async def main() -> None:
        with oal.step(step):
            await run_samples(CFG, step, CFG.work())

    asyncio.run(main())
    return handle.metrics.collect(step)


def _records(client: JaegerClient, service: str, step: int, expect_samples: int, start: datetime) -> list:
    end = datetime.now(timezone.utc) + timedelta(minutes=1)

    def fetch() -> list:
        return client.find_traces(service, start, end, attributes={sc.RL_STEP: str(step)})

    def complete(rs: list) -> bool:
        recs = list(decode_resource_spans(rs))
        roots = [r for r in recs if r.name == sc.SAMPLE_SPAN]
        return len(roots) == expect_samples and len(recs) >= expect_samples * 4

    return list(decode_resource_spans(client.wait_for(fetch, complete, timeout_s=60)))


@pytest.mark.parametrize("protocol", ["grpc", "http/json"])
def test_every_sample_reaches_jaeger_with_its_structure_and_metrics(stack, protocol) -> None:
    service = f"e2e-{protocol.replace('/', '-')}-{uuid.uuid4().hex[:6]}"
    endpoint = stack.otlp_grpc_endpoint if protocol == "grpc" else stack.otlp_http_endpoint
    start = datetime.now(timezone.utc) - timedelta(seconds=5)
    handle = oal.configure(service, endpoint=endpoint, protocol=protocol, set_global=False, schedule_delay_s=0.05)
    try:
        live = _run_step(handle, 1)
        assert handle.force_flush(10)
        assert handle.stats["dropped"] == 0 and handle.stats["failed"] == 0
    finally:
        handle.shutdown(5)
    client = JaegerClient(stack.jaeger_url)
    assert service in client.wait_for(lambda: [client.services()], lambda r: service in r[0], 30)[0]
    records = _records(client, service, 1, len(CFG.work()), start)
    roots = [r for r in records if r.name == sc.SAMPLE_SPAN]
    assert {(r.attributes[sc.RL_SAMPLE_INDEX], r.attributes[sc.RL_ROLLOUT_N]) for r in roots} == set(CFG.work())
    by_id = {r.span_id: r for r in records}
    seen_phases: set[str] = set()
    for root in roots:
        assert root.parent_id == 0
        trace = list(decode_resource_spans(client.get_trace(root.trace_id_hex)))
        phases = [r for r in trace if sc.RL_PHASE in r.attributes]
        names = {r.attributes[sc.RL_PHASE] for r in phases}
        assert {sc.GENERATE, sc.COMPUTE_SCORE} <= names  # tools run only between turns
        seen_phases |= names
        for r in phases:
            assert r.parent_id == root.span_id and r.trace_id == root.trace_id
            assert r.attributes[sc.RL_SAMPLE_INDEX] == root.attributes[sc.RL_SAMPLE_INDEX]
            assert r.attributes[sc.RL_STEP] == 1
        assert root.resource["service.name"] == service
        assert by_id[root.span_id].name == sc.SAMPLE_SPAN
    assert seen_phases == set(sc.PHASES)
    rebuilt = build_report(records, 1).metrics
    live_m, rebuilt_m = span_metrics(live), span_metrics(rebuilt)
    assert live_m.keys() == rebuilt_m.keys()
    for key, value in live_m.items():
        assert rebuilt_m[key] == pytest.approx(value, abs=0.001), key
    assert rebuilt.slowest_trace_id == live.slowest_trace_id

    # the report command reads the same from Jaeger
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_agentloop",
            "report",
            "--jaeger",
            stack.jaeger_url,
            "--service",
            service,
            "--step",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    data = json.loads(out)
    assert data["slowest_trace_id"] == live.slowest_trace_id
    assert data["metrics"]["agent_loop/generate_sequences/max"] == pytest.approx(
        live["agent_loop/generate_sequences/max"], abs=0.001
    )


def test_spanmetrics_histograms_have_phase_dimensions_and_no_sample_index(stack) -> None:
    handle = oal.configure(
        "e2e-spanmetrics", endpoint=stack.otlp_grpc_endpoint, set_global=False, schedule_delay_s=0.05
    )
    try:
        _run_step(handle, 1)
        assert handle.force_flush(10)
    finally:
        handle.shutdown(5)
    deadline = time.monotonic() + 60
    text = ""
    while time.monotonic() < deadline:
        with urllib.request.urlopen(stack.prometheus_url, timeout=5) as r:
            text = r.read().decode()
        if 'service_name="e2e-spanmetrics"' in text and 'rl_phase="compute_score"' in text:
            break
        time.sleep(1)
    buckets = [
        line
        for line in text.splitlines()
        if line.startswith("traces_span_metrics_duration")
        and "_bucket{" in line
        and 'service_name="e2e-spanmetrics"' in line
    ]
    assert buckets, text[:2000]
    phases = set(re.findall(r'rl_phase="([^"]+)"', "\n".join(buckets)))
    assert phases == set(sc.PHASES)
    assert any('gen_ai_tool_name="search"' in line for line in buckets) or any(
        'gen_ai_tool_name="calculator"' in line or 'gen_ai_tool_name="python"' in line for line in buckets
    )
    assert not re.search(r"sample_index|rollout_n|trace_id", text)
    assert any('le="600000"' in line or 'le="600"' in line for line in buckets)  # buckets reach 10 minutes


def test_collector_stopped_and_restarted_mid_run(stack) -> None:
    service = f"e2e-restart-{uuid.uuid4().hex[:6]}"
    start = datetime.now(timezone.utc) - timedelta(seconds=5)
    handle = oal.configure(
        service, endpoint=stack.otlp_grpc_endpoint, set_global=False, schedule_delay_s=0.05, export_timeout_s=2
    )
    try:
        _run_step(handle, 1)
        assert handle.force_flush(10)
        stack.stop_collector()
        t0 = time.perf_counter()
        _run_step(handle, 2)  # the Collector is down: nothing raises, the loop is not held up
        down_s = time.perf_counter() - t0
        flushed_while_down = handle.force_flush(0.5)
        stack.start_collector()
        deadline = time.monotonic() + 60
        while handle.stats["pending"] and time.monotonic() < deadline:
            time.sleep(0.2)
        _run_step(handle, 3)
        assert handle.force_flush(15)
        stats = handle.stats
    finally:
        handle.shutdown(5)
        if "collector" not in stack.procs:
            stack.start_collector()
    assert not flushed_while_down
    assert down_s < 10
    assert stats["pending"] == 0 and stats["queued"] == stats["exported"] + stats["failed"]
    client = JaegerClient(stack.jaeger_url)
    assert len([r for r in _records(client, service, 3, len(CFG.work()), start) if r.name == sc.SAMPLE_SPAN]) == 6
    # spans sent while the Collector was down were either delivered after it came back (the queue and the
    # exporter's retries bridge a short outage) or are counted as failed/dropped: never silently lost
    during = [r for r in _records(client, service, 2, len(CFG.work()), start) if r.name == sc.SAMPLE_SPAN]
    if stats["failed"] + stats["dropped"] == 0:
        assert len(during) == 6
    else:
        assert len(during) < 6


def test_a_missing_go_toolchain_fails_with_a_message_that_says_so(monkeypatch, tmp_path) -> None:
    jaeger, collector = tmp_path / "bin" / "jaeger", tmp_path / "bin" / "otelcol"
    monkeypatch.setattr(stack_mod, "JAEGER_BIN", jaeger)
    monkeypatch.setattr(stack_mod, "COLLECTOR_BIN", collector)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(stack_mod.StackError, match="the Go toolchain is not installed"):
        stack_mod.build(verbose=False)
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "stack.py"), "build"],
        env={"PATH": "/nonexistent", "OTEL_AGENTLOOP_CACHE": str(tmp_path / "empty-cache")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "Go toolchain is not installed" in out.stderr
    # Cached binaries need no Go: a machine that has them can start the stack without a toolchain.
    jaeger.parent.mkdir(parents=True)
    jaeger.touch()
    collector.touch()
    assert stack_mod.build(verbose=False) == {"jaeger": 0.0, "collector": 0.0}


def test_an_unreachable_module_proxy_fails_with_the_reason_and_start_never_builds(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(stack_mod, "JAEGER_BIN", tmp_path / "bin" / "jaeger")
    monkeypatch.setattr(stack_mod, "COLLECTOR_BIN", tmp_path / "bin" / "otelcol")
    with pytest.raises(stack_mod.StackError, match=r"not built yet: .*make stack-build"):
        stack_mod.start(log_dir=tmp_path / "logs")  # a build takes minutes: never inside a test's timeout
    # an empty module cache and a proxy that refuses connections (a closed port on 127.0.0.1)
    monkeypatch.setenv("GOMODCACHE", str(tmp_path / "modcache"))
    monkeypatch.setenv("GOPROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("GOFLAGS", "")
    with pytest.raises(stack_mod.StackError, match="is the Go module proxy reachable"):
        stack_mod.build(verbose=False)
