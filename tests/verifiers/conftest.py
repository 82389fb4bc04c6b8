"""verifiers 0.4 under our instrumentation: run with the verifiers venv (``make test-verifiers``).

Outside that venv (the main ``make test`` run) nothing here is collected: verifiers is not installed there.
The vLLM tests need the engine venv too (``scripts/engine_env.sh``: vllm-cpu), found by running that script;
session fixtures make the tiny model (in a temp dir), start vLLM's OpenAI server once (minutes), and a real
OTLP/gRPC receiver in this process that both our processes and vLLM export to.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._support.vllm_cpu import VLLM_CPU_ENV

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

collect_ignore_glob = [] if importlib.util.find_spec("verifiers") is not None else ["*.py"]

ENGINE_START_S = 600
ENGINE_ENV = VLLM_CPU_ENV


@pytest.fixture(scope="session")
def engine_python() -> str:
    """The engine venv's python (vllm-cpu), built or reused by scripts/engine_env.sh."""
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "engine_env.sh")], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"no engine venv (scripts/engine_env.sh):\n{proc.stderr[-3000:]}", pytrace=False)
    return proc.stdout.strip().splitlines()[-1]


def _engine_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(ENGINE_ENV)
    env["HOME"] = str(tmp)  # vLLM and HF write caches under HOME: keep them in the test's temp dir
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def receiver() -> Iterator[tuple[object, str]]:
    """A real OTLP/gRPC receiver (tests/_support/otlp_receiver.py) that keeps every request, and its endpoint."""
    from tests._support.otlp_receiver import Receiver, start_grpc

    class Keeping(Receiver):
        def __init__(self) -> None:
            super().__init__()
            self.requests: list[object] = []

        def add(self, request, headers) -> None:  # type: ignore[no-untyped-def]
            super().add(request, headers)
            with self.lock:
                self.requests.append(request)

    recv = Keeping()
    server, endpoint = start_grpc(recv)
    try:
        yield recv, endpoint
    finally:
        server.stop(0)


@pytest.fixture(scope="session")
def vllm_server(
    engine_python: str, receiver: tuple[object, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """vLLM's OpenAI server on the tiny model, tracing to the receiver; its base URL once it answers."""
    tmp = tmp_path_factory.mktemp("vllm")
    model = tmp / "tiny-qwen2"
    make = "import sys; from tests.engine.tiny_model import make; make(__import__('pathlib').Path(sys.argv[1]))"
    subprocess.run([engine_python, "-c", make, str(model)], check=True, env=_engine_env(tmp), cwd=tmp)
    whitespace = (
        "import sys, json; from transformers import AutoTokenizer; t = AutoTokenizer.from_pretrained(sys.argv[1]); "
        "print(json.dumps({i: -100 for s, i in t.get_vocab().items() if not t.convert_tokens_to_string([s]).strip()}))"
    )
    bias = (
        subprocess.run(
            [engine_python, "-c", whitespace, str(model)],
            check=True,
            env=_engine_env(tmp),
            cwd=tmp,
            capture_output=True,
        )
        .stdout.decode()
        .strip()
        .splitlines()[-1]
    )

    port = _free_port()
    log = tmp / "server.log"
    cmd = [
        engine_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
        "--enforce-eager", "--max-model-len", "512", "--max-num-seqs", "4",
        # tool_choice="required" needs a tool parser: vLLM then forces a valid call by structured outputs
        "--enable-auto-tool-choice", "--tool-call-parser", "pythonic",
        "--otlp-traces-endpoint", receiver[1],
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        env=_engine_env(tmp, OTEL_SERVICE_NAME="vllm-server"),
        cwd=tmp,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ENGINE_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM's server exited:\n{log.read_text()[-4000:]}", pytrace=False)
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM's server did not start:\n{log.read_text()[-4000:]}", pytrace=False)
            time.sleep(2)
        yield url + "/v1", bias
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def uv_path() -> str:
    """verifiers' null harness runs its chat program with ``uv``: the bootstrap's, which
    scripts/verifiers_env.sh links alone into ``uv-bin``."""
    cache = Path(os.environ.get("OTEL_AGENTLOOP_CACHE", Path.home() / ".cache" / "otel-agentloop"))
    return str(cache / "uv-bin")


def driver_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PATH"] = uv_path() + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE)])
    env["VF_TEST_API_KEY"] = "unused"
    env.update(extra)
    return env


def python() -> str:
    return sys.executable
