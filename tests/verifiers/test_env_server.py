"""prime-rl's env-server hop, real: verifiers' own env server (``serve_env``, one ``EnvServer``) in its own
process under ``opentelemetry-instrument`` (no code change), and a trainer process with ``instrument()`` calling it
through verifiers' ``EnvClient`` inside ``oal.step(7)``, against the session's vLLM server. Each rollout the env
server ran is a sample of the trainer's step: in the step's trace (``trace_per="step"``, carried too), the step
span's child, with ``rl.step`` 7, and so are its turns (with vLLM's ``llm_request``) and its tool calls."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from otel_agentloop import semconv as sc
from otel_agentloop.metrics import SpanRecord

from .conftest import HERE, driver_env, python

STEP = 7
START_S = 300


def _server(tmp: Path, endpoint: str) -> tuple[subprocess.Popen[bytes], Path]:
    address = tmp / "address"
    cmd = [str(Path(python()).parent / "opentelemetry-instrument"), python(), str(HERE / "env_server_driver.py")]
    env = driver_env(
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_SERVICE_NAME="vf-env-server"
    )
    log = (tmp / "server.log").open("wb")
    proc = subprocess.Popen([*cmd, str(address)], cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_S
    while not address.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the env server did not start:\n{(tmp / 'server.log').read_text()[-4000:]}", pytrace=False)
        time.sleep(0.5)
    return proc, address


@pytest.fixture(scope="module")
def served(
    vllm_server: tuple[str, str], receiver: tuple[Any, str], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The trainer's result (its step span's ids, verifiers' rollouts) and every span the receiver got."""
    from tests._support.otlp_receiver import wait_for

    recv, endpoint = receiver
    url, bias = vllm_server
    tmp = tmp_path_factory.mktemp("envserver")
    proc, address = _server(tmp, endpoint)
    try:
        out = tmp / "result.json"
        cmd = [python(), str(HERE / "env_client_driver.py"), "--address-file", str(address), "--base-url", url,
               "--otlp", endpoint, "--out", str(out), "--step", str(STEP), "--logit-bias", bias]  # fmt: skip
        with (tmp / "client.log").open("wb") as log:
            rc = subprocess.run(cmd, cwd=tmp, env=driver_env(), stdout=log, stderr=subprocess.STDOUT, timeout=900)
        assert rc.returncode == 0, (tmp / "client.log").read_text()[-6000:]
        result = json.loads(out.read_text())
        ids = {r["id"] for r in result["rollouts"]}

        def samples() -> list[SpanRecord]:
            with recv.lock:
                records = list(recv.records)
            return [s for s in records if s.name == sc.SAMPLE_SPAN and s.attributes.get("verifiers.trace.id") in ids]

        wait_for(lambda: len(samples()) == len(ids), 60)
        expected = sum(r["calls"] for r in result["rollouts"])
        wait_for(lambda: sum(s.name == "llm_request" and s.trace_id == result["trace_id"] for s in recv.records)
                 >= expected, 60)  # fmt: skip
    finally:
        proc.send_signal(signal.SIGTERM)  # verifiers' serve_env ends cleanly on it: our spans are flushed at exit
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    with recv.lock:
        records = list(recv.records)
    return {"result": result, "spans": [s for s in records if s.trace_id == result["trace_id"]]}


def test_env_server_rollouts_are_samples_of_the_trainers_step(served: dict[str, Any]) -> None:
    result, spans = served["result"], served["spans"]
    assert len(result["rollouts"]) == 2
    steps = [s for s in spans if s.name == sc.STEP_SPAN]
    assert len(steps) == 1 and steps[0].span_id == result["span_id"]
    assert steps[0].resource.get("service.name") == "vf-trainer" and steps[0].attributes[sc.RL_STEP] == STEP
    by_id = {s.attributes.get("verifiers.trace.id"): s for s in spans if s.name == sc.SAMPLE_SPAN}
    for rollout in result["rollouts"]:
        sample = by_id[rollout["id"]]  # in the step's trace
        assert sample.parent_id == result["span_id"], "the sample is the trainer's step span's child"
        assert sample.resource.get("service.name") == "vf-env-server"
        assert sample.attributes[sc.RL_STEP] == STEP and sample.attributes[sc.RL_SAMPLE_INDEX] == rollout["task"]
        below = [s for s in spans if s.parent_id == sample.span_id]
        turns = [s for s in below if s.attributes.get(sc.RL_PHASE) == sc.GENERATE]
        assert len(turns) == rollout["calls"] >= 1
        for turn in turns:
            assert [c.name for c in spans if c.parent_id == turn.span_id] == ["llm_request"]
        tools = [s for s in below if s.name.startswith("execute_tool")]
        assert tools and all(s.resource.get("process.pid") != sample.resource.get("process.pid") for s in tools)
        assert all(s.attributes[sc.RL_STEP] == STEP for s in [*turns, *tools])
        assert [s.attributes[sc.RL_REWARD_SCORE] for s in below if s.name == sc.REWARD_SPAN] == [
            pytest.approx(rollout["reward"])
        ]
