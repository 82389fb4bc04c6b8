"""A stock verl run on a real two-node Ray cluster started elsewhere (tests/_support/multinode.py: nodes without any
``OTEL_*``): the driver (tests/verl/multinode_verl_driver.py, verl's real ``run_ppo`` with the command line's
Hydra overrides) joins it by address with the settings in ITS environment only.

- ``opentelemetry-instrument python -m verl.trainer.main_ppo ...`` (with or without the setup-hook flag):
  verl's agent-loop worker actors on both nodes export to the driver's endpoint with its settings.
- The setup-hook flag alone (no ``opentelemetry-instrument``): ``otel_agentloop_startup.pth`` sees the flag in
  the driver's ``sys.argv`` and wraps ``ray.init`` there, so the same happens. With the opt-out
  (``OTEL_AGENTLOOP_STARTUP_HOOK=false``) the flag cannot carry the driver's settings (Ray runs the hook only
  in workers, which see their node's environment): every worker says so once, naming its node, and writes
  no file.
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import ray_scenarios as rs

from otel_agentloop import semconv as sc
from tests._support.multinode import two_nodes
from tests._support.otlp_receiver import Receiver, start_grpc

HOOK = "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=otel_agentloop.integrations.verl.setup_worker"
DRIVER = str(rs.ROOT / "tests" / "verl" / "multinode_verl_driver.py")
INSTRUMENT = str(Path(sys.executable).parent / "opentelemetry-instrument")
VERL_PATH = str(rs.ROOT / "tests" / "verl")


@pytest.fixture(scope="module")
def cluster():
    receiver = Receiver()
    server, endpoint = start_grpc(receiver)
    with two_nodes(python=sys.executable, extra_path=VERL_PATH, timeout_s=240) as nodes:
        yield nodes, receiver, endpoint
    server.stop(0)


@pytest.fixture(scope="module")
def entry_points() -> str:
    """This checkout's ``opentelemetry_instrumentor`` entry points for the driver's interpreter. The shared verl
    venv installs the package from the main checkout and is rebuilt when pyproject.toml changes
    (scripts/verl_env.sh); until then its metadata may lack the ``ray`` entry point, so a dist-info made
    from this checkout's pyproject.toml goes first on the driver's path."""
    eps = {e.name for e in importlib.metadata.entry_points(group="opentelemetry_instrumentor")}
    if "ray" in eps:
        return ""
    import tomllib

    project = tomllib.loads((rs.ROOT / "pyproject.toml").read_text())["project"]
    folder = tempfile.mkdtemp(prefix="oal-eps")
    info = Path(folder) / "otel_agentloop-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: otel-agentloop\nVersion: 0.0.0\n")
    lines = ["[opentelemetry_instrumentor]"]
    lines += [f"{k} = {v}" for k, v in project["entry-points"]["opentelemetry_instrumentor"].items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="module")
def startup_pth() -> str:
    """A path entry that gives the driver this checkout's ``otel_agentloop_startup.pth`` as an install does.

    An install puts the file in site-packages, where ``site`` processes it at startup. The shared verl venv
    installs the package from the main checkout, and is rebuilt when pyproject.toml changes
    (scripts/verl_env.sh); until then it may lack the file, so a scratch ``sitecustomize`` (run by ``site``
    right after site-packages) calls ``site.addsitedir`` on a scratch dir holding only this checkout's file:
    the same line, run by the same code of ``site``, with the driver's unchanged ``sys.argv``."""
    import site

    pth = rs.ROOT / "otel_agentloop_startup.pth"
    installed = [Path(d) / pth.name for d in site.getsitepackages()]
    if any(p.exists() and p.read_text() == pth.read_text() for p in installed):
        return ""
    folder = Path(tempfile.mkdtemp(prefix="oal-pth"))
    (folder / "site").mkdir()
    (folder / "site" / pth.name).write_text(pth.read_text())
    (folder / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(folder / 'site')!r})\n")
    return str(folder)


def _run(
    nodes,
    endpoint: str,
    service: str,
    mode: str,
    overrides: list[str],
    prefix: tuple[str, ...],
    path: str = "",
    extra_env: dict[str, str] | None = None,
):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RAY_ADDRESS"))}
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_SERVICE_NAME=service,
        OTEL_METRICS_EXPORTER="none",
        OTEL_BSP_SCHEDULE_DELAY="50",
        RAY_DEDUP_LOGS="0",  # count every worker's own line
        PYTHONPATH=os.pathsep.join(p for p in (path, VERL_PATH, str(rs.ROOT)) if p),
    )
    env.update(extra_env or {})
    out = subprocess.run(
        [*prefix, sys.executable, DRIVER, nodes.address, mode, *overrides],
        env=env,
        cwd=nodes.temp_dir,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-6000:])
    result = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("{")))
    return result, out.stdout + out.stderr


def _no_trace_files(nodes) -> None:
    assert glob.glob(os.path.join(nodes.temp_dir, "**", "otel-agentloop-traces*"), recursive=True) == []


