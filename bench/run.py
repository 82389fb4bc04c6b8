"""Benchmarks for otel_agentloop (not tests: numbers, recorded in bench/RESULTS.md).

Per-call cost of a decorated phase vs. a bare SDK span with the same attributes vs. a verl-style
perf_counter timer vs. the decorator with tracing disabled; the processor's on_end; collect() on 1e6 samples.
Spans go through the real export path (the OTLP-JSON file exporter on its worker thread), since export
shares the GIL with the caller. Rounds are interleaved and the median is reported.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import step_overhead
from machine import machine
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.core import _tracer
from otel_agentloop.metrics import PhaseMetricsProcessor


@contextlib.contextmanager
def verl_timer(name: str, timing: dict[str, float]):
    """verl's simple_timer: perf_counter around the block, accumulated into a dict."""
    start = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start


def per_call(fn: Callable[[], None], n: int) -> float:
    gc.collect()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def bench_calls(n: int, rounds: int) -> dict[str, float]:
    path = os.path.join(tempfile.mkdtemp(), "bench.jsonl")
    handle = oal.configure(
        "bench", file=path, set_global=False, max_queue_size=1 << 21, max_export_batch_size=512, schedule_delay_s=0.2
    )
    tracer = handle.provider.get_tracer("bench")

    @oal.trace_generate(model="m")
    def decorated() -> None:
        return None

    def bare_function() -> None:
        return None

    timing: dict[str, float] = {}

    def timer() -> None:
        with verl_timer("generate_sequences", timing):
            bare_function()

    sample_ctx = oal.sample(3, rollout_n=1, step=1)
    sample_ctx.__enter__()
    same_attrs = {
        sc.RL_PHASE: sc.GENERATE,
        sc.GEN_AI_OPERATION_NAME: "text_completion",
        sc.GEN_AI_REQUEST_MODEL: "m",
        **oal.current_sample().phase_attributes,
    }

    def bare_span() -> None:
        tracer.start_span("text_completion m", attributes=same_attrs).end()

    results: dict[str, list[float]] = {k: [] for k in ("decorated", "bare_span", "timer", "disabled", "bare_call")}
    for _ in range(rounds):
        results["bare_span"].append(per_call(bare_span, n))
        handle.force_flush(30)
        results["decorated"].append(per_call(decorated, n))
        handle.force_flush(30)
        results["timer"].append(per_call(timer, n))
        results["bare_call"].append(per_call(bare_function, n))
        _tracer.set_disabled(True)
        results["disabled"].append(per_call(decorated, n))
        _tracer.set_disabled(False)
    sample_ctx.__exit__(None, None, None)
    stats = handle.stats
    handle.shutdown(30)
    out = {k: statistics.median(v) for k, v in results.items()}
    out["dropped"] = stats["dropped"]
    out["exported"] = stats["exported"]
    return out


def bench_nested_exception(levels: int, repeats: int = 5) -> tuple[float, float]:
    """ms for one exception unwinding through ``levels`` nested decorated frames (tracing on), vs. undecorated."""
    path = os.path.join(tempfile.mkdtemp(), "exc.jsonl")
    handle = oal.configure("bench-exc", file=path, set_global=False, max_queue_size=1 << 16)

    @oal.trace_tool("deep")
    def deep(n: int) -> None:
        if n == 0:
            raise KeyError("bottom")
        deep(n - 1)

    def plain(n: int) -> None:
        if n == 0:
            raise KeyError("bottom")
        plain(n - 1)

    def timed(fn: Callable[[int], None]) -> float:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            with contextlib.suppress(KeyError):
                fn(levels)
            best = min(best, time.perf_counter() - t0)
        return best * 1e3

    with oal.sample(0, step=1):
        decorated = timed(deep)
    undecorated = timed(plain)
    handle.shutdown(30)
    return decorated, undecorated


def bench_after_shutdown(n: int) -> float:
    """Per-call cost of a decorated function after ``handle.shutdown()`` (tracing off again)."""
    handle = oal.configure("bench-off", file=os.path.join(tempfile.mkdtemp(), "off.jsonl"), set_global=False)
    handle.shutdown(5)

    @oal.trace_generate(model="m")
    def decorated() -> None:
        return None

    return statistics.median(per_call(decorated, n) for _ in range(3))


def bench_on_end(n: int) -> float:
    """Real finished spans (built by the SDK with our attributes) fed to a fresh processor's on_end."""
    memory = InMemorySpanExporter()
    handle = oal.configure("bench-on-end", set_global=False, exporters=[], processors=[SimpleSpanProcessor(memory)])
    tracer = handle.provider.get_tracer("bench")
    for i in range(n):
        attrs = {
            sc.RL_PHASE: sc.PHASES[i % 3],
            sc.RL_STEP: 1,
            sc.RL_SAMPLE_INDEX: i % 1000,
            sc.RL_ROLLOUT_N: 0,
            sc.RL_VALIDATE: False,
        }
        if i % 3 == 1:  # a tool call: its duration is recorded per tool name
            attrs[sc.GEN_AI_TOOL_NAME] = ("search", "python", "calc")[i % 7 % 3]
        tracer.start_span("x", attributes=attrs).end()
    spans = list(memory.get_finished_spans())
    handle.shutdown(5)
    proc = PhaseMetricsProcessor()
    gc.collect()
    t0 = time.perf_counter()
    for s in spans:
        proc.on_end(s)
    return (time.perf_counter() - t0) / len(spans) * 1e6


