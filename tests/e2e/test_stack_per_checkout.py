"""One local stack per checkout (issue 38, item 1), with the real Jaeger and Collector binaries.

Two checkouts (two directories holding the stack's scripts, configs and the one module that derives a stack's
ports and directories) run two stacks at once, each named by ``OTEL_AGENTLOOP_STACK``: spans a job sends to each
(``otel-agentloop simulate`` with the endpoint ``scripts/stack.py env`` exports) land only in that stack's Jaeger,
where ``report --jaeger`` without a URL finds them; `down` from the other checkout refuses without ``--force`` and
leaves the stack running; `down` in one leaves the other running. Every command runs with a temporary HOME (the
state, logs and data below it; the cached binaries reached through a link), on ports checked free.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from otel_agentloop.config import _local_stack as local_stack

from .conftest import stack_mod, stack_procs

ROOT = Path(__file__).resolve().parents[2]
OUR_VARS = ("OTEL_", "OTELCOL_", "JAEGER_", "GATEWAY_", "OPENSEARCH_")


def _checkout(at: Path) -> Path:
    """A second checkout as far as the stack goes: its scripts, its collector configs, the one module."""
    shutil.copytree(ROOT / "scripts", at / "scripts", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "collector", at / "collector")
    module = at / "otel_agentloop" / "config" / "_local_stack.py"
    module.parent.mkdir(parents=True)
    shutil.copy2(ROOT / "otel_agentloop" / "config" / "_local_stack.py", module)
    return at


def _free_name(taken: set[int]) -> str:
    """A stack name whose ports (every one `up` uses) are free and whose offset no other name here has."""
    for _ in range(200):
        name = f"t{secrets.token_hex(3)}"
        offset = local_stack.port_offset(name)
        if offset in taken:
            continue
        if not any(stack_procs.port_busy(p) for p in local_stack.ports(name).values()):
            taken.add(offset)
            return name
    pytest.fail("no stack name with free ports")


@dataclass
class Checkout:
    """One checkout's `scripts/stack.py` and `otel-agentloop`, as a user runs them, for the stack ``name``."""

    root: Path
    home: Path

    def env(self, name: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(OUR_VARS)}
        env.update(HOME=str(self.home), OTEL_AGENTLOOP_STACK=name)
        return env

    def stack(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, str(self.root / "scripts" / "stack.py"), *args]
        return subprocess.run(cmd, env=self.env(name), cwd=self.root, capture_output=True, text=True, timeout=240)

    def exports(self, name: str) -> dict[str, str]:
        """What `eval "$(python3 scripts/stack.py env)"` sets."""
        out = self.stack(name, "env")
        assert out.returncode == 0, out.stderr
        lines = [line.removeprefix("export ") for line in out.stdout.splitlines() if line.startswith("export ")]
        return dict(line.split("=", 1) for line in lines)

    def cli(self, name: str, cwd: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        env = {**self.env(name), **extra}
        cmd = [sys.executable, "-m", "otel_agentloop", *args]
        return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=180)


def _ok(out: subprocess.CompletedProcess[str], code: int = 0) -> str:
    assert out.returncode == code, f"exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out.stdout


