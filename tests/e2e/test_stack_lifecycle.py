"""`scripts/stack.py up/status/down` as a user runs them (subprocesses), after crashes and PID reuse.

Each test gets its own run dir (state and logs), data dir and free ports through the environment
(OTEL_AGENTLOOP_RUN_DIR, OTEL_AGENTLOOP_DATA and the port variables the config files substitute).
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .conftest import stack_mod, stack_procs
from .stack_cli import SCRIPT, STOPPED, Cli

Identity = stack_procs.Identity


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    cli = Cli(tmp_path)
    yield cli
    if cli.state_file.exists():  # a failed test leaves nothing running
        cli("down")


def _ok(result: subprocess.CompletedProcess[str], code: int = 0) -> str:
    assert result.returncode == code, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _crash(*procs: Identity) -> None:
    """SIGKILL, as the OOM killer would, and wait (bounded) until they have exited."""
    for ident in procs:
        assert stack_procs.identity(ident.pid) == ident
        os.kill(ident.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(stack_procs.identity(i.pid) == i for i in procs):
        assert time.monotonic() < deadline, "SIGKILLed processes did not exit"
        time.sleep(0.05)


def _query_api_answers(cli: Cli) -> None:
    url = f"http://127.0.0.1:{cli.ports['query']}/api/v3/services"
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        json.loads(response.read())


def _says_where_things_are(out: str, cli: Cli) -> None:
    query = f"http://127.0.0.1:{cli.ports['query']}"
    assert f"OTLP gRPC 127.0.0.1:{cli.ports['grpc']}, OTLP HTTP 127.0.0.1:{cli.ports['http']}" in out
    assert f"Jaeger query API: {query}/api/v3/services" in out
    assert f"{query}/ is a placeholder page" in out
    assert f"otel-agentloop report --jaeger {query}" in out
    assert "docker compose" in out


def test_up_status_down_agree_after_crashes(cli: Cli) -> None:
    if stack_mod.missing():
        pytest.fail(f"not built: {stack_mod.missing()} (make stack-build)", pytrace=False)
    out = _ok(cli("up"))
    first = cli.saved()
    assert set(first) == {"jaeger", "collector"}
    assert f"started jaeger (pid {first['jaeger'].pid}), collector (pid {first['collector'].pid})" in out
    _says_where_things_are(out, cli)
    out = _ok(cli("status"))
    assert f"jaeger: up (pid {first['jaeger'].pid})   collector: up (pid {first['collector'].pid})" in out
    _says_where_things_are(out, cli)
    _query_api_answers(cli)

    # half up: the Collector crashed; status says so, `up` restarts only the Collector on the same ports
    _crash(first["collector"])
    out = _ok(cli("status"), 1)
    assert f"collector (pid {first['collector'].pid}) has exited" in out
    assert f"jaeger: up (pid {first['jaeger'].pid})   collector: down" in out
    assert "half up: `make up` starts collector again" in out
    out = _ok(cli("up"))
    assert "starting collector" in out
    second = cli.saved()
    assert second["jaeger"] == first["jaeger"] and second["collector"] != first["collector"]
    _ok(cli("status"))

    # both crashed: every command says down, and `up` starts them again (it once said "already up")
    _crash(second["jaeger"], second["collector"])
    out = _ok(cli("status"), STOPPED)
    assert "stale state removed" in out and "jaeger: down   collector: down" in out
    assert not cli.state_file.exists()
    out = _ok(cli("down"))
    assert out == "stack not running\n"
    out = _ok(cli("up"))
    assert "started jaeger" in out and "already up" not in out
    third = cli.saved()
    _query_api_answers(cli)

    # down returns when the processes have exited and nothing listens on their ports any more
    out = _ok(cli("down"))
    for name in ("collector", "jaeger"):
        assert f"{name} (pid {third[name].pid}) exited" in out
        assert stack_procs.identity(third[name].pid) is None
    assert out.count("its ports are free") == 2
    assert [p for p in cli.our_ports() if stack_procs.port_busy(p)] == []
    assert not cli.state_file.exists()
    out = _ok(cli("status"), STOPPED)
    assert out.startswith("jaeger: down   collector: down\n")


def test_up_names_a_port_another_program_holds_and_starts_nothing(cli: Cli) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", cli.ports["query"]))
        other.listen()
        result = cli("up")
        assert result.returncode == 1 and not cli.state_file.exists()
        assert f"port(s) {cli.ports['query']} (JAEGER_QUERY_PORT) in use by another program" in result.stderr
        out = _ok(cli("status"), STOPPED)
        assert f"another program listens on {cli.ports['query']} (JAEGER_QUERY_PORT)" in out


JAEGER_ARGV = (str(stack_mod.JAEGER_BIN), "--config", str(stack_mod.COLLECTOR_DIR / "jaeger.yaml"))
# What the state file says of the process holding the sleeper's PID, given the sleeper's real identity.
FOREIGN: dict[str, Callable[[Identity], object]] = {
    "pid reused": lambda me: Identity(me.pid, me.start_time - 500, JAEGER_ARGV).to_json(),
    "same command line, other start time": lambda me: Identity(me.pid, me.start_time - 1, me.cmdline).to_json(),
    "same start time, other command line": lambda me: Identity(me.pid, me.start_time, JAEGER_ARGV).to_json(),
}


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait(10)


@pytest.mark.parametrize("case", sorted(FOREIGN))
def test_down_leaves_a_foreign_process_alone(cli: Cli, sleeper: subprocess.Popen[bytes], case: str) -> None:
    me = stack_procs.identity(sleeper.pid)
    assert me is not None and me.cmdline == ("sleep", "300")
    cli.write_state({"jaeger": FOREIGN[case](me)})
    out = _ok(cli("down"))
    assert f"pid {me.pid} is no longer our jaeger but `sleep 300`: left alone" in out
    assert "stale state removed" in out and out.endswith("stack not running\n")
    assert sleeper.poll() is None and stack_procs.identity(sleeper.pid) == me
    assert not cli.state_file.exists()
    _ok(cli("status"), STOPPED)
    assert sleeper.poll() is None


def test_down_leaves_pids_of_an_old_state_file_alone(cli: Cli, sleeper: subprocess.Popen[bytes]) -> None:
    cli.run_dir.mkdir(parents=True)
    cli.state_file.write_text(json.dumps({"jaeger": sleeper.pid}))  # what stack.py wrote before it saved identities
    out = _ok(cli("down"))
    assert "not a state this version wrote" in out and f"pid {sleeper.pid} now runs `sleep 300`" in out
    assert sleeper.poll() is None and not cli.state_file.exists()


def test_down_stops_a_process_whose_identity_matches(cli: Cli, sleeper: subprocess.Popen[bytes]) -> None:
    """The control of the tests above: the same check lets `down` stop the saved process itself."""
    me = stack_procs.identity(sleeper.pid)
    assert me is not None
    cli.write_state({"jaeger": me.to_json()})
    out = _ok(cli("status"), 1)
    assert f"jaeger: up (pid {me.pid})   collector: down" in out
    out = _ok(cli("down"))
    assert f"jaeger (pid {me.pid}) exited" in out and "after SIGTERM" in out
    assert sleeper.wait(10) == -signal.SIGTERM
    assert not cli.state_file.exists()


def test_status_does_not_touch_the_state_while_up_or_down_runs(cli: Cli, sleeper: subprocess.Popen[bytes]) -> None:
    me = stack_procs.identity(sleeper.pid)
    assert me is not None
    cli.write_state({"jaeger": FOREIGN["pid reused"](me)})
    with open(cli.run_dir / "stack.lock", "w") as lock:  # as `up` holds it while it builds and starts
        fcntl.flock(lock, fcntl.LOCK_EX)
        out = _ok(cli("status"), STOPPED)
        assert "`up` or `down` runs now" in out and "left as it is" in out and cli.state_file.exists()
    out = _ok(cli("status"), STOPPED)
    assert "stale state removed" in out and not cli.state_file.exists()
    assert sleeper.poll() is None


def test_down_kills_a_process_that_ignores_sigterm(cli: Cli) -> None:
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(300)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == "ready\n"
        me = stack_procs.identity(stubborn.pid)
        assert me is not None
        cli.write_state({"collector": me.to_json()})
        cli.env["OTEL_AGENTLOOP_STOP_TIMEOUT"] = "1"
        out = _ok(cli("down"))
        assert f"collector (pid {me.pid}) did not exit within 1 s of SIGTERM: killed with SIGKILL" in out
        assert stubborn.wait(10) == -signal.SIGKILL
    finally:
        stubborn.kill()
        stubborn.wait(10)


def test_build_progress_gives_measured_ranges_and_says_when_load_makes_it_longer() -> None:
    cold = stack_mod.JAEGER_COLD
    assert cold.progress(60) == "cold builds took 2.8-5.7 min on 2 cores at load average 1-8"
    assert cold.progress(343) == cold.progress(60)
    late = cold.progress(28 * 60)
    assert late.startswith("past the 2.8-5.7 min on 2 cores at load average 1-8: a loaded machine takes longer (")
    assert "load average now" in late and "~28 min" in late and "usually" not in late
    assert stack_mod.COLLECTOR_COLD.usual() == "2.0-4.1 min on 2 cores at load average 1-8"


def test_which_prints_the_cached_binaries_a_cluster_node_copies(tmp_path: Path) -> None:
    """docs/cluster.md copies these paths to each node: they are the binaries `up` runs, and they run."""
    cli = Cli(tmp_path)
    for name, expected in (("collector", stack_mod.COLLECTOR_BIN), ("jaeger", stack_mod.JAEGER_BIN)):
        out = subprocess.run(
            [sys.executable, str(SCRIPT), "which", name], env=cli.env, capture_output=True, text=True, timeout=600
        )
        assert out.returncode == 0, out.stderr
        path = Path(out.stdout.strip().splitlines()[-1])
        assert path == expected and os.access(path, os.X_OK)
        assert subprocess.run([str(path), "--help"], capture_output=True, timeout=60).returncode == 0
    bad = subprocess.run([sys.executable, str(SCRIPT), "which", "nope"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "which jaeger|collector" in bad.stderr
