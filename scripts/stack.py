#!/usr/bin/env python3
"""A real Jaeger v2 and OpenTelemetry Collector on 127.0.0.1, built from the Go module proxy and cached.

    python scripts/stack.py build     # once: ~minutes cold, instant when cached
    python scripts/stack.py up        # Collector on 4317/4318 (+8889 metrics), Jaeger's query API on 16686
    python scripts/stack.py status | down

Binaries are cached in ${OTEL_AGENTLOOP_CACHE:-~/.cache/otel-agentloop}/bin, keyed by version (and, for the
Collector, by collector/manifest.yaml's content). The processes run with the repo's config files
(collector/*.yaml); ports and directories come from the environment variables those files substitute.
`up` keeps Jaeger's traces on disk (Badger) in ${JAEGER_BADGER_DIR:-~/.local/share/otel-agentloop/jaeger}
for ${JAEGER_RETENTION:-168h}: they survive a crash or restart. Tests and benches use :func:`start` (Jaeger and
one Collector) or :func:`start_cluster` (Jaeger, a gateway and a per-node agent) with free ports and
temporary directories instead.

The natively built Jaeger serves a placeholder page instead of Jaeger's UI (its web assets are built by
Jaeger's release process, not by `go build`): read traces with `otel-agentloop report --jaeger URL` (add
`--html step.html` for the step's timeline page) or through the query API (api_v3).

Jaeger: the module proxy here serves Jaeger's v1.76.0 tag (the commit of v2.13.0; `cmd/jaeger` is the v2
binary) but not newer commits, and its go.mod has a `replace`, which `go install` refuses: it is built from
collector/jaeger-build, a main module that repeats the replace (its go.sum is committed). The sum database is
not reachable through this proxy for every module, so builds run with GOSUMDB=off: hashes are checked against
go.sum (committed for Jaeger; written by the builder for the Collector).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLLECTOR_DIR = ROOT / "collector"
JAEGER_VERSION = "v1.76.0"  # == Jaeger v2.13.0
COLLECTOR_VERSION = "v0.155.0"
CACHE = Path(os.environ.get("OTEL_AGENTLOOP_CACHE", Path.home() / ".cache" / "otel-agentloop"))
JAEGER_BIN = CACHE / "bin" / f"jaeger-{JAEGER_VERSION}" / "jaeger"
# The Collector's components come from collector/manifest.yaml: its binary is keyed by the manifest's content
# too, so a changed manifest (a component added) builds a new binary instead of reusing the old one.
MANIFEST_KEY = hashlib.sha256((COLLECTOR_DIR / "manifest.yaml").read_bytes()).hexdigest()[:12]
COLLECTOR_BIN = CACHE / "bin" / f"otelcol-agentloop-{COLLECTOR_VERSION}-{MANIFEST_KEY}" / "otelcol-agentloop"
BUILDER_BIN = CACHE / "bin" / f"builder-{COLLECTOR_VERSION}" / "builder"
RUN_DIR = CACHE / "run"
# Data that must outlive a cache wipe: Jaeger's trace store of `up` (JAEGER_BADGER_DIR overrides it).
DATA = Path(os.environ.get("OTEL_AGENTLOOP_DATA", Path.home() / ".local" / "share" / "otel-agentloop"))
JAEGER_COLD, COLLECTOR_COLD = "3-10 min", "1-5 min"  # measured from an empty cache, idle vs busy machine (README)
DEFAULT_PORTS = {
    "grpc": 4317,
    "http": 4318,
    "prometheus": 8889,
    "otelcol_health": 13134,
    "otelcol_metrics": 8890,
    "query": 16686,
    "query_grpc": 16685,
    "jaeger_health": 13133,
    "jaeger_metrics": 8888,
    "jaeger_otlp_grpc": 14317,
    "jaeger_otlp_http": 14318,
    "gateway_grpc": 4417,
    "gateway_http": 4418,
    "gateway_health": 13135,
    "gateway_metrics": 8891,
}


class StackError(RuntimeError):
    """The stack cannot be built or started; the message says what is missing."""


def _go_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(CGO_ENABLED="0", GOSUMDB="off", GOFLAGS="-buildvcs=false")
    return env


def _run(cmd: list[str], cwd: Path, what: str, timeout: float, progress: str | None = None, **extra_env: str) -> None:
    """Run one Go step; with ``progress`` (the usual duration, e.g. "5-10 min"), say every 30 s that it still runs."""
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env={**_go_env(), **extra_env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    except FileNotFoundError as exc:
        raise StackError(f"{what}: {cmd[0]} not found") from exc
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(proc.stdout or ()), daemon=True)
    reader.start()
    while True:
        try:
            proc.wait(30)
            break
        except subprocess.TimeoutExpired:
            elapsed = time.monotonic() - t0
            if elapsed > timeout:
                proc.kill()
                proc.wait()
                raise StackError(f"{what}: timed out after {timeout:.0f} s ({' '.join(cmd)})") from None
            if progress:
                print(f"  ... {what}: {elapsed / 60:.1f} min so far (usually {progress} on 2 cores)", flush=True)
    reader.join(5)
    if proc.returncode != 0:
        tail = "\n".join("".join(output).strip().splitlines()[-15:])
        raise StackError(f"{what} failed ({' '.join(cmd)}); is the Go module proxy reachable?\n{tail}")


def build(verbose: bool = True) -> dict[str, float]:
    """Build (or find cached) Jaeger and the Collector; returns seconds spent per binary (0 when cached)."""
    if missing() and shutil.which("go") is None:
        raise StackError(
            "the Go toolchain is not installed (need Go >= 1.24 on PATH to build Jaeger and the "
            "OpenTelemetry Collector); on Debian: apt-get install golang, or see go.dev/doc/install"
        )
    timings = {"jaeger": build_jaeger(verbose), "collector": build_collector(verbose)}
    if verbose and not any(timings.values()):
        print(f"Jaeger and Collector: cached in {CACHE / 'bin'}")
    elif verbose:
        print(f"binaries ready (built: Jaeger {timings['jaeger']:.0f} s, Collector {timings['collector']:.0f} s)")
    return timings


def build_jaeger(verbose: bool = True) -> float:
    """Build Jaeger unless cached; returns the seconds spent."""
    if JAEGER_BIN.exists():
        return 0.0
    t0 = time.monotonic()
    if verbose:
        print(
            f"building Jaeger {JAEGER_VERSION} (v2.13.0) into {JAEGER_BIN} (once; usually {JAEGER_COLD} "
            "on 2 cores, then cached) ...",
            flush=True,
        )
    JAEGER_BIN.parent.mkdir(parents=True, exist_ok=True)
    _run(
        ["go", "build", "-trimpath", "-o", str(JAEGER_BIN), "github.com/jaegertracing/jaeger/cmd/jaeger"],
        COLLECTOR_DIR / "jaeger-build",
        "building Jaeger",
        3600,
        progress=JAEGER_COLD if verbose else None,
    )
    return time.monotonic() - t0


def build_collector(verbose: bool = True) -> float:
    """Build the Collector of collector/manifest.yaml unless cached; returns the seconds spent."""
    if COLLECTOR_BIN.exists():
        return 0.0
    t0 = time.monotonic()
    if verbose:
        print(
            f"building the OpenTelemetry Collector {COLLECTOR_VERSION} into {COLLECTOR_BIN} (once; usually "
            f"{COLLECTOR_COLD} on 2 cores, then cached) ...",
            flush=True,
        )
    if not BUILDER_BIN.exists():
        BUILDER_BIN.parent.mkdir(parents=True, exist_ok=True)
        _run(
            ["go", "install", f"go.opentelemetry.io/collector/cmd/builder@{COLLECTOR_VERSION}"],
            ROOT,
            "installing the Collector builder",
            1800,
            progress="1 min" if verbose else None,
            GOBIN=str(BUILDER_BIN.parent),
        )
    out = CACHE / "build" / f"otelcol-{COLLECTOR_VERSION}-{MANIFEST_KEY}"
    out.mkdir(parents=True, exist_ok=True)  # the builder creates only the last path component
    _run(
        [str(BUILDER_BIN), "--config", str(COLLECTOR_DIR / "manifest.yaml"), "--output-path", str(out)],
        ROOT,
        "building the Collector",
        3600,
        progress=COLLECTOR_COLD if verbose else None,
    )
    COLLECTOR_BIN.parent.mkdir(parents=True, exist_ok=True)
    tmp = COLLECTOR_BIN.with_suffix(".part")  # a concurrent start never sees a half-copied binary
    shutil.copy2(out / "otelcol-agentloop", tmp)
    tmp.replace(COLLECTOR_BIN)
    return time.monotonic() - t0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config_env(ports: dict[str, int], data_dir: Path | None = None, queue_dir: Path | None = None) -> dict[str, str]:
    """The variables the config files substitute (collector.yaml, agent.yaml, gateway.yaml, jaeger.yaml), for
    ``ports`` on 127.0.0.1, Jaeger's Badger store in ``data_dir`` and the Collectors' disk queues below
    ``queue_dir``. Variables whose directory is not given are left to the caller's environment (or the files'
    defaults)."""
    env = {
        "OTELCOL_HOST": "127.0.0.1",
        "OTELCOL_GRPC_PORT": str(ports["grpc"]),
        "OTELCOL_HTTP_PORT": str(ports["http"]),
        "OTELCOL_PROMETHEUS_PORT": str(ports["prometheus"]),
        "OTELCOL_HEALTH_PORT": str(ports["otelcol_health"]),
        "OTELCOL_METRICS_PORT": str(ports["otelcol_metrics"]),
        "OTELCOL_GATEWAY_ENDPOINT": f"127.0.0.1:{ports['gateway_grpc']}",
        "GATEWAY_HOST": "127.0.0.1",
        "GATEWAY_GRPC_PORT": str(ports["gateway_grpc"]),
        "GATEWAY_HTTP_PORT": str(ports["gateway_http"]),
        "GATEWAY_HEALTH_PORT": str(ports["gateway_health"]),
        "GATEWAY_METRICS_PORT": str(ports["gateway_metrics"]),
        "GATEWAY_PROMETHEUS_PORT": str(ports["prometheus"]),
        "JAEGER_OTLP_ENDPOINT": f"127.0.0.1:{ports['jaeger_otlp_grpc']}",
        "JAEGER_HOST": "127.0.0.1",
        "JAEGER_QUERY_PORT": str(ports["query"]),
        "JAEGER_QUERY_GRPC_PORT": str(ports["query_grpc"]),
        "JAEGER_HEALTH_PORT": str(ports["jaeger_health"]),
        "JAEGER_METRICS_PORT": str(ports["jaeger_metrics"]),
        "JAEGER_OTLP_GRPC_PORT": str(ports["jaeger_otlp_grpc"]),
        "JAEGER_OTLP_HTTP_PORT": str(ports["jaeger_otlp_http"]),
    }
    if data_dir is not None:
        env["JAEGER_BADGER_DIR"] = str(data_dir)
    if queue_dir is not None:
        env["OTELCOL_QUEUE_DIR"] = str(queue_dir / "agent")
        env["GATEWAY_QUEUE_DIR"] = str(queue_dir / "gateway")
    return env


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def read_counter(url: str, name: str) -> float:
    """The sum over all series of the Prometheus counter ``name`` (``_total`` suffix optional) at ``url``."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return sum(float(m) for m in re.findall(rf"^{name}(?:_total)?(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))