def _services(query_port: int) -> set[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{query_port}/api/v3/services", timeout=10) as r:
        return set(json.load(r).get("services") or [])


def _arrives(service: str, query_port: int, within_s: float = 60.0) -> bool:
    """Whether ``service`` shows up in that Jaeger within ``within_s`` (the Collector batches before it sends)."""
    deadline = time.monotonic() + within_s
    while service not in _services(query_port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[Checkout, Checkout, str, str]]:
    if stack_mod.missing():
        pytest.fail(f"not built: {stack_mod.missing()} (make stack-build)", pytrace=False)
    home = tmp_path / "home"
    (home / ".cache" / "otel-agentloop").mkdir(parents=True)
    (home / ".cache" / "otel-agentloop" / "bin").symlink_to(stack_mod.CACHE / "bin")
    a, b = Checkout(_checkout(tmp_path / "a"), home), Checkout(_checkout(tmp_path / "b"), home)
    taken = {0}
    names = _free_name(taken), _free_name(taken)
    yield a, b, *names
    for checkout, name in ((a, names[0]), (b, names[1])):  # a failed test leaves nothing running
        if checkout.stack(name, "down", "--force").returncode == 2:  # a stack.py without --force
            checkout.stack(name, "down")


def test_two_checkouts_run_two_stacks_and_neither_disturbs_the_other(
    two: tuple[Checkout, Checkout, str, str], tmp_path: Path
) -> None:
    a, b, name_a, name_b = two
    ports_a, ports_b = local_stack.ports(name_a), local_stack.ports(name_b)
    assert "started jaeger" in _ok(a.stack(name_a, "up"))
    assert "started jaeger" in _ok(b.stack(name_b, "up"))
    for checkout, name, ports in ((a, name_a, ports_a), (b, name_b, ports_b)):
        state = json.loads((a.home / ".cache" / "otel-agentloop" / f"run-{name}" / "stack.json").read_text())
        assert state["checkout"] == str(checkout.root) and state["stack"] == name
        assert state["ports"]["grpc"] == ports["grpc"] and state["ports"]["query"] == ports["query"]
        assert state["data_dir"] == str(a.home / ".local" / "share" / "otel-agentloop" / "stacks" / name / "jaeger")
        out = _ok(checkout.stack(name, "status"))
        assert f"stack {name!r} (OTEL_AGENTLOOP_STACK), started by the checkout {checkout.root}" in out

    # a job in each checkout sends to its own stack (the endpoint `env` exports) and `report --jaeger` without a
    # URL reads that stack's Jaeger
    for checkout, name in ((a, name_a), (b, name_b)):
        job = tmp_path / f"job-{name}"
        job.mkdir()
        exports = checkout.exports(name)
        assert exports["OTEL_AGENTLOOP_STACK"] == name
        sim = ("simulate", "--workers", "0", "--steps", "1", "--prompts", "2", "--rollout-n", "1", "--quiet")
        run = checkout.cli(name, job, *sim, "--time-scale", "0.01", "--val-every", "0", "--service-name", f"sim-{name}",
                           OTEL_EXPORTER_OTLP_ENDPOINT=exports["OTEL_EXPORTER_OTLP_ENDPOINT"])  # fmt: skip
        assert "failed: 0" in _ok(run) and not (job / "otel-agentloop-traces").exists()
    assert _arrives(f"sim-{name_a}", ports_a["query"]) and _arrives(f"sim-{name_b}", ports_b["query"])
    assert f"sim-{name_a}" not in _services(ports_b["query"]) and f"sim-{name_b}" not in _services(ports_a["query"])
    for checkout, name in ((a, name_a), (b, name_b)):
        report = checkout.cli(name, tmp_path, "report", "--jaeger", "--runs")
        assert report.returncode == 0, report.stderr
        assert f"sim-{name}" in report.stdout + report.stderr

    # another checkout: `status` names the one that started it; `down` refuses and leaves it running
    out = _ok(b.stack(name_a, "status"))
    assert out.splitlines()[0] == (
        f"stack: stack {name_a!r} (OTEL_AGENTLOOP_STACK) was started by the checkout {a.root}, not this one "
        f"({b.root}): shown as it is; `make up` and `make down` act on it only with FORCE=1"
    )
    refused = b.stack(name_a, "down")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr == (
        f"stack: not stopped: stack {name_a!r} (OTEL_AGENTLOOP_STACK) was started by the checkout {a.root}, not "
        f"this one ({b.root}); `make down FORCE=1` (scripts/stack.py down --force) stops it\n"
    )
    assert _ok(b.stack(name_a, "up"), 1) == ""
    assert "jaeger: up (pid" in _ok(a.stack(name_a, "status")) and _services(ports_a["query"])

    # `down` in one checkout leaves the other's stack running
    _ok(a.stack(name_a, "down"))
    assert _ok(a.stack(name_a, "status"), 3).splitlines()[-1].startswith(f"stack stopped: stack {name_a!r}")
    assert not any(stack_procs.port_busy(p) for p in ports_a.values())
    assert "jaeger: up (pid" in _ok(b.stack(name_b, "status"))
    assert f"sim-{name_b}" in _services(ports_b["query"])

    # --force acts on another checkout's stack
    out = _ok(a.stack(name_b, "down", "--force"))
    assert "jaeger (pid" in out and "its ports are free" in out
    assert not any(stack_procs.port_busy(p) for p in ports_b.values())


def test_make_status_on_a_stopped_stack_says_stopped_and_succeeds(tmp_path: Path) -> None:
    """`make status` exits 0 with a "stack stopped" line (scripts/stack.py status: 3), not make's "Error 1"."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(OUR_VARS) and not k.startswith("MAKE")}
    env.update(HOME=str(home), OTEL_AGENTLOOP_STACK=_free_name({0}))
    out = subprocess.run(["make", "-s", "status"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Error" not in out.stderr and out.stderr == ""
    assert out.stdout.splitlines()[0] == "jaeger: down   collector: down"
    assert out.stdout.splitlines()[1].startswith("stack stopped: stack ")
    direct = subprocess.run([sys.executable, "scripts/stack.py", "status"], cwd=ROOT, env=env, capture_output=True)
    assert direct.returncode == 3


def test_named_stacks_never_share_a_port_with_another_stack() -> None:
    """Every offset a name can get keeps each of its ports apart from every port of every other stack (the default
    one included), OpenSearch's too, and below the kernel's range for outgoing connections."""

    def every_port(offset: int) -> set[int]:
        base = local_stack.OPENSEARCH_PORT_BASE + offset
        return {p + offset for p in local_stack.DEFAULT_PORTS.values()} | {base + i for i in (1, 2, 3, 101, 102, 103)}

    offsets = [0] + [local_stack.OFFSET_STEP * k for k in range(1, local_stack.OFFSET_SLOTS + 1)]
    seen: dict[int, int] = {}
    for offset in offsets:
        ports = every_port(offset)
        assert len(ports) == len(local_stack.DEFAULT_PORTS) + 6
        clash = {p: seen[p] for p in ports if p in seen}
        assert not clash, (offset, clash)
        seen.update(dict.fromkeys(ports, offset))
    assert max(seen) < 32768 and min(seen) > 1024
    assert {local_stack.port_offset(f"n{i}") for i in range(2000)} <= set(offsets[1:])
    assert local_stack.port_offset(None) == 0 and local_stack.port_offset("exp-2") == local_stack.port_offset("exp-2")
    for bad in ("", "a b", "../x", "-x", "x" * 33):
        with pytest.raises(ValueError, match="is not a stack name"):
            local_stack.check_name(bad)
