"""The cost of the engine's load record (issue 36), driven with vLLM's real stats objects (run it with the engine
venv's python: ``$(bash scripts/engine_env.sh | tail -1) bench/engine_state.py``).

Side by side, interleaved rounds, medians:
- **per engine iteration**: what vLLM's stat logger manager calls once per engine-core output batch, with a
  real ``SchedulerStats`` and ``IterationStats``: a user's minimal ``StatLoggerBase`` (the uninstrumented path)
  vs the same plus ours (``OtelAgentloopStatLogger.record``: the per-request series and the 100 ms load
  points; one engine, tracing off, so windows close and are dropped, which is also their cost when on minus
  the span); the difference is our cost per iteration;
- **per request**: the wrapper's extra work for one request (the turn attributes read from a real
  ``RequestOutput`` stream of 32 cumulative outputs, the load mark and summary) vs reading the same stream
  without it;
- **memory**: ``tracemalloc`` over 1,000,000 iterations (10 ms apart: 1,000 windows of 10 s) with values that
  grow and fall, sampled every 100,000;
- **the engine's iteration time here** (``--engine``): a real ``AsyncLLM`` (the tiny test model, made in a temp
  dir) running 8 concurrent requests, its iterations counted by ours: the 1 % budget is measured against it.

Run: ``ENGINE_PY bench/engine_state.py [--n 200000] [--rounds 5] [--engine]``.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machine import machine

from otel_agentloop.integrations.vllm._load import EngineLoad
from otel_agentloop.integrations.vllm._logger import stat_logger_factory
from otel_agentloop.integrations.vllm._output import OutputReader


def real_stats(n: int, seed: int = 1) -> list[tuple[Any, Any]]:
    """``n`` (SchedulerStats, IterationStats) pairs of vLLM's own classes, 10 ms apart, varied values."""
    from vllm.v1.metrics.stats import IterationStats, PrefixCacheStats, SchedulerStats

    rng = random.Random(seed)
    t0 = time.time()
    out = []
    for i in range(n):
        sched = SchedulerStats(
            num_running_reqs=rng.randint(0, 256), num_waiting_reqs=rng.randint(0, 64),
            kv_cache_usage=rng.random(), prefix_cache_stats=PrefixCacheStats(requests=1, queries=64, hits=32),
        )  # fmt: skip
        it = IterationStats()
        it.iteration_timestamp = t0 + i * 0.01
        it.num_generation_tokens = sched.num_running_reqs
        it.num_preempted_reqs = 1 if rng.random() < 0.01 else 0
        out.append((sched, it))
    return out


def user_logger() -> Any:
    from vllm.v1.metrics.loggers import StatLoggerBase

    class UserLogger(StatLoggerBase):  # the uninstrumented path: vLLM calls the loggers it has
        def __init__(self, vllm_config: Any = None, engine_index: int = 0) -> None:
            self.n = 0

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:  # fmt: skip
            self.n += 1

        def log_engine_initialized(self) -> None:
            pass

    return UserLogger()


def per_iteration(loggers: list[Any], stats: list[tuple[Any, Any]]) -> float:
    """ns per iteration of vLLM's manager loop over ``loggers`` (as ``StatLoggerManager.record`` calls them)."""
    gc.collect()
    t0 = time.perf_counter_ns()
    for sched, it in stats:
        for logger in loggers:
            logger.record(sched, it, mm_cache_stats=None, engine_idx=0)
    return (time.perf_counter_ns() - t0) / len(stats)


def request_stream(tokens: int = 32) -> list[Any]:
    """A real ``RequestOutput`` stream (cumulative, one token per output) with its ``RequestStateStats``."""
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.v1.metrics.stats import RequestStateStats

    stats = RequestStateStats(arrival_time=1.0)
    stats.queued_ts, stats.scheduled_ts, stats.first_token_ts, stats.last_token_ts = 5.0, 5.5, 6.0, 9.0
    outs = []
    for k in range(1, tokens + 1):
        done = k == tokens
        comp = CompletionOutput(index=0, text="", token_ids=list(range(k)), cumulative_logprob=None, logprobs=None,
                                finish_reason="length" if done else None)  # fmt: skip
        outs.append(RequestOutput("r", None, list(range(128)), None, [comp], done, metrics=stats, num_cached_tokens=64))
    return outs


