#!/usr/bin/env python3
"""A real Jaeger v2 and OpenTelemetry Collector on 127.0.0.1, built from the Go module proxy and cached: the
library behind ``scripts/stack.py`` (`make up`), ``scripts/stack_store.py`` (the cluster store), the tests and
the benches.

Tests and benches use :func:`start` (Jaeger and one Collector) or :func:`start_cluster` (Jaeger, a gateway and a
per-node agent) with free ports (:func:`free_port`) and temporary directories; :func:`build` builds what is
missing (:func:`missing`). Ports come from the variables the config files substitute (OTELCOL_GRPC_PORT,
JAEGER_QUERY_PORT, ...: :data:`PORT_VARS`), else :data:`DEFAULT_PORTS`. :class:`Saved` is what `up` keeps of
a running stack in :func:`state_file`.

Binaries are cached in ${OTEL_AGENTLOOP_CACHE:-~/.cache/otel-agentloop}/bin, keyed by version (and, for the
Collector, by collector/manifest.yaml's content). The processes run with the repo's config files
(collector/*.yaml); ports and directories come from the environment variables those files substitute.

Jaeger: the module proxy here serves Jaeger's v1.76.0 tag (the commit of v2.13.0; `cmd/jaeger` is the v2
binary) but not newer commits, and its go.mod has a `replace`, which `go install` refuses: it is built from
collector/jaeger-build, a main module that repeats the replace (its go.sum is committed). The sum database is
not reachable through this proxy for every module, so builds run with GOSUMDB=off: hashes are checked against
go.sum (committed for Jaeger; written by the builder for the Collector).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from stack_procs import Identity

ROOT = Path(__file__).resolve().parent.parent


def _load_local_stack() -> ModuleType:
    """otel_agentloop/config/_local_stack.py, by its path: the one place a stack's name, ports and directories are
    derived (the package's `report --jaeger` reads it too), loaded without the package (a bare python3 runs us)."""
    path = ROOT / "otel_agentloop" / "config" / "_local_stack.py"
    spec = importlib.util.spec_from_file_location("otel_agentloop_local_stack", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


local_stack = _load_local_stack()
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


def _stack_name() -> str | None:
    raw = os.environ.get(local_stack.VARIABLE, "").strip()
    try:
        return local_stack.check_name(raw) if raw else None
    except ValueError as exc:
        raise SystemExit(f"stack: {local_stack.VARIABLE}={raw!r} {exc}") from None


# Which stack (OTEL_AGENTLOOP_STACK=NAME; unset: the default one): it derives the run and data directories and
# a port offset (otel_agentloop/config/_local_stack.py).
STACK = _stack_name()
# `up`'s logs and saved state (stack.json); OTEL_AGENTLOOP_RUN_DIR moves them without moving the binaries.
RUN_DIR = Path(os.environ.get("OTEL_AGENTLOOP_RUN_DIR") or local_stack.run_dir(CACHE, STACK))
# Data that must outlive a cache wipe (JAEGER_BADGER_DIR and OPENSEARCH_DATA_DIR override its parts); STACK_DATA:
# this stack's (DATA itself for the default stack).
DATA = Path(os.environ.get("OTEL_AGENTLOOP_DATA", Path.home() / ".local" / "share" / "otel-agentloop"))
STACK_DATA = local_stack.data_dir(DATA, STACK)


def _span(low_s: float, high_s: float) -> str:
    if high_s < 180:
        return f"{low_s:.0f}-{high_s:.0f} s"
    return f"{low_s / 60:.1f}-{high_s / 60:.1f} min"


def _load() -> str:
    try:
        return f"load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    except OSError:
        return f"{os.cpu_count()} cores"


@dataclass(frozen=True)
class ColdBuild:
    """A binary's measured build time from an empty cache (``low_s``-``high_s`` on ``machine``), and the
    slowest build seen with the load it ran under (``slowest``)."""

    low_s: float
    high_s: float
    machine: str
    slowest: str

    def usual(self) -> str:
        return f"{_span(self.low_s, self.high_s)} on {self.machine}"

    def progress(self, elapsed: float) -> str:
        """What to say about ``elapsed`` s of building: the measured range, or, past it, why it takes longer."""
        if elapsed <= self.high_s:
            return f"cold builds took {self.usual()}"
        return f"past the {self.usual()}: a loaded machine takes longer ({_load()}; {self.slowest})"


# Measured from empty Go module and build caches, builder included for the Collector (2 cores; load averages
# read while building: 165 s and 246 s came with ~8 from other work, 276-343 s and 122-123 s nearer idle).
JAEGER_COLD = ColdBuild(165, 343, "2 cores at load average 1-8", "~28 min seen on 2 heavily loaded cores")
COLLECTOR_COLD = ColdBuild(122, 246, "2 cores at load average 1-8", "not measured under heavier load")
DEFAULT_PORTS = dict(local_stack.DEFAULT_PORTS)  # the default stack's; a named one adds its offset


class StackError(RuntimeError):
    """The stack cannot be built or started; the message says what is missing."""


def _go_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(CGO_ENABLED="0", GOSUMDB="off", GOFLAGS="-buildvcs=false")
    return env


def _run(
    cmd: list[str],
    cwd: Path,
    what: str,
    timeout: float,
    progress: ColdBuild | None = None,
    since: float | None = None,
    hint: str = "is the Go module proxy reachable?",
    **extra_env: str,
) -> None:
    """Run one Go step; with ``progress``, say every 30 s how long the binary's build has taken (since
    ``since``, a monotonic time, default now) against its measured cold build time."""
    t0 = time.monotonic()
    since = t0 if since is None else since
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
                spent = time.monotonic() - since
                print(f"  ... {what}: {spent / 60:.1f} min so far ({progress.progress(spent)})", flush=True)
    reader.join(5)
    if proc.returncode != 0:
        tail = "\n".join("".join(output).strip().splitlines()[-15:])
        raise StackError(f"{what} failed ({' '.join(cmd)}); {hint}\n{tail}")


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
            f"building Jaeger {JAEGER_VERSION} (v2.13.0) into {JAEGER_BIN} (once, then cached; cold builds "
            f"took {JAEGER_COLD.usual()}, {JAEGER_COLD.slowest}) ...",
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
            f"building the OpenTelemetry Collector {COLLECTOR_VERSION} into {COLLECTOR_BIN} (once, then cached; "
            f"cold builds took {COLLECTOR_COLD.usual()}, {COLLECTOR_COLD.slowest}) ...",
            flush=True,
        )
    if not BUILDER_BIN.exists():
        BUILDER_BIN.parent.mkdir(parents=True, exist_ok=True)
        _run(
            ["go", "install", f"go.opentelemetry.io/collector/cmd/builder@{COLLECTOR_VERSION}"],
            ROOT,
            "installing the Collector builder",
            1800,
            progress=COLLECTOR_COLD if verbose else None,
            since=t0,
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
        since=t0,
    )
    COLLECTOR_BIN.parent.mkdir(parents=True, exist_ok=True)
    tmp = COLLECTOR_BIN.with_suffix(".part")  # a concurrent start never sees a half-copied binary
    shutil.copy2(out / "otelcol-agentloop", tmp)
    tmp.replace(COLLECTOR_BIN)
    return time.monotonic() - t0


# The variable each config file substitutes for each port of DEFAULT_PORTS (the gateway's spanmetrics port,
# GATEWAY_PROMETHEUS_PORT, follows "prometheus").
PORT_VARS = {
    "grpc": "OTELCOL_GRPC_PORT",
    "http": "OTELCOL_HTTP_PORT",
    "prometheus": "OTELCOL_PROMETHEUS_PORT",
    "otelcol_health": "OTELCOL_HEALTH_PORT",
    "otelcol_metrics": "OTELCOL_METRICS_PORT",
    "query": "JAEGER_QUERY_PORT",
    "query_grpc": "JAEGER_QUERY_GRPC_PORT",
    "jaeger_health": "JAEGER_HEALTH_PORT",
    "jaeger_metrics": "JAEGER_METRICS_PORT",
    "jaeger_otlp_grpc": "JAEGER_OTLP_GRPC_PORT",
    "jaeger_otlp_http": "JAEGER_OTLP_HTTP_PORT",
    "gateway_grpc": "GATEWAY_GRPC_PORT",
    "gateway_http": "GATEWAY_HTTP_PORT",
    "gateway_health": "GATEWAY_HEALTH_PORT",
    "gateway_metrics": "GATEWAY_METRICS_PORT",
}


def ports_from_env() -> dict[str, int]:
    """:data:`STACK`'s ports (:data:`DEFAULT_PORTS` plus its offset), each replaced by its variable of
    :data:`PORT_VARS` where the environment sets it."""
    ports = local_stack.ports(STACK)
    for key, var in PORT_VARS.items():
        value = os.environ.get(var, "").strip()
        if value:
            if not value.isdigit() or not 0 < int(value) < 65536:
                raise StackError(f"{var}={value!r} is not a port number")
            ports[key] = int(value)
    return ports


_HANDED_OUT: set[int] = set()
_PORT_FLOOR = 10_000
"""The lowest port :func:`free_port` hands out (below it: well-known services and the defaults of many tools)."""


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's default when it cannot be read)."""
    try:
        low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port() -> int:
    """A port no listener holds on 127.0.0.1, for a server started next. Taken below the kernel's ephemeral range
    (``ip_local_port_range``), so that no outgoing connection of any process can take it between this answer and
    the server's bind (a port from ``bind(0)`` lies inside that range: measured lost to such a race in CI). Never
    the same port twice in one process. Falls back to ``bind(0)`` when that range leaves no room below it."""
    low, _ = _ephemeral_range()
    candidates = list(range(_PORT_FLOOR, low))
    random.SystemRandom().shuffle(candidates)
    for port in candidates[:2000]:
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    _HANDED_OUT.add(port)
    return port


def free_ports_query_paired() -> dict[str, int]:
    """Free ports for every port of the stack (:data:`DEFAULT_PORTS`), the query gRPC port right below the query
    HTTP port, as Jaeger's defaults and ``make up`` pair them (``report --jaeger URL`` finds the gRPC port so)."""
    ports = {name: free_port() for name in DEFAULT_PORTS}
    for _ in range(200):
        http = free_port()
        if http - 1 in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", http - 1))
            except OSError:
                continue
        _HANDED_OUT.add(http - 1)
        ports["query"], ports["query_grpc"] = http, http - 1
        return ports
    raise RuntimeError("no free pair of ports for Jaeger's query HTTP and gRPC")


def config_env(ports: dict[str, int], data_dir: Path | None = None, queue_dir: Path | None = None) -> dict[str, str]:
    """The variables the config files substitute (collector.yaml, agent.yaml, gateway.yaml, jaeger.yaml), for
    ``ports`` on 127.0.0.1, Jaeger's Badger store in ``data_dir`` and the Collectors' disk queues below
    ``queue_dir``. Variables whose directory is not given are left to the caller's environment (or the files'
    defaults)."""
    env = {var: str(ports[key]) for key, var in PORT_VARS.items()}
    env.update(
        OTELCOL_HOST="127.0.0.1",
        GATEWAY_HOST="127.0.0.1",
        JAEGER_HOST="127.0.0.1",
        OTELCOL_GATEWAY_ENDPOINT=f"127.0.0.1:{ports['gateway_grpc']}",
        GATEWAY_PROMETHEUS_PORT=str(ports["prometheus"]),
        JAEGER_OTLP_ENDPOINT=f"127.0.0.1:{ports['jaeger_otlp_grpc']}",
    )
    if data_dir is not None:
        env["JAEGER_BADGER_DIR"] = str(data_dir)
    if queue_dir is not None:
        env["OTELCOL_QUEUE_DIR"] = str(queue_dir / "agent")
        env["GATEWAY_QUEUE_DIR"] = str(queue_dir / "gateway")
    return env


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(r.status == 200)
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
# senders first, so they can hand on what they hold; the cluster store's nodes last (scripts/stack_store.py)
STOP_ORDER = ("agent", "collector", "gateway", "jaeger", "retention", "os1", "os2", "os3")


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
    jaeger_config: str = "jaeger.yaml"  # jaeger-opensearch.yaml for the cluster store (stack_store.py)
    extra_env: dict[str, str] = field(default_factory=dict)  # more variables for the config files

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
        env.update(self.extra_env)
        return env

    def start_process(self, name: str, timeout: float = 60) -> None:
        """Start ``name`` (see :data:`PROCESSES`) and wait until its health endpoint answers."""
        config, health_port, health_path, _ = PROCESSES[name]
        binary = JAEGER_BIN if name == "jaeger" else COLLECTOR_BIN
        config = self.jaeger_config if name == "jaeger" else config
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


# `up`'s processes, in start order, and the ports each listens on (`down` waits until they are free); `up
# --store opensearch` runs stack_store.UP.
UP: tuple[str, ...] = ("jaeger", "collector")
PORTS_OF: dict[str, tuple[str, ...]] = {
    "jaeger": ("query", "query_grpc", "jaeger_health", "jaeger_metrics", "jaeger_otlp_grpc", "jaeger_otlp_http"),
    "collector": ("grpc", "http", "prometheus", "otelcol_health", "otelcol_metrics"),
    "retention": (),
    **{f"os{i}": (f"os{i}_http", f"os{i}_transport") for i in (1, 2, 3)},
}


# s from SIGTERM to SIGKILL: a Collector hands on what it holds, Jaeger closes its store
STOP_TIMEOUT = float(os.environ.get("OTEL_AGENTLOOP_STOP_TIMEOUT") or 30)
PORT_TIMEOUT = 10.0  # s after exit for the ports to be free


def state_file() -> Path:
    return RUN_DIR / "stack.json"


@dataclass
class Saved:
    """What `up` saved in :func:`state_file`: the ports, Jaeger's store, the queues, and each process."""

    ports: dict[str, int]
    data_dir: Path
    queue_dir: Path
    retention: str
    procs: dict[str, Identity]
    store: str = "badger"  # or "opensearch": data_dir then holds the nodes' homes
    checkout: str | None = None  # the repository root whose `up` started it (None: saved by an older stack.py)
    stack: str | None = None  # its OTEL_AGENTLOOP_STACK (None: the default stack)

    def write(self) -> None:
        data = {
            "version": 2,
            "checkout": self.checkout,
            "stack": self.stack,
            "store": self.store,
            "ports": self.ports,
            "data_dir": str(self.data_dir),
            "queue_dir": str(self.queue_dir),
            "retention": self.retention,
            "processes": {name: ident.to_json() for name, ident in self.procs.items()},
        }
        tmp = state_file().with_suffix(".part")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(state_file())

    @classmethod
    def read(cls) -> Saved:
        """Raises ValueError, KeyError or TypeError on a file this version did not write."""
        data = json.loads(state_file().read_text())
        if not isinstance(data, dict) or data.get("version") != 2:
            raise ValueError("no version 2")
        ports = {str(k): int(v) for k, v in data["ports"].items()}
        procs = {str(n): Identity.from_json(i) for n, i in data["processes"].items()}
        dirs = Path(data["data_dir"]), Path(data["queue_dir"])
        checkout, stack = data.get("checkout"), data.get("stack")
        return cls(
            ports,
            *dirs,
            str(data["retention"]),
            procs,
            str(data.get("store", "badger")),
            str(checkout) if checkout else None,
            str(stack) if stack else None,
        )

    def foreign(self) -> str | None:
        """The checkout that started this stack when it is not this one (:data:`ROOT`), else None (a state of an
        older stack.py names none: it is taken as this checkout's, as that version did)."""
        if self.checkout is None or Path(self.checkout).resolve() == ROOT:
            return None
        return self.checkout

    def addresses(self) -> Stack:
        """The saved stack's addresses and directories (no process handles)."""
        return Stack(self.ports, RUN_DIR, self.data_dir, self.queue_dir)
