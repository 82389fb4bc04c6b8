"""Issue 41 item 12: what a slow, hung or dead backend costs the training loop, against a healthy one of the
same protocol, interleaved in one process (numbers, not tests).

Sinks run in a child process (their own GIL): for each protocol a healthy one (answers at once), a slow one
(reads the request, answers after ``--slow-s``), a hung one (reads the request, never answers: the exporter
waits out its timeout); dead is a closed port. For each round, every (protocol, kind) in a shuffled order:
``configure(endpoint, protocol)`` with the library's defaults, a short warm-up (the exporter has tried, the
queue is full where it will be), then the training loop for ``--round-s`` seconds: steps of samples, each
sample three decorated phases doing ``--work`` iterations of pure-Python work, and ``collect()`` after each
step. Per round and configuration: the
training loop's wall time per sample (what the loop pays, GIL waits included), and on the export and pipeline
threads their CPU time and their context switches (wake-ups) during the loop (``/proc/self/task``). The ratio
of a kind is the median over rounds of (its time per sample / the healthy one's of the same protocol, same
round). The machine's load average is printed with the table.

Run: .venv/bin/python bench/backend_failures.py [--rounds R] [--round-s S] [--write bench/RESULTS.md]
(``--write`` replaces the "Backends that fail slowly (issue 41)" section of that file, or appends it.)
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import re
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine

PROTOCOLS = ("http/json", "http/protobuf", "grpc")
KINDS = ("healthy", "slow", "hung", "dead")
SECTION = "## Backends that fail slowly (issue 41)"
EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


# -- the sinks (child process) ------------------------------------------------------------------------------
def _http_handler(kind: str, slow_s: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if kind == "slow":
                time.sleep(slow_s)
            elif kind == "hung":
                time.sleep(3600)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    return Handler


def _grpc_server(kind: str, slow_s: float) -> int:
    from concurrent import futures

    import grpc

    def export(request: bytes, context: grpc.ServicerContext) -> bytes:
        if kind == "slow":
            time.sleep(slow_s)
        elif kind == "hung":
            time.sleep(max((context.time_remaining() or 60) + 1, 0))
        return b""

    handler = grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.trace.v1.TraceService",
        {"Export": grpc.unary_unary_rpc_method_handler(export)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    _grpc_server.servers.append(server)  # type: ignore[attr-defined]
    return port


_grpc_server.servers = []  # type: ignore[attr-defined]


def _serve(conn: multiprocessing.connection.Connection, slow_s: float) -> None:
    ports: dict[tuple[str, str], int] = {}
    for kind in ("healthy", "slow", "hung"):
        server = ThreadingHTTPServer(("127.0.0.1", 0), _http_handler(kind, slow_s))
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        ports["http", kind] = server.server_address[1]
        ports["grpc", kind] = _grpc_server(kind, slow_s)
    conn.send(ports)
    conn.recv()  # until the bench is done


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the training loop ---------------------------------------------------------------------------------
def _work(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


@dataclass
class Sample:
    """One configuration's round: the loop's time per sample and the background threads' costs."""

    per_sample_us: float
    thread_cpu_us: float
    process_cpu_us: float
    export_cpu_ms: float
    pipeline_cpu_ms: float
    export_switches: int
    pipeline_switches: int
    dropped: int
    failed: int
    exported: int
    wall_s: float


@dataclass
class Config:
    protocol: str
    kind: str
    endpoint: str
    samples: list[Sample] = field(default_factory=list)


def _thread_state(name_prefix: str) -> tuple[float, int]:
    """CPU seconds and context switches (voluntary + involuntary) of the live threads named ``name_prefix*``."""
    cpu, switches = 0.0, 0
    for t in threading.enumerate():
        if not t.name.startswith(name_prefix) or t.ident is None or t.native_id is None:
            continue
        try:
            cpu += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            with open(f"/proc/self/task/{t.native_id}/status") as f:
                text = f.read()
            switches += sum(int(v) for v in re.findall(r"ctxt_switches:\s+(\d+)", text))
        except (OSError, ValueError):
            continue
    return cpu, switches


def _loop(
    handle: Any, phase: Callable[[int], int], seconds: float, work: int, step0: int
) -> tuple[float, float, float, int]:
    """Run steps of 64 samples, each collected (``collect()`` drains the fast path's queue on this thread, as in
    a trainer), for about ``seconds``; (wall seconds, this thread's and the process's CPU seconds, samples)."""
    import otel_agentloop as oal

    done = 0
    c0, p0 = time.thread_time(), time.process_time()
    t0 = time.perf_counter()
    end = t0 + seconds
    step = step0
    while time.perf_counter() < end:
        with oal.step(step):
            for i in range(64):
                with oal.sample(i):
                    phase(work)
                    phase(work)
                    phase(work)
        handle.metrics.collect(step)
        done += 64
        step += 1
    return time.perf_counter() - t0, time.thread_time() - c0, time.process_time() - p0, done