def test_opentelemetry_instrument_on_stock_run_ppo_traces_agent_loop_workers_on_every_node(cluster, entry_points):
    nodes, receiver, endpoint = cluster
    result, _ = _run(nodes, endpoint, "verl-mn", "full", [HOOK], (INSTRUMENT,), entry_points)
    workers = [result["runner"], *result["actors"], result["node2_task"]]
    assert all(w["instrumented"] and w["exports"] == f"otlp/grpc {endpoint}" for w in workers), workers
    assert {a["node"] for a in result["actors"]} == {nodes.head_node_id, nodes.worker_node_id}

    def samples() -> list:
        return [
            r
            for r in receiver.records
            if r.name == sc.SAMPLE_SPAN and r.attributes.get(sc.RL_STEP) == 31 and r.attributes.get(sc.RL_SAMPLE_UID)
        ]

    n = rs.N_PROMPTS * rs.N_SESSIONS
    assert rs.wait_for(lambda: len(samples()) == n, timeout=30), len(samples())
    assert {r.resource["ray.node.id"] for r in samples()} == {nodes.head_node_id, nodes.worker_node_id}
    assert all(r.resource["service.name"] == "verl-mn" for r in samples())
    records = list(receiver.records)
    for s in samples():  # each sample's generation and reward arrived below it, from its node
        below = rs.descendants(rs.children(records), s.span_id)
        assert any(r.attributes.get(sc.RL_PHASE) == sc.GENERATE for r in below)
        assert all(r.resource["ray.node.id"] == s.resource["ray.node.id"] for r in below)
    _no_trace_files(nodes)


def test_opentelemetry_instrument_alone_is_the_switch_without_the_hook_flag(cluster, entry_points):
    nodes, receiver, endpoint = cluster
    result, _ = _run(nodes, endpoint, "verl-mn-noflag", "light", [], (INSTRUMENT,), entry_points)
    for w in (result["runner"], result["node2_task"]):  # verl's hook, added by the driver's ray.init
        assert w["instrumented"] and w["exports"] == f"otlp/grpc {endpoint}", w
    assert result["node2_task"]["node"] == nodes.worker_node_id
    assert rs.wait_for(
        lambda: any(
            r.name == sc.SAMPLE_SPAN
            and r.resource.get("service.name") == "verl-mn-noflag"
            and r.resource.get("ray.node.id") == nodes.worker_node_id
            for r in receiver.records
        ),
        timeout=30,
    )


def test_the_hook_flag_alone_traces_agent_loop_workers_on_every_node_with_the_drivers_settings(cluster, startup_pth):
    """A stock command line with only verl's setup-hook flag, no ``opentelemetry-instrument``: the startup
    ``.pth`` wraps ``ray.init`` in the driver, so verl's agent-loop worker actors on both nodes export to the
    driver's endpoint with its service name, and no file is written anywhere."""
    nodes, receiver, endpoint = cluster
    result, output = _run(nodes, endpoint, "verl-mn-flag", "full", [HOOK], (), startup_pth)
    workers = [result["runner"], *result["actors"], result["node2_task"]]
    assert all(w["instrumented"] and w["exports"] == f"otlp/grpc {endpoint}" for w in workers), workers
    assert {a["node"] for a in result["actors"]} == {nodes.head_node_id, nodes.worker_node_id}
    assert "got no tracing settings from its driver" not in output

    def samples() -> list:
        return [
            r
            for r in receiver.records
            if r.name == sc.SAMPLE_SPAN
            and r.attributes.get(sc.RL_STEP) == 31
            and r.attributes.get(sc.RL_SAMPLE_UID)
            and r.resource.get("service.name") == "verl-mn-flag"
        ]

    n = rs.N_PROMPTS * rs.N_SESSIONS
    assert rs.wait_for(lambda: len(samples()) == n, timeout=30), len(samples())
    assert {r.resource["ray.node.id"] for r in samples()} == {nodes.head_node_id, nodes.worker_node_id}
    records = list(receiver.records)
    for s in samples():  # each sample's generation arrived below it, from its node
        below = rs.descendants(rs.children(records), s.span_id)
        assert any(r.attributes.get(sc.RL_PHASE) == sc.GENERATE for r in below)
        assert all(r.resource["ray.node.id"] == s.resource["ray.node.id"] for r in below)
    _no_trace_files(nodes)


def test_the_hook_flag_with_the_opt_out_warns_on_every_node_and_writes_no_file(cluster, startup_pth):
    """``OTEL_AGENTLOOP_STARTUP_HOOK=false``: no code of ours runs in the driver, and Ray runs the hook only in
    workers, so the driver's settings cannot reach a cluster started elsewhere. Each worker says so once,
    naming its node and the missing endpoint, records metrics only, and leaves no file behind."""
    nodes, receiver, endpoint = cluster
    result, output = _run(
        nodes, endpoint, "verl-mn-optout", "light", [HOOK], (), startup_pth, {"OTEL_AGENTLOOP_STARTUP_HOOK": "false"}
    )
    warnings = [line for line in output.splitlines() if "got no tracing settings from its driver" in line]
    for w in (result["runner"], result["node2_task"]):
        assert w["instrumented"] and w["exports"] == "no exporter", w
        mine = [line for line in warnings if f"pid={w['pid']}" in line]
        assert len(mine) == 1 and f"node id {w['node'][:12]}" in mine[0], warnings
        assert "OTEL_EXPORTER_OTLP_ENDPOINT" in mine[0] and "opentelemetry-instrument" in mine[0]
        assert re.search(r"on node \d+\.\d+\.\d+\.\d+ ", mine[0])
    assert not [r for r in receiver.records if r.resource.get("service.name") == "verl-mn-optout"]
    _no_trace_files(nodes)
