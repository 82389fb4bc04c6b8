"""The training thread's extra cost per generation turn of the engine carrier (issue 28), no engine needed.

Side by side, per turn (a ``span("generate_sequences")`` inside a sample, the fast path, spans going through
the real export path to an OTLP-JSON file):
- ``turn``: today's turn (open + close);
- ``+ trace_headers``: the turn plus ``trace_headers()`` (the context carried to the engine; target <= 2 us);
- ``+ record_generation``: the turn plus today's ``record_generation(input, output, finish_reason)``;
- ``+ record_engine_output``: the turn plus the engine's attributes read from a ``RequestOutput``-shaped
  object (tokens, request id, finish reason, queue/TTFT/prefill/decode, preemptions);
- ``+ both``: carrier + engine attributes: what ``integrations.vllm`` adds to a turn.
Also each call alone, inside a turn, and with tracing off. Rounds are interleaved; medians in microseconds of
the training thread's CPU (the target) and of wall time (which also carries the export pipeline thread's share).

Run: ``.venv/bin/python bench/engine_turn.py [--n 20000] [--rounds 7]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from types import SimpleNamespace

from machine import machine

import otel_agentloop as oal
from otel_agentloop.integrations.vllm import record_engine_output, trace_headers


def fake_output(i: int) -> SimpleNamespace:
    """A vLLM v1 ``RequestOutput``-shaped object: what ``record_engine_output`` reads."""
    times = {"queued_ts": 100.0, "scheduled_ts": 100.25, "first_token_ts": 100.5, "last_token_ts": 102.0}
    stats = SimpleNamespace(**times, first_token_latency=0.6, num_preemptions=0)
    completion = SimpleNamespace(token_ids=list(range(64)), finish_reason="length")
    return SimpleNamespace(
        request_id=f"req-{i}", prompt_token_ids=list(range(128)), outputs=[completion], metrics=stats
    )


def per_call(fn: Callable[[], None], n: int) -> tuple[float, float]:
    """(training-thread CPU, wall) per call, in microseconds: the wall time also carries the export pipeline
    thread's share of the interpreter while the loop runs."""
    gc.collect()
    c0, t0 = time.thread_time(), time.perf_counter()
    for _ in range(n):
        fn()
    return (time.thread_time() - c0) / n * 1e6, (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    path = os.path.join(tempfile.mkdtemp(), "bench.jsonl")
    handle = oal.configure("bench", file=path, set_global=False, max_queue_size=1 << 21, schedule_delay_s=0.2)
    out = fake_output(0)

    def turn() -> None:
        with oal.span("generate_sequences"):
            pass

    def turn_headers() -> None:
        with oal.span("generate_sequences"):
            trace_headers()

    def turn_generation() -> None:
        with oal.span("generate_sequences"):
            oal.record_generation(input_tokens=128, output_tokens=64, finish_reason="length")

    def turn_engine() -> None:
        with oal.span("generate_sequences"):
            record_engine_output(out)

    def turn_both() -> None:
        with oal.span("generate_sequences"):
            trace_headers()
            record_engine_output(out)

    cases: dict[str, Callable[[], None]] = {
        "turn": turn,
        "turn + trace_headers": turn_headers,
        "turn + record_generation": turn_generation,
        "turn + record_engine_output": turn_engine,
        "turn + both (integrations.vllm)": turn_both,
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    alone: dict[str, list[tuple[float, float]]] = {
        "trace_headers (in a turn)": [],
        "record_engine_output (in a turn)": [],
    }
    with oal.step(0), oal.sample(0):
        for _ in range(args.rounds):
            for name, fn in cases.items():
                handle.force_flush()  # each case starts with the pipeline's queue empty
                results[name].append(per_call(fn, args.n))
            handle.force_flush()
            with oal.span("generate_sequences"):
                alone["trace_headers (in a turn)"].append(per_call(trace_headers, args.n))
                alone["record_engine_output (in a turn)"].append(per_call(lambda: record_engine_output(out), args.n))
    handle.shutdown()
    off = oal.configure("bench-off", enabled=False, set_global=False)
    off_headers = statistics.median(per_call(trace_headers, args.n)[0] for _ in range(args.rounds))
    off_engine = statistics.median(per_call(lambda: record_engine_output(out), args.n)[0] for _ in range(args.rounds))
    off.shutdown()

    print(f"# engine carrier per turn ({machine()}), n={args.n} x {args.rounds} rounds, median us per call")
    print(f"{'':34s} {'thread CPU':>10s} {'over turn':>10s} {'wall':>9s} {'over turn':>10s}")
    cpu0 = statistics.median(v[0] for v in results["turn"])
    wall0 = statistics.median(v[1] for v in results["turn"])
    for name, values in results.items():
        cpu, wall = statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)
        print(f"{name:34s} {cpu:10.2f} {cpu - cpu0:+10.2f} {wall:9.2f} {wall - wall0:+10.2f}")
    for name, values in alone.items():
        cpu, wall = statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)
        print(f"{name:34s} {cpu:10.2f} {'':10s} {wall:9.2f}")
    print(f"{'trace_headers (tracing off)':34s} {off_headers:10.2f}")
    print(f"{'record_engine_output (tracing off)':34s} {off_engine:10.2f}")


if __name__ == "__main__":
    main()