# Each process: its config file, the port of its health endpoint (and the path), the port of its own metrics.
PROCESSES = {
    "jaeger": ("jaeger.yaml", "jaeger_health", "/status", "jaeger_metrics"),
    "collector": ("collector.yaml", "otelcol_health", "/", "otelcol_metrics"),
    "agent": ("agent.yaml", "otelcol_health", "/", "otelcol_metrics"),
    "gateway": ("gateway.yaml", "gateway_health", "/", "gateway_metrics"),
}
STOP_ORDER = ("agent", "collector", "gateway", "jaeger")  # senders first, so they can hand on what they hold


@dataclass
class Stack:
    """Running processes of the stack: Jaeger with a Collector in front (``collector``), or the cluster
    topology on one machine (``agent`` -> ``gateway`` -> Jaeger). Each can be stopped, killed and started
    again with the same ports, store and queues (``stop_process``/``kill``/``start_process``).

    Jaeger's Badger store lives in ``data_dir``, the Collectors' disk queues below ``queue_dir``; a directory
    the stack made itself (``owned``) is removed by :meth:`stop`."""

    ports: dict[str, int]
    log_dir: Path
    data_dir: Path
    queue_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    owned: list[Path] = field(default_factory=list)

    @property
    def otlp_grpc_endpoint(self) -> str:
        """Where workers send (the Collector, or the agent)."""
        return f"http://127.0.0.1:{self.ports['grpc']}"

    @property
    def otlp_http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['http']}"

    @property
    def jaeger_url(self) -> str:
        """Jaeger's query API (api_v3); the natively built Jaeger serves no UI there."""
        return f"http://127.0.0.1:{self.ports['query']}"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['prometheus']}/metrics"

    def metrics_url(self, name: str) -> str:
        """The URL of process ``name``'s own Prometheus metrics (otelcol_receiver_accepted_spans, ...)."""
        return f"http://127.0.0.1:{self.ports[PROCESSES[name][3]]}/metrics"

    def counter(self, name: str, metric: str) -> float:
        """Counter ``metric`` of process ``name``, summed over its series."""
        return read_counter(self.metrics_url(name), metric)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}  # Jaeger traces itself otherwise
        env.update(config_env(self.ports, self.data_dir, self.queue_dir))
        return env

    def start_process(self, name: str, timeout: float = 60) -> None:
        """Start ``name`` (see :data:`PROCESSES`) and wait until its health endpoint answers."""
        config, health_port, health_path, _ = PROCESSES[name]
        binary = JAEGER_BIN if name == "jaeger" else COLLECTOR_BIN
        health = f"http://127.0.0.1:{self.ports[health_port]}{health_path}"
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        self.procs[name] = subprocess.Popen(
            [str(binary), "--config", str(COLLECTOR_DIR / config)],
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not _healthy(health):
            if self.procs[name].poll() is not None or time.monotonic() > deadline:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-20:]
                self.stop()
                raise StackError(f"{name} did not become healthy at {health}:\n" + "\n".join(tail))
            time.sleep(0.1)

    def start_jaeger(self, timeout: float = 60) -> None:
        self.start_process("jaeger", timeout)

    def start_collector(self, timeout: float = 60) -> None:
        self.start_process("collector", timeout)

    def stop_collector(self) -> None:
        self.stop_process("collector")

    def stop_process(self, name: str, timeout: float = 30) -> None:
        """SIGTERM ``name`` (a Collector hands on what it holds, Jaeger closes its store); SIGKILL after
        ``timeout`` s."""
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def kill(self, name: str) -> None:
        """SIGKILL ``name``, as a crash or the OOM killer would: no shutdown work at all."""
        proc = self.procs.pop(name, None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.procs.items() if p.poll() is None}

    def stop(self) -> None:
        for name in STOP_ORDER:
            self.stop_process(name)
        for path in self.owned:
            shutil.rmtree(path, ignore_errors=True)
        self.owned.clear()


