"""Hot-path cost as CPU time, for A/B runs on a loaded machine (not part of ``make bench``).

Per-call CPU time of the calling thread (``time.thread_time``) for a decorated sync phase inside a sample, a
bare SDK span with the same attributes and the decorator with tracing disabled; the minimum over many short
rounds, which load on other cores disturbs far less than wall time. No exporter (the registry and the
metrics processor run as configured). Compare two trees side by side, alternating processes::

    for i in 1 2 3 4 5; do for t in /path/to/before /path/to/after; do
        PYTHONPATH=$t .venv/bin/python bench/hot_path_cpu.py; done; done
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.core import _tracer


def per_call_ns(fn: Callable[[], None], n: int, clock: Callable[[], float]) -> float:
    t0 = clock()
    for _ in range(n):
        fn()
    return (clock() - t0) / n * 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    handle = oal.configure("hot-path", exporters=[], set_global=False)
    tracer = handle.provider.get_tracer("bench")

    @oal.trace_generate(model="m")
    def decorated() -> None:
        return None

    sample = oal.sample(3, rollout_n=1, step=1)
    handle_ = sample.__enter__()
    attrs = {
        sc.RL_PHASE: sc.GENERATE,
        sc.GEN_AI_OPERATION_NAME: "text_completion",
        sc.GEN_AI_REQUEST_MODEL: "m",
        **handle_.phase_attributes,
    }

    def bare() -> None:
        tracer.start_span("text_completion m", attributes=attrs).end()

    results: dict[str, list[float]] = {"decorated": [], "bare_span": [], "disabled": []}
    gc.disable()
    for _ in range(args.rounds):
        results["bare_span"].append(per_call_ns(bare, args.calls, time.thread_time))
        results["decorated"].append(per_call_ns(decorated, args.calls, time.thread_time))
        _tracer.set_disabled(True)
        results["disabled"].append(per_call_ns(decorated, args.calls * 10, time.thread_time))
        _tracer.set_disabled(False)
        if handle.live is not None:
            handle.live.registry.drain()  # the watchdog thread would: keep the ended-span queue small
    gc.enable()
    sample.__exit__(None, None, None)
    handle.shutdown(5)
    out = {f"{k}_ns": round(min(v), 1) for k, v in results.items()}
    out["decorated/bare_span"] = round(min(results["decorated"]) / min(results["bare_span"]), 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
