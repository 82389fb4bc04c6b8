"""The live view's costs (issue 14): numbers for bench/RESULTS.md, not tests.

1. A decorated phase with the in-flight registry (and its watchdog thread) on vs. off, side by side in one
   process: two providers with the same processors and export path (OTLP-JSON file), the only difference
   being the registry; rounds interleaved, medians compared.
2. The watchdog thread's CPU (its own ``thread_time``) at 4096 in-flight samples, each in an open phase,
   over a window of wall time: with default thresholds, and in the worst case where every open phase is past
   the smallest threshold (every check visits all 4096).
3. Off the hot path: the background thread's cost per ended span (histogram record with exemplar context),
   and one in-flight gauge collection at 4096 samples.

Run: .venv/bin/python bench/inflight.py [--calls N] [--rounds R] [--window S] [--append bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time

from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import machine

import otel_agentloop as oal
from otel_agentloop.core import _tracer
from otel_agentloop.export._file import OTLPJsonFileExporter
from otel_agentloop.export._processor import ExportProcessor
from otel_agentloop.health._watchdog import WatchdogSettings, install
from otel_agentloop.metrics import PhaseMetricsProcessor


def provider(path: str, with_registry: bool) -> tuple[TracerProvider, object]:
    """configure()'s processors by hand: metrics, then the registry (or not), then export to a file."""
    prov = TracerProvider(resource=Resource.create({"service.name": "bench"}), shutdown_on_exit=False)
    metrics = PhaseMetricsProcessor()
    prov.add_span_processor(metrics)
    export = ExportProcessor(
        OTLPJsonFileExporter(path),
        max_queue_size=1 << 21,
        max_export_batch_size=512,
        schedule_delay_s=0.2,
        export_timeout_s=30,
        name="bench",
    )
    monitor = None
    if with_registry:
        monitor = install(prov, metrics, [export], settings=WatchdogSettings(), max_inflight=65_536, readers=[])
    prov.add_span_processor(export)
    return prov, monitor


@oal.trace_generate(model="m")
def decorated() -> None:
    return None


def per_call(n: int) -> tuple[float, float]:
    """(wall us, process CPU us) per call: CPU counts every thread of this process (export, watchdog) and
    not the other processes sharing the machine."""
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        decorated()
    return (time.perf_counter() - t0) / n * 1e6, (time.process_time() - c0) / n * 1e6


def bench_phase(calls: int, rounds: int) -> dict[str, object]:
    """Many short rounds, on and off alternating (order flipped every round), so drift on a shared machine
    hits both; medians per configuration, and the median of the per-round on/off ratios."""
    tmp = tempfile.mkdtemp()
    on, monitor = provider(os.path.join(tmp, "on.jsonl"), True)
    off, _ = provider(os.path.join(tmp, "off.jsonl"), False)
    wall: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(rounds + 1):
        for name, prov in (("off", off), ("on", on)) if r % 2 else (("on", on), ("off", off)):
            _tracer.install(prov)
            scope = oal.sample(1, rollout_n=0, step=1)
            scope.__enter__()
            w, c = per_call(calls)
            scope.__exit__(None, None, None)
            if r:  # round 0 warms up
                wall[name].append(w)
                cpu[name].append(c)
        on.force_flush(30_000)
        off.force_flush(30_000)
    _tracer.install(None)
    on.shutdown()
    off.shutdown()
    ratio_pairs = statistics.median(a / b for a, b in zip(wall["on"], wall["off"], strict=True))
    ratio_wall = statistics.median(wall["on"]) / statistics.median(wall["off"])
    ratio_cpu = statistics.median(a / b for a, b in zip(cpu["on"], cpu["off"], strict=True))
    return {
        "off_us": statistics.median(wall["off"]),
        "on_us": statistics.median(wall["on"]),
        "off_cpu_us": statistics.median(cpu["off"]),
        "on_cpu_us": statistics.median(cpu["on"]),
        "ratio": ratio_wall,
        "ratio_pairs": ratio_pairs,
        "ratio_cpu": ratio_cpu,
        "rounds": wall,
        "drained_checks": monitor.checks,
    }  # type: ignore[union-attr]


@oal.trace_generate(model="m")
async def long_generate(release: asyncio.Event) -> None:
    await release.wait()