def missing() -> list[Path]:
    """The binaries that ``build`` still has to make."""
    return [p for p in (JAEGER_BIN, COLLECTOR_BIN) if not p.exists()]


def prepare(
    ports: dict[str, int] | None = None,
    log_dir: Path | None = None,
    data_dir: Path | None = None,
    queue_dir: Path | None = None,
) -> Stack:
    """A stack with nothing started yet: free ports unless given; Jaeger's store and the queues in fresh
    temporary directories (removed by :meth:`Stack.stop`) unless given. Never builds: a build takes minutes
    and belongs before the tests (``make stack-build``), not inside a test's timeout."""
    if missing():
        raise StackError(
            "not built yet: " + ", ".join(map(str, missing())) + " (run `make stack-build`; `make test` does it first)"
        )
    if ports is None:
        ports = {name: free_port() for name in DEFAULT_PORTS}
    log_dir = log_dir or RUN_DIR
    log_dir.mkdir(parents=True, exist_ok=True)
    owned = []
    if data_dir is None:
        data_dir = Path(tempfile.mkdtemp(prefix="oal-jaeger-badger-"))
        owned.append(data_dir)
    if queue_dir is None:
        queue_dir = Path(tempfile.mkdtemp(prefix="oal-otelcol-queue-"))
        owned.append(queue_dir)
    return Stack(ports, log_dir, data_dir, queue_dir, owned=owned)


