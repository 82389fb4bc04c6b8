"""docs/engines.md's scripts, run exactly as printed (issue 38 item 4): the code blocks marked
``<!-- example: NAME -->`` are extracted verbatim and run with the engine venv's python, the session's tiny
model, Collector and Jaeger; each must exit 0 and give the nested spans the page says (sample → turn →
``llm_request``). One engine at a time: these tests use no session engine (``engines``), so they run before it
starts, the in-process script first, then the server with its client.

The environment block runs as printed too: the test's environment has no vLLM/hub variables of its own (it sets
``PY``, which the block keeps, ``MODEL`` and ``HOME``), so the block's exports are what the engine runs under."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import JaegerClient
from otel_agentloop.metrics import SpanRecord

from .conftest import ENGINE_START_S, ROOT, stack_mod, tail, trace_spans

DOC = ROOT / "docs" / "engines.md"
EXAMPLE = re.compile(r"<!-- example: (\S+) -->\n```\w*\n(.*?)\n```", re.S)
OVERRIDE = "Overriding of current TracerProvider is not allowed"


def examples() -> dict[str, str]:
    found = {name: code + "\n" for name, code in EXAMPLE.findall(DOC.read_text())}
    assert set(found) >= {"engines-env.sh", "engines-inproc.py", "engines-server.sh", "engines-client.py"}, found
    return found


def doc_env(tmp: Path, model: Path, **extra: str) -> dict[str, str]:
    """The caller's environment less anything the page's environment block is meant to set."""
    drop = ("OTEL_", "VLLM_", "HF_", "TRANSFORMERS_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop) and k not in {"DO_NOT_TRACK", "MODEL"}}
    env.update(
        PY=sys.executable,  # the engine venv's python; PYTHONPATH (this checkout) comes with the environment
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        MODEL=str(model),
        HOME=str(tmp),  # vLLM and HF write caches under HOME
        **extra,
    )
    return env


def write(tmp: Path) -> dict[str, Path]:
    paths = {}
    for name, code in examples().items():
        paths[name] = tmp / name
        paths[name].write_text(code)
    return paths


def nested(jaeger: JaegerClient, out: str, service: str, engine_service: str) -> None:
    """The trace the script printed: its sample span → a turn → vLLM's llm_request, the turn's own child."""
    found = re.search(r"^trace: ([0-9a-f]{32})$", out, re.M)
    assert found, out
    spans: list[SpanRecord] = trace_spans(jaeger, found.group(1), expect=3)
    by_id = {s.span_id: s for s in spans}
    turns = [s for s in spans if s.attributes.get(sc.RL_PHASE) == sc.GENERATE]
    engine = [s for s in spans if s.name == "llm_request"]
    assert len(turns) == 1 and len(engine) == 1, [(s.name, s.attributes) for s in spans]
    turn, child = turns[0], engine[0]
    assert child.parent_id == turn.span_id
    sample = by_id[turn.parent_id]
    assert sample.attributes.get(sc.RL_SAMPLE_INDEX) == 0, sample
    assert turn.resource.get("service.name") == service
    assert child.resource.get("service.name") == engine_service
    assert turn.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == child.attributes["gen_ai.usage.completion_tokens"]


def test_the_in_process_script_runs_as_printed(stack: stack_mod.Stack, tmp_path: Path) -> None:
    """With no model yet: the environment block makes the tiny model as printed, then the script runs on it."""
    paths = write(tmp_path)
    model = tmp_path / "tiny-qwen2"
    endpoint = stack.otlp_grpc_endpoint  # http://127.0.0.1:PORT
    cmd = f'. {paths["engines-env.sh"]} && OTEL_EXPORTER_OTLP_ENDPOINT={endpoint} "$PY" {paths["engines-inproc.py"]}'
    log = tmp_path / "inproc.log"
    with log.open("wb") as out:
        proc = subprocess.run(
            ["bash", "-c", cmd], env=doc_env(tmp_path, model), cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
            timeout=ENGINE_START_S + 120,
        )  # fmt: skip
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, tail(log)
    assert (model / "config.json").exists(), tail(log)
    assert "output tokens: 8" in text, tail(log)
    assert OVERRIDE in text, tail(log)  # the line the page explains (vLLM's provider refused; ours is global)
    nested(JaegerClient(stack.jaeger_url), text, "rollout", "rollout")


def test_the_server_and_client_scripts_run_as_printed(stack: stack_mod.Stack, model: Path, tmp_path: Path) -> None:
    paths = write(tmp_path)
    port = stack_mod.free_port()
    grpc = stack.otlp_grpc_endpoint
    env = doc_env(tmp_path, model, PORT=str(port), OTLP_ENDPOINT=grpc)
    log = tmp_path / "server.log"
    server = subprocess.Popen(
        ["bash", "-c", f'. {paths["engines-env.sh"]} && . {paths["engines-server.sh"]}'],
        env=env, cwd=tmp_path, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + ENGINE_START_S
        while True:
            assert server.poll() is None, tail(log)
            assert time.monotonic() < deadline, f"the server did not start:\n{tail(log)}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(2)
        client = subprocess.run(
            ["bash", "-c", f'. {paths["engines-env.sh"]} && "$PY" {paths["engines-client.py"]}'],
            env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": grpc, "BASE_URL": f"http://127.0.0.1:{port}"},
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert client.returncode == 0, client.stdout + client.stderr[-4000:]
        assert "completion: " in client.stdout, client.stdout
        nested(JaegerClient(stack.jaeger_url), client.stdout, "rollout", "rollout-engine")
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.mark.parametrize("name", ["engines-inproc.py", "engines-client.py"])
def test_the_printed_scripts_guard_their_entry_point(name: str) -> None:
    """vLLM's spawned engine core re-imports the main module: the scripts run only under ``__main__``."""
    assert '\nif __name__ == "__main__":' in examples()[name]