def bench_watchdog(n: int, window_s: float, interval_s: float, worst: bool) -> dict[str, float]:
    # worst case: tool threshold tiny (the smallest threshold), generation threshold huge: after the first check,
    # every open generation phase is older than the smallest threshold and is visited on every check
    thresholds = {"tool_calls": 0.001, "generate_sequences": 10_000} if worst else None
    reader = InMemoryMetricReader()
    handle = oal.configure(
        "bench-watchdog",
        exporters=[InMemorySpanExporter()],
        set_global=False,
        watchdog=WatchdogSettings(interval_s=interval_s, thresholds_s=thresholds),
        metric_readers=[reader],
    )
    monitor = handle.live
    out: dict[str, float] = {}

    async def main() -> None:
        release = asyncio.Event()
        with oal.step(1):

            async def one(i: int) -> None:
                async with oal.sample(i):
                    await long_generate(release)

            tasks = [asyncio.create_task(one(i)) for i in range(n)]
            while len(monitor.registry) < n or len(monitor.registry._phases) < n:
                await asyncio.sleep(0.05)
            await asyncio.sleep(2 * interval_s)  # past the smallest threshold
            cpu0, checks0, t0 = monitor.cpu_s, monitor.checks, time.perf_counter()
            await asyncio.sleep(window_s)
            wall = time.perf_counter() - t0
            out["cpu_fraction"] = (monitor.cpu_s - cpu0) / wall
            out["checks"] = monitor.checks - checks0
            out["per_check_ms"] = (monitor.cpu_s - cpu0) / max(1, out["checks"]) * 1e3
            t1 = time.perf_counter()
            counts, _ = monitor.registry.counts()
            out["gauge_collect_ms"] = (time.perf_counter() - t1) * 1e3
            assert sum(counts.values()) == n
            t1 = time.perf_counter()
            snap = handle.inflight()
            out["snapshot_ms"] = (time.perf_counter() - t1) * 1e3
            assert len(snap) == n
            monitor._stop.set()  # time one drain by hand: every phase and sample ends now
            monitor._thread.join(5)
            release.set()
            await asyncio.gather(*tasks)
            queued = len(monitor.registry._ended)
            t1 = time.thread_time()
            monitor.check()
            out["drain_us_per_span"] = (time.thread_time() - t1) / max(1, queued) * 1e6
            out["drained"] = queued

    try:
        asyncio.run(main())
    finally:
        handle.shutdown(5)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2_000)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--append", help="append a section to this RESULTS.md")
    args = ap.parse_args()
    phase = bench_phase(args.calls, args.rounds)
    print(
        f"decorated phase: registry off {phase['off_us']:.2f} us, on {phase['on_us']:.2f} us, "
        f"ratio {phase['ratio']:.3f} (median of per-round ratios {phase['ratio_pairs']:.3f}); "
        f"CPU off {phase['off_cpu_us']:.2f} us, on {phase['on_cpu_us']:.2f} us, "
        f"ratio {phase['ratio_cpu']:.3f}"
    )
    typical = bench_watchdog(args.samples, args.window, 1.0, worst=False)
    print("watchdog default thresholds, 1 s checks:", typical)
    worst = bench_watchdog(args.samples, args.window, 1.0, worst=True)
    print("watchdog worst case, 1 s checks:", worst)
    fast = bench_watchdog(args.samples, args.window, 0.25, worst=True)
    print("watchdog worst case, 0.25 s checks:", fast)
    if args.append:
        ok_phase = "met" if phase["ratio"] <= 1.05 else "NOT met"
        ok_phase_cpu = "met" if phase["ratio_cpu"] <= 1.05 else "NOT met"
        ok_cpu = "met" if max(typical["cpu_fraction"], worst["cpu_fraction"]) <= 0.01 else "NOT met"
        rounds = phase["rounds"]
        n = args.samples
        rows = [
            ("decorated phase, registry off (wall)", f"{phase['off_us']:.2f} us", "same processors and file export"),
            ("decorated phase, registry + watchdog on (wall)", f"{phase['on_us']:.2f} us", ""),
            ("on / off, wall (ratio of medians)", f"{phase['ratio']:.3f}x", f"target <= 1.05x: {ok_phase}"),
            ("on / off, wall (median of per-round ratios)", f"{phase['ratio_pairs']:.3f}x", "noisier: shared machine"),
            (
                "decorated phase, process CPU off / on",
                f"{phase['off_cpu_us']:.2f} / {phase['on_cpu_us']:.2f} us",
                "all threads: export and watchdog included",
            ),
            ("on / off, process CPU", f"{phase['ratio_cpu']:.3f}x", f"target <= 1.05x: {ok_phase_cpu}"),
            (
                f"watchdog CPU, {n} in flight, default thresholds, 1 s checks",
                f"{typical['cpu_fraction'] * 100:.3f}% of a core",
                f"{typical['per_check_ms']:.3f} ms per check",
            ),
            (
                f"watchdog CPU, {n} in flight, every phase a candidate, 1 s checks",
                f"{worst['cpu_fraction'] * 100:.3f}% of a core",
                f"{worst['per_check_ms']:.3f} ms per check; target <= 1%: {ok_cpu}",
            ),
            (
                "same, 0.25 s checks",
                f"{fast['cpu_fraction'] * 100:.3f}% of a core",
                f"{fast['per_check_ms']:.3f} ms per check",
            ),
            (
                "background thread per ended span (histogram with exemplar, learning)",
                f"{worst['drain_us_per_span']:.1f} us",
                f"off the hot path; {worst['drained']:.0f} spans in one check",
            ),
            (f"in-flight gauge collection at {n} samples", f"{worst['gauge_collect_ms']:.2f} ms", "per metric export"),
            (f"`handle.inflight()` at {n} samples", f"{worst['snapshot_ms']:.2f} ms", ""),
        ]
        table = "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)
        text = f"""
## Live view: in-flight registry and watchdog (issue 14)

{machine()}. `bench/inflight.py` ({args.calls} calls x {args.rounds} interleaved rounds; {n} in-flight
samples over {args.window:.0f} s windows).

| measure | value | |
|---|---|---|
{table}

Per-round wall costs (us), first 10: off {[round(x, 1) for x in rounds["off"][:10]]},
on {[round(x, 1) for x in rounds["on"][:10]]}.
The hot path adds, in the phase wrapper itself (no span processor reads the span back), a dict insert when the
span starts and, once it has ended, a dict pop plus one append of the phase's duration to its (phase, tool)
window (learned thresholds); no lock for phase spans. Histograms are recorded on the watchdog thread (sharing
the GIL) only when a metric reader is configured: the per-span cost above, almost all of it the SDK's
`Histogram.record`.
"""
        with open(args.append, "a") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
