"""TRL 1.16's GRPOTrainer generating with a vLLM server (``vllm_mode="server"``, vllm-cpu 0.32) on CPU, both
processes under ``opentelemetry-instrument`` with no code change (our ``trl`` entry point): each engine request's
``llm_request`` span (vLLM's own tracing, ``--otlp-traces-endpoint``) is the child of its sample's turn, though
TRL posts one request per batch and vLLM fans each prompt out into ``num_generations`` child requests. Runs in the
venv scripts/trl_vllm_env.sh builds (``make test-trl``); skipped where vLLM is not installed next to TRL.

The server is what ``trl vllm-serve`` runs: TRL's own ``build_command`` (vLLM's OpenAI server with TRL's
settings), started as ``python -m vllm.entrypoints.openai.api_server``: ``trl vllm-serve`` execs ``vllm serve``,
whose CLI reads the version of a distribution named ``vllm``, which vllm-cpu is not (PackageNotFoundError)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests._support.otlp_receiver import Receiver, start_grpc, wait_for
from tests._support.vllm_cpu import TRL_VLLM_CPU_ENV

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed here (scripts/trl_vllm_env.sh)"
)
ROWS_PER_STEP = 4  # per_device_train_batch_size (2 prompts x num_generations 2: one request, n=2)
STEPS = 2
CPU_ENV = TRL_VLLM_CPU_ENV


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(tmp: Path, endpoint: str | None, service: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(CPU_ENV)
    env["HOME"] = str(tmp)  # vLLM and HF write caches under HOME
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    if endpoint is not None:
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
            OTEL_SERVICE_NAME=service,
            OTEL_METRICS_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
        )
    return env


def _instrumented(args: list[str]) -> list[str]:
    return [str(Path(sys.executable).with_name("opentelemetry-instrument")), *args]


def _start_server(model: Path, tmp: Path, endpoint: str) -> tuple[subprocess.Popen[bytes], str]:
    from trl.scripts.vllm_serve import ScriptArguments, build_command

    port = _free_port()
    script = ScriptArguments(model=str(model), host="127.0.0.1", port=port, max_model_len=256, enforce_eager=True)
    command = build_command(script, ["--otlp-traces-endpoint", endpoint])
    serve = command.index("serve")  # `vllm serve MODEL ...` as the module vllm-cpu can run (module docstring)
    args = [command[0], "-m", "vllm.entrypoints.openai.api_server", "--model", *command[serve + 1 :]]
    env = _env(tmp, endpoint, "trl-vllm-server")
    env["VLLM_SERVER_DEV_MODE"] = "1"  # as trl vllm-serve sets it
    tmp.mkdir(parents=True, exist_ok=True)
    log = (tmp / "server.log").open("wb")
    server = subprocess.Popen(
        _instrumented(args), env=env, cwd=tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        assert server.poll() is None, (tmp / "server.log").read_text()[-4000:]
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as response:
                if response.status == 200:
                    return server, url
        except OSError:
            pass
        time.sleep(2)
    _stop(server)
    raise AssertionError("the vLLM server did not start: " + (tmp / "server.log").read_text()[-4000:])


def _stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(30)


def _train(model: Path, tmp: Path, url: str, *, endpoint: str | None) -> dict[str, Any]:
    tmp.mkdir(parents=True, exist_ok=True)
    out = tmp / "out.json"
    args = [sys.executable, str(Path(__file__).with_name("vllm_server_run.py")), str(out), str(model), url]
    if endpoint is not None:  # no code change: opentelemetry-instrument loads our entry points
        args = _instrumented(args)
    done = subprocess.run(
        args, env=_env(tmp, endpoint, "trl-vllm-trainer"), cwd=tmp, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def test_each_server_request_nests_under_its_samples_turn(models: dict[str, Path], tmp_path: Path) -> None:
    receiver = Receiver()
    grpc_server, endpoint = start_grpc(receiver)
    rows = ROWS_PER_STEP * STEPS
    try:
        server, url = _start_server(models["plain"], tmp_path / "server", endpoint)
        try:
            traced = _train(models["plain"], tmp_path / "traced", url, endpoint=endpoint)
            plain = _train(models["plain"], tmp_path / "plain", url, endpoint=None)
        finally:
            _stop(server)
        # the server traces every request: the plain trainer's too, as roots (they carry no traceparent)
        assert wait_for(lambda: sum(r.name == "llm_request" for r in receiver.records) >= 2 * rows, 30)
    finally:
        grpc_server.stop(None)
    records = list(receiver.records)
    by_id = {r.span_id: r for r in records}
    turns = [r for r in records if r.name.startswith("text_completion")]
    requests = [r for r in records if r.name == "llm_request"]
    assert len(turns) == rows and len(requests) == 2 * rows, Counter(r.name for r in records)
    engine = [r for r in requests if r.parent_id]
    assert len(engine) == rows, [r.parent_id for r in requests]  # the traced run's: nested; the plain run's: roots
    children: dict[int, list[Any]] = {}
    for request in engine:
        children.setdefault(request.parent_id, []).append(request)
    prompts: dict[str, set[tuple[Any, Any]]] = {}
    for turn in turns:
        mine = children.get(turn.span_id, [])
        assert len(mine) == 1, (turn.attributes, [by_id.get(r.parent_id) for r in engine][:2])
        request = mine[0]
        assert request.trace_id == turn.trace_id
        sample = by_id[turn.parent_id]
        assert sample.name == "rl.sample" and sample.trace_id == turn.trace_id
        assert request.attributes["gen_ai.usage.prompt_tokens"] == turn.attributes["gen_ai.usage.input_tokens"]
        assert request.attributes["gen_ai.usage.completion_tokens"] == turn.attributes["gen_ai.usage.output_tokens"]
        key = (sample.attributes["rl.sample.index"], sample.attributes["rl.sample.rollout_n"])
        prompts.setdefault(str(request.attributes["gen_ai.request.id"]), set()).add(key)
    # each vLLM prompt request (one id, n=2 children) serves the 2 generations of one prompt, one child each
    assert len(prompts) == rows // 2
    for keys in prompts.values():
        assert len(keys) == 2 and len({k[0] for k in keys}) == 1 and {k[1] for k in keys} == {0, 1}, prompts
    samples = {(by_id[t.parent_id].trace_id, by_id[t.parent_id].span_id) for t in turns}
    assert len(samples) == rows
    # never harm: the same completions and losses with and without instrument() on the trainer (seeded requests)
    assert traced["completions"] == plain["completions"] and len(plain["completions"]) == rows
    assert traced["losses"] == plain["losses"] and len(plain["losses"]) == STEPS
