#!/usr/bin/env python3
"""A real Jaeger v2 and OpenTelemetry Collector on 127.0.0.1, built from the Go module proxy and cached.

    python scripts/stack.py build     # once: ~minutes cold, instant when cached
    python scripts/stack.py up        # Collector on 4317/4318 (+8889 metrics), Jaeger on 16686; background
    python scripts/stack.py status | down

Binaries are cached in ${OTEL_AGENTLOOP_CACHE:-~/.cache/otel-agentloop}/bin, keyed by version. Both processes
run with the repo's config files (collector/collector.yaml, collector/jaeger.yaml); ports come from the
environment variables those files substitute. Tests use :func:`start` with free ports instead.

Jaeger: the module proxy here serves Jaeger's v1.76.0 tag (the commit of v2.13.0; `cmd/jaeger` is the v2
binary) but not newer commits, and its go.mod has a `replace`, which `go install` refuses: it is built from
collector/jaeger-build, a main module that repeats the replace (its go.sum is committed). The sum database is
not reachable through this proxy for every module, so builds run with GOSUMDB=off: hashes are checked against
go.sum (committed for Jaeger; written by the builder for the Collector).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
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
COLLECTOR_BIN = CACHE / "bin" / f"otelcol-agentloop-{COLLECTOR_VERSION}" / "otelcol-agentloop"
BUILDER_BIN = CACHE / "bin" / f"builder-{COLLECTOR_VERSION}" / "builder"
RUN_DIR = CACHE / "run"
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
    if not (JAEGER_BIN.exists() and COLLECTOR_BIN.exists()) and shutil.which("go") is None:
        raise StackError(
            "the Go toolchain is not installed (need Go >= 1.24 on PATH to build Jaeger and the "
            "OpenTelemetry Collector); on Debian: apt-get install golang, or see go.dev/doc/install"
        )
    timings = {"jaeger": 0.0, "collector": 0.0}
    if not JAEGER_BIN.exists():
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
        timings["jaeger"] = time.monotonic() - t0
    if not COLLECTOR_BIN.exists():
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
        out = CACHE / "build" / f"otelcol-{COLLECTOR_VERSION}"
        out.mkdir(parents=True, exist_ok=True)  # the builder creates only the last path component
        _run(
            [str(BUILDER_BIN), "--config", str(COLLECTOR_DIR / "manifest.yaml"), "--output-path", str(out)],
            ROOT,
            "building the Collector",
            3600,
            progress=COLLECTOR_COLD if verbose else None,
        )
        COLLECTOR_BIN.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(out / "otelcol-agentloop", COLLECTOR_BIN)
        timings["collector"] = time.monotonic() - t0
    if verbose and not any(timings.values()):
        print(f"Jaeger and Collector: cached in {CACHE / 'bin'}")
    elif verbose:
        print(f"binaries ready (built: Jaeger {timings['jaeger']:.0f} s, Collector {timings['collector']:.0f} s)")
    return timings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config_env(ports: dict[str, int]) -> dict[str, str]:
    """The variables collector.yaml and jaeger.yaml substitute, for ``ports`` on 127.0.0.1."""
    return {
        "OTELCOL_HOST": "127.0.0.1",
        "OTELCOL_GRPC_PORT": str(ports["grpc"]),
        "OTELCOL_HTTP_PORT": str(ports["http"]),
        "OTELCOL_PROMETHEUS_PORT": str(ports["prometheus"]),
        "OTELCOL_HEALTH_PORT": str(ports["otelcol_health"]),
        "OTELCOL_METRICS_PORT": str(ports["otelcol_metrics"]),
        "JAEGER_OTLP_ENDPOINT": f"127.0.0.1:{ports['jaeger_otlp_grpc']}",
        "JAEGER_HOST": "127.0.0.1",
        "JAEGER_QUERY_PORT": str(ports["query"]),
        "JAEGER_QUERY_GRPC_PORT": str(ports["query_grpc"]),
        "JAEGER_HEALTH_PORT": str(ports["jaeger_health"]),
        "JAEGER_METRICS_PORT": str(ports["jaeger_metrics"]),
        "JAEGER_OTLP_GRPC_PORT": str(ports["jaeger_otlp_grpc"]),
        "JAEGER_OTLP_HTTP_PORT": str(ports["jaeger_otlp_http"]),
    }


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


@dataclass
class Stack:
    """A running Jaeger + Collector pair. ``stop_collector``/``start_collector`` restart the Collector alone."""

    ports: dict[str, int]
    log_dir: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def otlp_grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['grpc']}"

    @property
    def otlp_http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['http']}"

    @property
    def jaeger_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['query']}"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['prometheus']}/metrics"

    def _spawn(self, name: str, cmd: list[str], health: str, timeout: float) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}  # Jaeger traces itself otherwise
        env.update(config_env(self.ports))
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        self.procs[name] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not _healthy(health):
            if self.procs[name].poll() is not None or time.monotonic() > deadline:
                tail = (self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()[-20:]
                self.stop()
                raise StackError(f"{name} did not become healthy at {health}:\n" + "\n".join(tail))
            time.sleep(0.1)

    def start_jaeger(self, timeout: float = 60) -> None:
        self._spawn(
            "jaeger",
            [str(JAEGER_BIN), "--config", str(COLLECTOR_DIR / "jaeger.yaml")],
            f"http://127.0.0.1:{self.ports['jaeger_health']}/status",
            timeout,
        )

    def start_collector(self, timeout: float = 60) -> None:
        self._spawn(
            "collector",
            [str(COLLECTOR_BIN), "--config", str(COLLECTOR_DIR / "collector.yaml")],
            f"http://127.0.0.1:{self.ports['otelcol_health']}/",
            timeout,
        )

    def stop_collector(self) -> None:
        self._stop("collector")

    def _stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def stop(self) -> None:
        for name in ("collector", "jaeger"):
            self._stop(name)


def missing() -> list[Path]:
    """The binaries that ``build`` still has to make."""
    return [p for p in (JAEGER_BIN, COLLECTOR_BIN) if not p.exists()]


def start(ports: dict[str, int] | None = None, log_dir: Path | None = None) -> Stack:
    """Start the built Jaeger and Collector (free ports unless given); bounded waits. Never builds: a build takes
    minutes and belongs before the tests (``make stack-build``), not inside a test's timeout."""
    if missing():
        raise StackError(
            "not built yet: " + ", ".join(map(str, missing())) + " (run `make stack-build`; `make test` does it first)"
        )
    if ports is None:
        ports = {name: free_port() for name in DEFAULT_PORTS}
    log_dir = log_dir or RUN_DIR
    log_dir.mkdir(parents=True, exist_ok=True)
    stack = Stack(ports, log_dir)
    stack.start_jaeger()
    stack.start_collector()
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
            stack = start(dict(DEFAULT_PORTS))
            _pid_file().write_text(json.dumps({name: p.pid for name, p in stack.procs.items()}))
            print(f"Jaeger UI/API: {stack.jaeger_url}   (api_v3: {stack.jaeger_url}/api/v3/services)")
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