def bench_collect(samples: int) -> tuple[float, float]:
    proc = PhaseMetricsProcessor(max_samples_per_step=samples)
    t0 = time.perf_counter()
    for i in range(samples):
        for p, phase in enumerate(sc.PHASES):
            start = i * 10 + p * 3
            proc.ingest(
                "x",
                {sc.RL_PHASE: phase, sc.RL_STEP: 1, sc.RL_SAMPLE_INDEX: i, sc.RL_ROLLOUT_N: 0},
                start,
                start + 2,
                i + 1,
                False,
            )
    fill = time.perf_counter() - t0
    gc.collect()
    t0 = time.perf_counter()
    m = proc.collect(1)
    took = time.perf_counter() - t0
    assert m["agent_loop/num_samples"] == samples
    return took, fill


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--collect-samples", type=int, default=1_000_000)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "RESULTS.md"))
    parser.add_argument(
        "--only",
        default="core,fast,step,memory,throughput",
        help="comma list of: core, fast (issue 20: fast path vs. SDK), step, memory, throughput (needs Go: "
        "builds the stack)",
    )
    parser.add_argument("--throughput-seconds", type=float, default=60.0)
    parser.add_argument("--step-pairs", type=int, default=3)
    parser.add_argument("--step-prompts", type=int, default=256, help="prompts per step (x4 rollouts)")
    parser.add_argument("--endpoint", help="OTLP endpoint for the step run (default: file export)")
    parser.add_argument("--step-path", choices=("fast", "sdk"), default="fast", help="recording path when on")
    parser.add_argument("--fast-calls", type=int, default=20_000, help="calls per round of the fast-path section")
    args = parser.parse_args()
    only = set(args.only.split(","))
    sections = []

    if "core" in only:
        sections.append(core_section(args))
    if "fast" in only:
        import fast_path

        steps = 0 if "step" in only else args.step_pairs  # the step section measures it then
        sections.append(fast_path.section(args.fast_calls, max(args.rounds, 9), steps, args.step_prompts))
    if "step" in only:
        sections.append(
            step_overhead.overhead_section(
                pairs=args.step_pairs, prompts=args.step_prompts, endpoint=args.endpoint, path=args.step_path
            )
        )
    if "memory" in only:
        sections.append(step_overhead.memory_section())
    if "throughput" in only:
        import throughput

        sections.append(throughput.run(seconds=args.throughput_seconds))
    text = f"# Benchmark results (`make bench`)\n\nMachine: {machine()}\n\n" + "\n".join(sections)
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    return 0


def core_section(args: argparse.Namespace) -> str:
    calls = bench_calls(args.calls, args.rounds)
    on_end = bench_on_end(30_000)
    nested_ms, nested_plain_ms = bench_nested_exception(200)
    after_shutdown = bench_after_shutdown(args.calls)
    collect_s, fill_s = bench_collect(args.collect_samples)
    ratio_decorated = calls["decorated"] / calls["bare_span"]
    ratio_disabled = calls["disabled"] / calls["timer"]
    rows = [
        ("decorated phase (sync, in a sample)", f"{calls['decorated']:.2f} us", ""),
        ("bare SDK span, same attributes", f"{calls['bare_span']:.2f} us", ""),
        ("verl-style perf_counter timer", f"{calls['timer']:.2f} us", ""),
        ("decorator, tracing disabled", f"{calls['disabled']:.2f} us", ""),
        ("bare function call", f"{calls['bare_call']:.3f} us", ""),
        ("decorator after handle.shutdown()", f"{after_shutdown:.2f} us", "tracing off again"),
        ("decorated / bare SDK span", f"{ratio_decorated:.2f}x", "target <= 1.15x"),
        ("disabled / verl timer", f"{ratio_disabled:.2f}x", "target <= 0.2x"),
        (
            "exception through 200 nested decorated frames",
            f"{nested_ms:.1f} ms",
            f"undecorated {nested_plain_ms:.2f} ms",
        ),
        ("PhaseMetricsProcessor.on_end", f"{on_end:.2f} us", "target <= 5 us"),
        (f"collect() on {args.collect_samples:,} samples", f"{collect_s:.3f} s", "target <= 0.5 s"),
    ]
    table = "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)
    return f"""## Per-call costs (issue 2)

{args.rounds} interleaved rounds of {args.calls:,} calls each, median; spans exported through the real
OTLP-JSON file exporter on its worker thread ({calls["exported"]:,} exported, {calls["dropped"]} dropped), so
the per-span numbers include export's share of the GIL. collect(): 3 spans per sample ({fill_s:.1f} s to fill).

| measure | value | target |
|---|---|---|
{table}
"""


if __name__ == "__main__":
    sys.exit(main())
