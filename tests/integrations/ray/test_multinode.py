"""One switch for every node, on a real two-node Ray cluster (tests/_support/multinode.py): nodes started without
any ``OTEL_*``, a driver script (``tests/integrations/ray/multinode_driver.py``, run as ``__main__``) that joins by
address with the settings in ITS environment, tasks on both nodes, spans over real OTLP/gRPC to a receiver here."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import pytest

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import read_jsonl
from tests._support.multinode import clean_env, two_nodes
from tests._support.otlp_receiver import Receiver, start_grpc, wait_for

pytestmark = pytest.mark.e2e  # a two-node Ray cluster

pytest.importorskip("ray")

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multinode_driver.py")
INSTRUMENT = os.path.join(os.path.dirname(sys.executable), "opentelemetry-instrument")


@pytest.fixture(scope="module")
def cluster():
    receiver = Receiver()
    server, endpoint = start_grpc(receiver)
    with two_nodes() as nodes:
        yield nodes, receiver, endpoint
    server.stop(0)


def _drive(
    nodes,
    endpoint: str,
    mode: str,
    service: str,
    prefix: tuple[str, ...] = (),
    args: tuple[str, ...] = (),
    **extra: str,
):
    env = clean_env()
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_SERVICE_NAME=service,
        OTEL_RESOURCE_ATTRIBUTES=f"deployment.environment={service}-env",
        OTEL_METRICS_EXPORTER="none",
        OTEL_BSP_SCHEDULE_DELAY="50",
    )
    env.update(extra)
    out = subprocess.run(
        [*prefix, sys.executable, DRIVER, nodes.address, mode, *args],
        env=env,
        cwd=nodes.temp_dir,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert {r["node"] for r in results} == {nodes.head_node_id, nodes.worker_node_id}  # both nodes ran
    return results, out.stdout + out.stderr


def _no_trace_files(nodes) -> None:
    found = glob.glob(os.path.join(nodes.temp_dir, "**", "otel-agentloop-traces*"), recursive=True)
    assert found == []


def test_opentelemetry_instrument_alone_traces_workers_on_every_node(cluster) -> None:
    """``opentelemetry-instrument python driver.py``: no code of ours in the driver, nothing in the nodes'
    shells; workers on both nodes export to the driver's endpoint with its service name and resource."""
    nodes, receiver, endpoint = cluster
    results, _ = _drive(nodes, endpoint, "plain", "mn-instrumented", prefix=(INSTRUMENT,))
    assert all(r["exports"] == f"otlp/grpc {endpoint}" and r["service"] == "mn-instrumented" for r in results)

    def mine() -> list:
        return [r for r in receiver.records if r.resource.get("service.name") == "mn-instrumented"]

    # per task: 2 samples (each in its own step span, one per thread), each with a generation and a tool span
    assert wait_for(lambda: len(mine()) == 16, 30), len(mine())
    samples = [r for r in mine() if r.name == sc.SAMPLE_SPAN]
    assert {r.resource["ray.node.id"] for r in samples} == {nodes.head_node_id, nodes.worker_node_id}
    assert sorted(r.attributes[sc.RL_SAMPLE_INDEX] for r in samples) == [0, 1, 10, 11]
    assert all(r.resource["deployment.environment"] == "mn-instrumented-env" for r in mine())
    worker_pids = {r["pid"] for r in results}
    assert {r.resource["process.pid"] for r in mine()} == worker_pids  # the workers' own identity, not the driver's
    _no_trace_files(nodes)


def test_worker_without_the_drivers_settings_warns_once_naming_its_node_and_writes_no_file(cluster) -> None:
    """Only the setup hook, no settings handed over: each worker says once which node it is on and what is
    missing; nothing is exported and no local file appears on any node."""
    nodes, receiver, endpoint = cluster
    # Ray folds similar lines of different workers by default; here every worker's own line is counted
    results, output = _drive(nodes, endpoint, "hook", "mn-hook-only", RAY_DEDUP_LOGS="0")
    assert all(r["exports"] == "no exporter" for r in results)
    warnings = [line for line in output.splitlines() if "got no tracing settings from its driver" in line]
    for r in results:
        mine = [w for w in warnings if f"pid={r['pid']}" in w]
        assert len(mine) == 1, warnings  # once per worker process, even for 2 samples on 2 threads
        assert f"node id {r['node'][:12]}" in mine[0] and "OTEL_EXPORTER_OTLP_ENDPOINT" in mine[0]
        assert re.search(r"on node \d+\.\d+\.\d+\.\d+ ", mine[0])
    assert not [r for r in receiver.records if r.resource.get("service.name") == "mn-hook-only"]
    _no_trace_files(nodes)


def test_watchdog_warnings_and_verdicts_of_workers_reach_the_drivers_output(cluster) -> None:
    """A library in the worker set the root logger to ERROR: the watchdog's lines still reach the driver's
    terminal (Ray forwards the worker's stderr), and the merged verdict names every reported sample once,
    in the driver, where Ray's folding of similar lines from different workers cannot hide one."""
    nodes, _, endpoint = cluster
    results, output = _drive(
        nodes,
        endpoint,
        "watchdog",
        "mn-watchdog",
        OTEL_AGENTLOOP_WATCHDOG_DEFAULT="0.3",
        OTEL_AGENTLOOP_WATCHDOG_MIN="0.1",
        OTEL_AGENTLOOP_WATCHDOG_INTERVAL="0.1",
    )
    assert results[0]["hung_or_slow"] == 4
    live = [line for line in output.splitlines() if "otel_agentloop: watchdog: sample" in line]
    assert live and all("(tool search)" in line for line in live)
    assert {r["pid"] for r in results} & {int(p) for p in re.findall(r"pid=(\d+)", "\n".join(live))}
    (verdict,) = [line for line in output.splitlines() if "watchdog verdict over 2 workers" in line]
    assert "0 hung, 4 slow" in verdict
    for index in (0, 1, 10, 11):
        assert f"sample {index}/0 slow in tool_calls (tool search), trace " in verdict


def test_a_driver_writing_a_file_tells_workers_on_other_hosts_where_their_spans_go(cluster, tmp_path) -> None:
    """The driver (on another host, as its hand-off says) exports to a file: each worker writes the same
    absolute path on its own disk, and says so once, naming its node; an ``OTEL_*`` variable the driver did not
    hand over (a sampler that drops everything, as a node's shell might hold) is ignored."""
    nodes, _, endpoint = cluster
    path = str(tmp_path / "driver-traces.jsonl")
    no_endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": ""}
    results, output = _drive(nodes, endpoint, "file", "mn-file", args=(path,), RAY_DEDUP_LOGS="0", **no_endpoint)
    assert all(r["exports"] == f"file {path}" and r["service"] == "mn-file" for r in results)
    notes = [line for line in output.splitlines() if "exports to a file, so this worker writes its spans" in line]
    for r in results:
        mine = [line for line in notes if f"pid={r['pid']}" in line]
        assert len(mine) == 1 and f"node id {r['node'][:12]}" in mine[0] and path in mine[0], notes
        assert "driver-host-elsewhere" in mine[0]
    samples = [s for s in read_jsonl(path) if s.name == sc.SAMPLE_SPAN]
    assert sorted(s.attributes[sc.RL_SAMPLE_INDEX] for s in samples) == [0, 1, 10, 11]
    assert {s.resource["ray.node.id"] for s in samples} == {nodes.head_node_id, nodes.worker_node_id}
