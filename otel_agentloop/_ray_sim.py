"""The main job on Ray: a manager (the driver) and N actor workers running the simulated agent loop.

As in verl: the manager splits each step's batch into chunks, each worker actor runs its chunk's samples as
asyncio tasks, and the manager merges the workers' per-sample tables into verl's metrics with the same code
as a single process. The slowest sample's spans come back from the worker that ran it (each worker returns
the spans of its own slowest sample: the global slowest is one of them).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from . import _context as ctx
from ._configure import configure, current_handle
from ._display import metrics_table
from ._progress import Progress
from ._records import SpanRecord
from ._table import PhaseTable
from ._timeline import TimelineRecorder
from ._waterfall import render_png, render_text
from .integrations import ray as oal_ray
from .simulate import SimConfig, run_samples

CHUNKS_PER_WORKER = 4  # finer chunks: a livelier progress bar and better balance


class SimWorker:
    """One AgentLoopWorker-like actor: runs chunks of samples, then hands back the step's table."""

    def __init__(self) -> None:
        handle = oal_ray.setup_worker()
        self.timelines = TimelineRecorder()
        handle.provider.add_span_processor(self.timelines)  # type: ignore[union-attr]

    @oal_ray.traced_remote
    async def run_chunk(self, step: int, work: list[tuple[int, int]], cfg: SimConfig) -> int:
        """Run ``work`` inside the driver's step; returns the number of failed samples."""
        outcomes = await run_samples(cfg, step, work)
        return sum(isinstance(o, BaseException) for o in outcomes)

    def finish_step(self, step: int) -> tuple[PhaseTable, dict[tuple[int, int], list[SpanRecord]], dict[str, int]]:
        """This worker's table of ``step``, the spans of its slowest sample, and its export counters."""
        table = oal_ray.worker_table(step)
        timelines = self.timelines.pop(step)
        slowest = table.slowest(1)
        spans = {}
        if slowest:
            key = (int(slowest[0]["sample_index"]), int(slowest[0]["rollout_n"]))  # type: ignore[call-overload]
            spans[key] = timelines.get(key, [])
        return table, spans, current_handle().stats  # type: ignore[union-attr]

    def shutdown(self, timeout_s: float) -> dict[str, int]:
        handle = current_handle()
        assert handle is not None
        handle.force_flush(timeout_s)
        stats = handle.stats
        handle.shutdown(timeout_s)
        return stats


def simulate_on_ray(args: argparse.Namespace) -> int:
    ray = oal_ray._ray()
    cfg = SimConfig(prompts=args.prompts, rollout_n=args.rollout_n, max_turns=args.max_turns,
                    time_scale=args.time_scale, seed=args.seed)
    handle = configure(args.service_name, endpoint=args.endpoint, protocol=args.protocol, file=args.file,
                       trace_per=args.trace_per)
    n = args.workers
    print(f"otel-agentloop simulate: {args.steps} steps x {len(cfg.work())} samples on {n} Ray workers; "
          f"traces -> {handle.description}")
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = oal_ray.runtime_env(handle, base={"env_vars": {"PYTHONPATH": package_root}})
    ray.init(num_cpus=max(2, n), include_dashboard=False, log_to_driver=False, runtime_env=env,
             configure_logging=False)
    results: list[dict[str, Any]] = []
    worker_stats: list[dict[str, int]] = []
    try:
        actor = ray.remote(num_cpus=0)(SimWorker)
        workers = [actor.remote() for _ in range(n)]
        for step in range(1, args.steps + 1):
            work = cfg.work()
            chunks = [work[i::n * CHUNKS_PER_WORKER] for i in range(n * CHUNKS_PER_WORKER)]
            bar = Progress(len(work), f"step {step}", enabled=not args.quiet)
            with ctx.step(step):
                carrier = oal_ray.carrier()
                pending = {workers[i % n].run_chunk.remote(step, chunk, cfg, otel_carrier=carrier): len(chunk)
                           for i, chunk in enumerate(chunks) if chunk}
                failed = 0
                while pending:
                    done, _ = ray.wait(list(pending), num_returns=1, timeout=600)
                    if not done:
                        raise TimeoutError(f"step {step}: no chunk finished in 600 s")
                    for ref in done:
                        failed += ray.get(ref)
                        bar.advance(pending.pop(ref))
            bar.close()
            finished = ray.get([w.finish_step.remote(step) for w in workers], timeout=120)
            metrics = oal_ray.merge_metrics(t for t, _, _ in finished)
            spans: dict[tuple[int, int], list[SpanRecord]] = {}
            for _, worker_spans, _ in finished:
                spans.update(worker_spans)
            results.append({"step": step, "metrics": dict(metrics), "slowest_trace_id": metrics.slowest_trace_id,
                            "failed_samples": failed})
            if args.json:
                continue
            print()
            print(metrics_table(metrics, title=f"== step {step}: agent_loop metrics over {n} workers "
                                               f"({failed} failed samples)"))
            key = metrics.slowest_sample
            if key is not None and spans.get(key):
                title = f"slowest sample {key[0]} (rollout {key[1]}), trace {metrics.slowest_trace_id}"
                print()
                print(render_text(spans[key], title=title))
                if args.png:
                    print(f"waterfall written to {render_png(spans[key], args.png, title=title)}")
        worker_stats = ray.get([w.shutdown.remote(args.flush_timeout) for w in workers], timeout=120)
    finally:
        ray.shutdown()
        flushed = handle.force_flush(args.flush_timeout)
        stats = handle.stats
        handle.shutdown(args.flush_timeout)
    for ws in worker_stats:
        for key in ("exported", "dropped", "failed"):
            stats[key] += ws[key]
    if args.json:
        print(json.dumps(results, indent=1))
    print(f"\nspans exported: {stats['exported']}, dropped: {stats['dropped']}, failed: {stats['failed']}"
          f"{'' if flushed else ' (flush timed out)'}; traces -> {handle.description}")
    return 0
