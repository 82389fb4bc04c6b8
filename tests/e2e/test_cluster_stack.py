"""The cluster topology and the trace store on disk, with the real binaries (scripts/stack.py):

- the agent and gateway configs pass the real Collector's ``validate``;
- Jaeger keeps its traces in Badger: a SIGKILL and a restart with the same config lose none of them;
- agent -> gateway -> Jaeger: the gateway stopped for tens of seconds mid-run, then restarted; every span the
  library exported is stored in Jaeger in the end (api_v3 and every process's own counters agree).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.analysis import JaegerClient, decode_resource_spans

from .conftest import stack_mod

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def own_stack(tmp_path: Path) -> Iterator[stack_mod.Stack]:
    """Jaeger + one Collector of this test alone (it kills Jaeger: the session's stack stays untouched)."""
    try:
        running = stack_mod.start(log_dir=tmp_path / "logs")
    except stack_mod.StackError as exc:
        pytest.fail(f"cannot run the Jaeger/Collector stack: {exc}", pytrace=False)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[stack_mod.Stack]:
    """Jaeger, a gateway and one agent on free ports, store and queues in temporary directories."""
    try:
        running = stack_mod.start_cluster(log_dir=tmp_path / "logs")
    except stack_mod.StackError as exc:
        pytest.fail(f"cannot run the agent/gateway/Jaeger stack: {exc}", pytrace=False)
    try:
        yield running
    finally:
        running.stop()


def _samples(first: int, count: int, step: int = 1) -> None:
    """One step of ``count`` samples (one trace each, the step's span another): a generation, a tool call and a
    reward inside each sample."""
    with oal.step(step):
        for i in range(first, first + count):
            with oal.sample(i):
                with oal.span("generate_sequences", model="m"):
                    pass
                with oal.span("tool_calls", tool="python"):
                    pass
                with oal.span("compute_score"):
                    pass


def _stored_spans(client: JaegerClient, service: str, since: datetime, depth: int) -> dict[str, set[int]]:
    """Span ids per trace id (hex) of ``service`` that Jaeger returns through api_v3."""
    end = datetime.now(timezone.utc) + timedelta(minutes=1)
    out: dict[str, set[int]] = {}
    for r in decode_resource_spans(client.find_traces(service, since, end, search_depth=depth)):
        out.setdefault(r.trace_id_hex, set()).add(r.span_id)
    return out


def _sample_traces(client: JaegerClient, service: str, since: datetime, depth: int) -> int:
    """How many stored traces of ``service`` hold a sample's root span."""
    end = datetime.now(timezone.utc) + timedelta(minutes=1)
    records = decode_resource_spans(client.find_traces(service, since, end, search_depth=depth))
    return len({r.trace_id for r in records if r.name == sc.SAMPLE_SPAN})


def _wait(predicate, timeout_s: float, interval_s: float = 0.5) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True


@pytest.mark.parametrize("config", ["agent.yaml", "gateway.yaml"])
def test_agent_and_gateway_configs_are_validated_by_the_real_binary(config: str, tmp_path: Path) -> None:
    if stack_mod.missing():
        pytest.fail(f"not built: {stack_mod.missing()} (make stack-build)", pytrace=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}

    def validate(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(stack_mod.COLLECTOR_BIN), "validate", "--config", str(path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    good = validate(ROOT / "collector" / config)
    assert good.returncode == 0, good.stderr
    parsed = yaml.safe_load((ROOT / "collector" / config).read_text())
    exporter = next(v for k, v in parsed["exporters"].items() if k.startswith("otlp/"))
    # the queue is on disk, bounded, and retried without a time limit (an outage of minutes loses nothing)
    assert exporter["sending_queue"]["storage"] in parsed["service"]["extensions"]
    assert exporter["sending_queue"]["storage"].startswith("file_storage")
    assert exporter["retry_on_failure"]["max_elapsed_time"] == 0
    assert "memory_limiter" in parsed["service"]["pipelines"]["traces"]["processors"]
    # the binary really checks the queue's settings: a sizer it does not know is refused
    broken = tmp_path / config
    broken.write_text((ROOT / "collector" / config).read_text().replace("sizer: items", "sizer: spans"))
    bad = validate(broken)
    assert bad.returncode != 0 and "invalid sizer" in bad.stderr


def test_compose_runs_jaeger_on_disk_with_the_same_config_as_the_native_stack() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    jaeger = compose["services"]["jaeger"]
    assert "./collector/jaeger.yaml:/etc/jaeger/jaeger.yaml:ro" in jaeger["volumes"]
    badger_dir = jaeger["environment"]["JAEGER_BADGER_DIR"]
    volume = next(v for v in jaeger["volumes"] if not v.startswith("./"))
    name, mount = volume.split(":")[:2]
    assert name in compose["volumes"] and badger_dir.startswith(mount + "/")
    assert "JAEGER_RETENTION" in jaeger["environment"]
    config = yaml.safe_load((ROOT / "collector" / "jaeger.yaml").read_text())
    backends = config["extensions"]["jaeger_storage"]["backends"]
    used = config["extensions"]["jaeger_query"]["storage"]["traces"]
    assert config["exporters"]["jaeger_storage_exporter"]["trace_storage"] == used
    assert set(backends[used]) == {"badger"} and backends[used]["badger"]["ephemeral"] is False
    assert "${env:JAEGER_BADGER_DIR" in backends[used]["badger"]["directories"]["keys"]
    assert "${env:JAEGER_RETENTION" in str(backends[used]["badger"]["ttl"]["spans"])


def test_jaeger_keeps_every_trace_through_a_sigkill_and_restart(own_stack: stack_mod.Stack) -> None:
    service = f"crash-{uuid.uuid4().hex[:6]}"
    since = datetime.now(timezone.utc) - timedelta(seconds=5)
    handle = oal.configure(service, endpoint=own_stack.otlp_grpc_endpoint, set_global=False, schedule_delay_s=0.05)
    try:
        _samples(0, 40)
        assert handle.force_flush(10)
        exported = handle.stats["exported"]
        assert exported >= 40 * 4 and handle.stats["dropped"] == 0
    finally:
        handle.shutdown(5)
    client = JaegerClient(own_stack.jaeger_url)
    assert _wait(lambda: sum(map(len, _stored_spans(client, service, since, 100).values())) == exported, 60)
    before = _stored_spans(client, service, since, 100)
    assert _sample_traces(client, service, since, 100) == 40

    own_stack.kill("jaeger")  # SIGKILL: no shutdown, no flush, as a crash or the OOM killer
    assert not stack_mod._healthy(f"http://127.0.0.1:{own_stack.ports['jaeger_health']}/status")
    own_stack.start_process("jaeger")  # the same config, the same store
    after = _stored_spans(client, service, since, 100)
    assert after == before
    for trace_id, span_ids in list(before.items())[:5]:  # and each trace by id
        assert {r.span_id for r in decode_resource_spans(client.get_trace(trace_id))} == span_ids
    assert any(own_stack.data_dir.joinpath("values").iterdir())


def test_a_gateway_outage_mid_run_loses_no_span(cluster: stack_mod.Stack) -> None:
    """The gateway stops for ~20 s while workers keep sending; halfway through, the agent itself restarts
    (its queue is on disk, so the backlog it held survives); then the gateway comes back."""
    service = f"outage-{uuid.uuid4().hex[:6]}"
    since = datetime.now(timezone.utc) - timedelta(seconds=5)
    handle = oal.configure(service, endpoint=cluster.otlp_grpc_endpoint, set_global=False, schedule_delay_s=0.1)
    stop, running, idle = threading.Event(), threading.Event(), threading.Event()
    running.set()
    made = [0]

    def produce() -> None:  # ~20 samples (80 spans) per second until told to stop; holds while not running
        while not stop.is_set():
            if not running.is_set():
                idle.set()
                running.wait()
                idle.clear()
            _samples(made[0], 5)
            made[0] += 5
            time.sleep(0.25)

    def agent(metric: str) -> float:
        return cluster.counter("agent", metric)

    producer = threading.Thread(target=produce, daemon=True)
    try:
        producer.start()
        time.sleep(6)
        assert _wait(lambda: cluster.counter("jaeger", "otelcol_receiver_accepted_spans") > 0, 20)
        cluster.stop_process("gateway")  # the gateway goes away mid-run ...
        sent_before = agent("otelcol_exporter_sent_spans")
        made_before = made[0]
        time.sleep(10)
        # ... the agent keeps accepting what the workers send and holds it in its queue on disk
        assert agent("otelcol_exporter_sent_spans") == sent_before
        assert agent("otelcol_exporter_queue_size") > 0
        # the agent restarts during the outage (SIGTERM; workers held meanwhile, so its counters add up exactly)
        running.clear()
        assert idle.wait(30) and handle.force_flush(10)
        accepted_first = agent("otelcol_receiver_accepted_spans")
        queued = agent("otelcol_exporter_queue_size")
        cluster.stop_process("agent")
        cluster.start_process("agent")
        running.set()
        time.sleep(10)
        assert made[0] - made_before >= 50  # the workers kept going all along
        assert agent("otelcol_exporter_queue_size") >= queued  # the backlog came back from disk, and grew
        assert agent("otelcol_exporter_sent_spans") == 0
        assert handle.stats["dropped"] == 0 and handle.stats["failed"] == 0
        cluster.start_process("gateway")  # ... and the gateway comes back
        time.sleep(5)
        stop.set()
        producer.join(30)
        assert handle.force_flush(10)
    finally:
        stop.set()
        running.set()
        handle.shutdown(5)
    stats = handle.stats
    exported = stats["exported"]
    assert stats["queued"] == exported and stats["dropped"] == 0 and stats["failed"] == 0
    assert exported >= made[0] * 4 and made[0] >= 150

    def stored() -> float:
        return cluster.counter("jaeger", "otelcol_receiver_accepted_spans")

    assert _wait(lambda: stored() >= exported, 120), (stored(), exported)
    assert accepted_first + agent("otelcol_receiver_accepted_spans") == exported
    assert sent_before + agent("otelcol_exporter_sent_spans") == exported  # the backlog left from disk
    # the restarted gateway (its counters start at 0) handed on all it took: the backlog and what followed
    backlog = cluster.counter("gateway", "otelcol_receiver_accepted_spans")
    assert backlog > 0 and cluster.counter("gateway", "otelcol_exporter_sent_spans") == backlog
    assert stored() == exported
    # into the store: Jaeger's receiver acknowledges before its storage exporter has written (its own queue)
    assert _wait(lambda: cluster.counter("jaeger", "otelcol_exporter_sent_spans") >= exported, 60)
    assert cluster.counter("jaeger", "otelcol_exporter_sent_spans") == exported
    client = JaegerClient(cluster.jaeger_url, timeout_s=30)
    depth = 2 * made[0]  # sample traces and one step trace per 5 samples
    traces = _stored_spans(client, service, since, depth)
    assert sum(map(len, traces.values())) == exported
    assert _sample_traces(client, service, since, depth) == made[0]