def start(
    ports: dict[str, int] | None = None,
    log_dir: Path | None = None,
    data_dir: Path | None = None,
    queue_dir: Path | None = None,
) -> Stack:
    """Start Jaeger (Badger on disk) and one Collector in front of it (collector/collector.yaml); see
    :func:`prepare` for the arguments; bounded waits."""
    stack = prepare(ports, log_dir, data_dir, queue_dir)
    stack.start_process("jaeger")
    stack.start_process("collector")
    return stack


def start_cluster(
    ports: dict[str, int] | None = None,
    log_dir: Path | None = None,
    data_dir: Path | None = None,
    queue_dir: Path | None = None,
) -> Stack:
    """Start the cluster topology on this machine: Jaeger, the gateway (collector/gateway.yaml) and one agent
    (collector/agent.yaml) that workers send to (``otlp_grpc_endpoint``); see :func:`prepare`."""
    stack = prepare(ports, log_dir, data_dir, queue_dir)
    for name in ("jaeger", "gateway", "agent"):
        stack.start_process(name)
    return stack


def _pid_file() -> Path:
    return RUN_DIR / "stack.json"


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else "status"
    try:
        if command == "build":
            build()
        elif command == "up":
            if _pid_file().exists():
                print("stack already up (scripts/stack.py down first)")
                return 0
            build()
            data_dir = Path(os.environ.get("JAEGER_BADGER_DIR") or DATA / "jaeger")
            stack = start(dict(DEFAULT_PORTS), data_dir=data_dir, queue_dir=DATA / "queue")
            _pid_file().write_text(json.dumps(stack.pids()))
            retention = os.environ.get("JAEGER_RETENTION") or "168h"
            print(f"Jaeger: traces on disk in {data_dir} (Badger; kept {retention}: set JAEGER_RETENTION to change)")
            print(f"Jaeger query API: {stack.jaeger_url}/api/v3/services   (this native build serves no Jaeger UI)")
            print(f"  pages of a step: otel-agentloop report --jaeger {stack.jaeger_url} --html step.html")
            print(
                f"OTLP: export OTEL_EXPORTER_OTLP_ENDPOINT={stack.otlp_grpc_endpoint}   "
                f"(HTTP: {stack.otlp_http_endpoint})"
            )
            print(f"spanmetrics: {stack.prometheus_url}   logs: {RUN_DIR}")
        elif command == "down":
            if not _pid_file().exists():
                print("stack not running")
                return 0
            for name, pid in json.loads(_pid_file().read_text()).items():
                try:
                    os.killpg(pid, signal.SIGTERM)
                    print(f"stopped {name} ({pid})")
                except ProcessLookupError:
                    pass
            _pid_file().unlink()
        elif command == "status":
            ok_j = _healthy(f"http://127.0.0.1:{DEFAULT_PORTS['jaeger_health']}/status")
            ok_c = _healthy(f"http://127.0.0.1:{DEFAULT_PORTS['otelcol_health']}/")
            print(f"jaeger: {'up' if ok_j else 'down'}   collector: {'up' if ok_c else 'down'}")
            return 0 if ok_j and ok_c else 1
        else:
            print(__doc__)
            return 2
    except StackError as exc:
        print(f"stack: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