def per_request(stream: list[Any], load: EngineLoad, n: int, ours: bool) -> float:
    """ns per request: iterating its outputs, plus (``ours``) what the wrapper adds."""
    gc.collect()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        if ours:
            reader, mark = OutputReader(), load.series.mark()
            for out in stream:
                reader.add(out)
            attrs = reader.attributes()
            attrs.update(load.series.summary(mark))
        else:
            for out in stream:
                _ = out.finished
    return (time.perf_counter_ns() - t0) / n


def memory(iterations: int = 1_000_000) -> list[tuple[int, int]]:
    """(iterations, traced bytes held by one engine's load record) every 100,000 iterations."""
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats

    load = EngineLoad()
    logger = stat_logger_factory(load)(None, 0)
    sched, it = SchedulerStats(), IterationStats()
    t0 = time.time()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    points = []
    for i in range(1, iterations + 1):
        phase = (i // 5000) % 2  # the load grows, then falls: the suffix-maximum stacks fill and empty
        sched.num_running_reqs = (i % 5000) // 20 if phase else 250 - (i % 5000) // 20
        sched.num_waiting_reqs = i % 97
        sched.kv_cache_usage = (i % 1000) / 1000
        it.iteration_timestamp = t0 + i * 0.01
        it.num_preempted_reqs = i % 2
        logger.record(sched, it)
        if i % 100_000 == 0:
            points.append((i, tracemalloc.get_traced_memory()[0] - base))
    tracemalloc.stop()
    return points


def engine_iteration_ms() -> tuple[float, int]:
    """The real engine's mean wall time per iteration (ms) over 8 concurrent requests of 64 tokens, and the
    iterations our logger counted."""
    import asyncio
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "engine"))
    from tiny_model import make
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    model = make(Path(tempfile.mkdtemp()))
    load = EngineLoad()
    args = AsyncEngineArgs(model=str(model), dtype="bfloat16", enforce_eager=True, max_model_len=256, max_num_seqs=8)
    engine = AsyncLLM.from_engine_args(args, stat_loggers=[stat_logger_factory(load)])

    async def one(i: int) -> None:
        params = SamplingParams(max_tokens=64, ignore_eos=True, temperature=0.0)
        async for _ in engine.generate({"prompt_token_ids": list(range(5, 69))}, params, f"b{i}"):
            pass

    async def run() -> float:
        await one(-1)  # warm up
        start, t0 = load.series.iterations, time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(8)))
        return (time.perf_counter() - t0) / max(load.series.iterations - start, 1) * 1000.0

    try:
        ms = asyncio.run(run())
    finally:
        engine.shutdown()
    return ms, load.series.iterations


def _median_rounds(rounds: int, fns: dict[str, Callable[[], float]]) -> dict[str, float]:
    results: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for key, fn in fns.items():  # interleaved
            results[key].append(fn())
    return {k: statistics.median(v) for k, v in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--engine", action="store_true", help="also measure a real engine's iteration time")
    args = parser.parse_args()
    print(machine())
    stats = real_stats(args.n)
    load = EngineLoad()
    ours = stat_logger_factory(load)(None, 0)
    user = user_logger()
    it = _median_rounds(
        args.rounds,
        {"user": lambda: per_iteration([user], stats), "user+ours": lambda: per_iteration([user, ours], stats)},
    )
    stream = request_stream()
    req = _median_rounds(
        args.rounds,
        {
            "plain": lambda: per_request(stream, load, 20_000, ours=False),
            "ours": lambda: per_request(stream, load, 20_000, ours=True),
        },
    )
    print(f"per iteration (ns, median of {args.rounds}): user logger {it['user']:.0f}, user + ours "
          f"{it['user+ours']:.0f}: ours +{it['user+ours'] - it['user']:.0f}")  # fmt: skip
    print(f"per request, 32 cumulative outputs (ns): plain {req['plain']:.0f}, with ours {req['ours']:.0f}: "
          f"+{req['ours'] - req['plain']:.0f}")  # fmt: skip
    for i, held in memory():
        print(f"memory after {i:>9,} iterations: {held / 1024:.1f} KiB")
    if args.engine:
        ms, n = engine_iteration_ms()
        cost_ms = (it["user+ours"] - it["user"]) / 1e6
        print(f"engine iteration here: {ms:.2f} ms ({n} iterations); ours per iteration {cost_ms * 1e3:.2f} us = "
              f"{cost_ms / ms * 100:.3f} % of it")  # fmt: skip


if __name__ == "__main__":
    main()
