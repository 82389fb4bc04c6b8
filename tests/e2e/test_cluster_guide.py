"""docs/cluster.md's step-by-step guide, run as written: the commands of its Jaeger, gateway, agent and check
blocks (marked ``<!-- guide:NAME -->``) are read from the page and run here with the real binaries, every host
name and ``0.0.0.0`` made ``127.0.0.1``, each default port a free one and each absolute folder one under the
test's temp dir; everything else (the programs, ``env -i``, the variables and their values, the arguments) is
the page's. A simulated run sent to the agent is then listed by the page's ``report --runs --jaeger`` command.

The variables the page sets are checked against the ``${env:NAME}`` each config file substitutes, so a renamed
variable fails here instead of being silently ignored by the Collector."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import stack_mod

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "cluster.md"
HOSTS = ("jaeger-host", "gateway-host", "0.0.0.0")
BY_PORT = {port: name for name, port in stack_mod.DEFAULT_PORTS.items()}
HEALTH = {"jaeger": ("jaeger_health", "/status"), "gateway": ("gateway_health", "/"), "agent": ("otelcol_health", "/")}


@dataclass
class Command:
    env: dict[str, str]
    """The variables the page sets on this command line (``PATH`` aside)."""
    clean: bool
    """``env -i``: started without the caller's environment."""
    argv: list[str]


def guide_block(name: str) -> str:
    """The shell block after ``<!-- guide:NAME -->`` in docs/cluster.md."""
    found = re.search(rf"<!-- guide:{name} -->\n```bash\n(.*?)\n```", DOC.read_text(), re.S)
    assert found, f"docs/cluster.md has no guide:{name} block"
    return found.group(1)


def commands(name: str) -> list[Command]:
    out = []
    for line in guide_block(name).replace("\\\n", " ").splitlines():
        tokens = shlex.split(line, comments=True)
        if not tokens or tokens[0] == "cd":  # ``cd ~/otelcol``: the folder the files were copied to
            continue
        clean = tokens[:2] == ["env", "-i"]
        tokens = tokens[2:] if clean else tokens
        env: dict[str, str] = {}
        while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
            key, _, value = tokens.pop(0).partition("=")
            env[key] = value
        if env.get("PATH") == "$PATH":  # ``env -i PATH="$PATH"``: the caller's PATH, no setting
            del env["PATH"]
        out.append(Command(env, clean, tokens))
    return out


def localise(value: str, ports: dict[str, int], tmp: Path) -> str:
    """The page's value on this machine: hosts -> 127.0.0.1, default ports -> free ones, /abs -> tmp/abs."""
    for host in HOSTS:
        value = value.replace(host, "127.0.0.1")
    value = re.sub(
        r"127\.0\.0\.1:(\d+)",
        lambda m: f"127.0.0.1:{ports[BY_PORT[int(m[1])]] if int(m[1]) in BY_PORT else m[1]}",
        value,
    )
    return str(tmp / value.lstrip("/")) if value.startswith("/") else value


def config_variables(config: str) -> set[str]:
    return set(re.findall(r"\$\{env:([A-Z0-9_]+)", (stack_mod.COLLECTOR_DIR / config).read_text()))


@dataclass
class Started:
    procs: list[subprocess.Popen[bytes]]

    def stop(self) -> None:
        for proc in reversed(self.procs):  # agent, gateway, then Jaeger: senders first
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)