def _round(config: Config, phase: Callable[[int], int], args: argparse.Namespace, step0: int) -> None:
    import otel_agentloop as oal

    handle = oal.configure(
        "bench-backends",
        endpoint=config.endpoint,
        protocol=config.protocol,
        set_global=False,
        watchdog=False,
    )
    try:
        _loop(handle, phase, args.warmup_s, args.work, step0)
        e0, p0 = _thread_state("otel_agentloop.export"), _thread_state("otel_agentloop.pipeline")
        s0 = handle.stats
        wall, cpu, pcpu, done = _loop(handle, phase, args.round_s, args.work, step0 + 10_000)
        e1, p1 = _thread_state("otel_agentloop.export"), _thread_state("otel_agentloop.pipeline")
        s1 = handle.stats
        config.samples.append(
            Sample(
                per_sample_us=wall / done * 1e6,
                thread_cpu_us=cpu / done * 1e6,
                process_cpu_us=pcpu / done * 1e6,
                export_cpu_ms=(e1[0] - e0[0]) * 1e3,
                pipeline_cpu_ms=(p1[0] - p0[0]) * 1e3,
                export_switches=e1[1] - e0[1],
                pipeline_switches=p1[1] - p0[1],
                dropped=s1["dropped"] - s0["dropped"],
                failed=s1["failed"] - s0["failed"],
                exported=s1["exported"] - s0["exported"],
                wall_s=wall,
            )
        )
    finally:
        handle.shutdown(0.3)


def _table(configs: list[Config], rounds: int, load: tuple[float, float]) -> str:
    healthy = {c.protocol: c for c in configs if c.kind == "healthy"}
    lines = [
        SECTION,
        "",
        f"`bench/backend_failures.py`, {rounds} interleaved rounds; {machine()}; load average "
        f"{load[0]:.1f} at the start, {load[1]:.1f} at the end (a shared 2-core machine: noise of several %).",
        "",
        "| protocol | backend | loop wall us/sample | wall ratio vs healthy | min..max | loop thread CPU ratio | "
        "process CPU ratio | export thread CPU ms/s | its wake-ups/s | pipeline CPU ms/s | spans exported / failed / "
        "dropped per s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    med = statistics.median
    for c in configs:
        base = healthy[c.protocol]

        def ratio(attr: str, c: Config = c, base: Config = base) -> list[float]:
            pairs = zip(c.samples, base.samples, strict=True)
            return [getattr(s, attr) / getattr(b, attr) for s, b in pairs]

        def per_s(attr: str, c: Config = c) -> float:
            return med(getattr(s, attr) / s.wall_s for s in c.samples)

        walls = ratio("per_sample_us")
        lines.append(
            f"| {c.protocol} | {c.kind} | {med(s.per_sample_us for s in c.samples):.0f} | {med(walls):.3f} | "
            f"{min(walls):.2f}..{max(walls):.2f} | {med(ratio('thread_cpu_us')):.3f} | "
            f"{med(ratio('process_cpu_us')):.3f} | {per_s('export_cpu_ms'):.0f} | {per_s('export_switches'):.0f} | "
            f"{per_s('pipeline_cpu_ms'):.0f} | {per_s('exported'):.0f} / {per_s('failed'):.0f} / "
            f"{per_s('dropped'):.0f} |"
        )
    return "\n".join(lines) + "\n"


def _write(path: str, text: str) -> None:
    with open(path) as f:
        old = f.read()
    start = old.find(SECTION)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        end = old.find("\n## ", start + len(SECTION))
        new = old[:start] + text + (old[end + 1 :] if end >= 0 else "")
    with open(path, "w") as f:
        f.write(new)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--round-s", type=float, default=1.0)
    parser.add_argument("--warmup-s", type=float, default=0.4)
    parser.add_argument("--work", type=int, default=300, help="loop iterations per phase call (~15 us)")
    parser.add_argument("--slow-s", type=float, default=0.5)
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.add_argument("--write", default=None)
    args = parser.parse_args()

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    sinks = ctx.Process(target=_serve, args=(child, args.slow_s), daemon=True)
    sinks.start()
    ports = parent.recv()

    import otel_agentloop as oal

    phase = oal.phase("tool_calls")(_work)
    configs: list[Config] = []
    for protocol in args.protocols.split(","):
        for kind in KINDS:
            port = _closed_port() if kind == "dead" else ports["grpc" if protocol == "grpc" else "http", kind]
            endpoint = f"http://127.0.0.1:{port}"  # http: configure() appends /v1/traces
            configs.append(Config(protocol, kind, endpoint))
    load0 = os.getloadavg()[0]
    step0 = 0
    for r in range(args.rounds):
        order = list(configs)
        random.Random(r).shuffle(order)
        for config in order:
            _round(config, phase, args, step0)
            step0 += 100_000
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    text = _table(configs, args.rounds, (load0, os.getloadavg()[0]))
    print(text)
    if args.write:
        _write(args.write, text)
    parent.send("done")
    sinks.join(5)


if __name__ == "__main__":
    main()