@pytest.fixture
def started(tmp_path: Path) -> Iterator[tuple[Started, dict[str, int]]]:
    if stack_mod.missing():
        pytest.fail(f"not built yet: {stack_mod.missing()} (make stack-build)", pytrace=False)
    ports = {name: stack_mod.free_port() for name in stack_mod.DEFAULT_PORTS}
    defaults = {k: v for k, v in stack_mod.config_env(ports).items() if k.endswith("_PORT")}
    running = Started([])
    try:
        for name in ("jaeger", "gateway", "agent"):
            (command,) = commands(name)
            program, *args = command.argv
            binary = {"./jaeger": stack_mod.JAEGER_BIN, "./otelcol-agentloop": stack_mod.COLLECTOR_BIN}[program]
            config = args[args.index("--config") + 1]
            args[args.index("--config") + 1] = str(stack_mod.COLLECTOR_DIR / config)
            base = {"PATH": os.environ["PATH"]} if command.clean else dict(os.environ)
            env = {**base, **defaults, **{k: localise(v, ports, tmp_path) for k, v in command.env.items()}}
            log = open(tmp_path / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
            running.procs.append(
                subprocess.Popen(
                    [str(binary), *args],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=tmp_path,
                    start_new_session=True,
                )
            )
            log.close()
            port, path = HEALTH[name]
            deadline = time.monotonic() + 60
            while not stack_mod._healthy(f"http://127.0.0.1:{ports[port]}{path}"):
                tail = (tmp_path / f"{name}.log").read_text(errors="replace")[-3000:]
                assert running.procs[-1].poll() is None and time.monotonic() < deadline, f"{name}:\n{tail}"
                time.sleep(0.2)
        yield running, ports
    finally:
        running.stop()


def test_the_guides_commands_set_only_variables_their_config_reads() -> None:
    """Each variable on a guide command line is one its config file substitutes; the Jaeger and gateway commands
    listen beyond 127.0.0.1 (``*_HOST=0.0.0.0``), the agent stays on it; Jaeger starts without ``OTEL_*``."""
    for name, config, host in (
        ("jaeger", "jaeger.yaml", "JAEGER_HOST"),
        ("gateway", "gateway.yaml", "GATEWAY_HOST"),
        ("agent", "agent.yaml", "OTELCOL_HOST"),
    ):
        (command,) = commands(name)
        assert command.argv[1:] == ["--config", config], command.argv
        assert set(command.env) <= config_variables(config), set(command.env) - config_variables(config)
        assert command.env.get(host) == (None if name == "agent" else "0.0.0.0"), command.env
        assert command.clean, name  # env -i: no OTEL_* of the shell reaches Jaeger's (or a Collector's) own telemetry
    (gateway,) = commands("gateway")
    (agent,) = commands("agent")
    assert gateway.env["JAEGER_OTLP_ENDPOINT"] == "jaeger-host:14317"
    assert agent.env["OTELCOL_GATEWAY_ENDPOINT"] == "gateway-host:4417"


def test_the_guides_jaeger_gateway_and_agent_carry_a_run_that_report_then_lists(started, tmp_path: Path) -> None:
    """Steps 2, 3, 4 and 6 of the guide on one machine: the simulated run goes agent -> gateway -> Jaeger, and the
    page's ``report --runs --jaeger ... --service cluster-check`` lists it: 1 step, 4 samples."""
    _, ports = started
    simulate, report = commands("check")
    bin_dir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}

    def run(command: Command) -> subprocess.CompletedProcess[str]:
        program, *args = command.argv
        assert program == "otel-agentloop"
        argv = [str(bin_dir / program), *(localise(a, ports, tmp_path) for a in args)]
        return subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)

    sent = run(simulate)
    assert sent.returncode == 0, sent.stderr[-3000:]
    assert f"otlp/grpc http://127.0.0.1:{ports['grpc']}" in sent.stdout + sent.stderr, sent.stdout[-2000:]
    deadline = time.monotonic() + 60
    while True:
        listed = run(report)
        lines = [line for line in listed.stdout.splitlines() if "cluster-check" in line]
        if (listed.returncode == 0 and lines) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert listed.returncode == 0 and len(lines) == 1, listed.stdout + listed.stderr
    assert "1..1 (1)" in lines[0] and "4" in lines[0].split(), lines[0]


def test_the_guides_binary_paths_come_from_stack_py() -> None:
    """Step 1: ``python scripts/stack.py which collector|jaeger`` prints the built binaries' paths."""
    script = ROOT / "scripts" / "stack.py"
    for name, path in (("collector", stack_mod.COLLECTOR_BIN), ("jaeger", stack_mod.JAEGER_BIN)):
        assert f"python scripts/stack.py which {name}" in DOC.read_text()
        out = subprocess.run([sys.executable, str(script), "which", name], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == str(path), out.stdout + out.stderr
