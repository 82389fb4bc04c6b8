"""The main job on Ray: a manager (the driver) and N actor workers running the simulated agent loop.

As in verl: the manager splits each step's batch into chunks, each worker actor runs its chunk's samples as
asyncio tasks, and the manager merges the workers' per-sample tables into verl's metrics with the same code
as a single process. The slowest sample's spans come back from the worker that ran it (each worker returns
the spans of its own slowest sample: the global slowest is one of them).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import otel_agentloop

from ..analysis._reading._timeline import TimelineRecorder
from ..analysis._rendering._display import info_stream as _info
from ..analysis._rendering._progress import Progress
from ..analysis._rendering._terminal import counted
from ..health._training import HealthMonitor
from ..health._validation import Entry, ValidationCapture
from ..integrations import ray as oal_ray
from ..integrations.ray._common import ray_module
from ..metrics._records import SpanRecord
from ..metrics._table import PhaseTable, StepMetrics
from ..metrics._verdicts import Verdict
from ..setup import Handle, current_handle
from ._agent import SimConfig, failed, run_samples
from ._loop import StepResult, finish, run_steps, sim_config, sim_configure

if TYPE_CHECKING:
    from ..core._inflight import InflightSample

CHUNKS_PER_WORKER = 4  # finer chunks: a livelier progress bar and better balance
Rollout = tuple[set[tuple[int, int]], list[float]]
"""A rollout's failed samples and rewards."""


class SimWorker:
    """One AgentLoopWorker-like actor: runs chunks of samples, then hands back the step's table."""

    def __init__(self) -> None:
        handle = oal_ray.setup_worker()
        self.timelines = TimelineRecorder()
        self.captures: dict[int, ValidationCapture] = {}
        handle.provider.add_span_processor(self.timelines)  # type: ignore[union-attr]
        self.stragglers: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[float]]] = []
        self.finished: dict[tuple[int, bool], int] = {}  # samples finished so far, per (step, validate)

    def finished_samples(self, step: int, validate: bool = False) -> int:
        """How many samples of ``step`` finished here so far (the live view's done count)."""
        return self.finished.get((step, validate), 0)

    @oal_ray.traced_remote
    async def run_chunk(
        self, step: int, work: list[tuple[int, int]], cfg: SimConfig, val_generations: int = 0
    ) -> tuple[list[tuple[int, int]], list[float], int]:
        """Run ``work`` inside the driver's step; returns (failed samples, rewards, samples finished). With
        ``val_generations`` (a validation pass) the samples' texts go to this worker's validation sketch."""
        capture = None
        if val_generations:
            capture = self.captures.setdefault(step, ValidationCapture(val_generations, seed=cfg.seed))
        stragglers: list[asyncio.Task[float]] = []
        key = (step, bool(val_generations))

        def done() -> None:
            self.finished[key] = self.finished.get(key, 0) + 1

        outcomes = await run_samples(cfg, step, work, on_done=done, capture=capture, stragglers=stragglers)
        loop = asyncio.get_running_loop()
        self.stragglers += [(loop, task) for task in stragglers]  # still running: cancelled in finish_step
        return (
            [k for k, o in zip(work, outcomes, strict=True) if failed(o)],
            [o for o in outcomes if isinstance(o, float)],
            len(work) - len(stragglers),
        )

    def finish_step(
        self, step: int
    ) -> tuple[PhaseTable, dict[tuple[int, int], list[SpanRecord]], dict[str, int], Verdict]:
        """This worker's table of ``step``, the spans of its slowest sample, its export counters and watchdog
        verdict; then samples still running (hung) are cancelled."""
        table = oal_ray.worker_table(step)
        verdict = oal_ray.worker_verdict(step)
        self.finished.pop((step, False), None)
        for loop, task in self.stragglers:
            loop.call_soon_threadsafe(task.cancel)
        self.stragglers.clear()
        timelines = self.timelines.pop(step)
        slowest = table.slowest(1)
        spans = {}
        if slowest:
            key = (int(slowest[0]["sample_index"]), int(slowest[0]["rollout_n"]))  # type: ignore[call-overload]
            spans[key] = timelines.get(key, [])
        return table, spans, current_handle().stats, verdict  # type: ignore[union-attr]

    def finish_validation(self, step: int) -> tuple[list[Entry], int, PhaseTable, Verdict]:
        """This worker's validation sketch of ``step``, how many samples it saw, and its table and watchdog verdict
        of the validation pass (releasing the step's validation state)."""
        table = oal_ray.worker_table(step, validate=True)
        verdict = oal_ray.worker_verdict(step, validate=True)
        self.timelines.pop(step, validate=True)
        self.finished.pop((step, True), None)
        capture = self.captures.pop(step, None)
        sketch, offered = (capture.state(), capture.offered) if capture is not None else ([], 0)
        return sketch, offered, table, verdict

    def shutdown(self, timeout_s: float) -> dict[str, int]:
        handle = current_handle()
        assert handle is not None
        handle.force_flush(timeout_s)
        stats = handle.stats
        handle.shutdown(timeout_s)
        return stats


def simulate_on_ray(args: argparse.Namespace) -> int:
    """The simulated main job as a manager (this process) and ``args.workers`` Ray actor workers."""
    ray: ModuleType = ray_module()
    cfg = sim_config(args)
    handle = sim_configure(args)
    monitor = HealthMonitor(log=False)  # alerts are printed below
    n = args.workers
    print(
        f"otel-agentloop simulate: {counted(args.steps, 'step')} x {counted(len(cfg.work()), 'sample')} on "
        f"{counted(n, 'Ray worker')}; "
        f"traces -> {handle.description}",
        file=_info(args),
    )
    _start_ray(ray, handle, n)
    results: list[StepResult] = []
    worker_stats: list[dict[str, int]] = []
    try:
        actor = ray.remote(num_cpus=0)(SimWorker)
        workers = [actor.remote() for _ in range(n)]
        results = run_steps(args, cfg, OnRay(ray, workers, args.val_generations, cfg.seed), monitor)
        worker_stats = ray.get([w.shutdown.remote(args.flush_timeout) for w in workers], timeout=120)
    finally:
        ray.shutdown()
        flushed = handle.force_flush(args.flush_timeout)
        stats = handle.stats
        handle.shutdown(args.flush_timeout)
    for ws in worker_stats:
        for key in ("exported", "dropped", "failed"):
            stats[key] += ws[key]
    return finish(args, results, monitor, stats, flushed, handle.description)


def _start_ray(ray: ModuleType, handle: Handle, workers: int) -> None:
    """A local Ray cluster whose workers export like ``handle`` and import this package from its source."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(otel_agentloop.__file__)))  # holds otel_agentloop/
    env = oal_ray.runtime_env(handle, base={"env_vars": {"PYTHONPATH": package_root}})
    ray.init(
        address="local",
        num_cpus=max(2, workers),
        include_dashboard=False,
        log_to_driver=True,  # worker warnings (the watchdog's) reach this terminal
        runtime_env=env,
        configure_logging=False,
    )


class OnRay:
    """The step loop's rollouts (:class:`._loop.Rollouts`) on Ray actor workers, this process the manager."""

    def __init__(self, ray: ModuleType, workers: list[Any], generations: int, seed: int) -> None:
        # ``workers``: Ray's actor handles of SimWorker, foreign objects whose remote methods are made at run time
        self.ray = ray
        self.workers = workers
        self.where = f" over {len(workers)} workers"
        self.generations = generations
        self.seed = seed

    def progress(self, step: int) -> tuple[Callable[[], Sequence[InflightSample]], Callable[[], int] | None]:
        return (
            lambda: oal_ray.gather_inflight(self.workers, timeout_s=2.0),
            functools.partial(self._finished_on, step),
        )

    def _finished_on(self, step: int) -> int:
        """Samples of ``step`` finished on all workers so far (the live view's done count)."""
        return sum(self.ray.get([w.finished_samples.remote(step) for w in self.workers], timeout=2.0))

    def rollout(self, cfg: SimConfig, step: int, bar: Progress | None, val_generations: int = 0) -> Rollout:
        """One pass over the batch, split into chunks across the workers, inside the current step."""
        workers = self.workers
        n = len(workers)
        work = cfg.work()
        chunks = [work[i :: n * CHUNKS_PER_WORKER] for i in range(n * CHUNKS_PER_WORKER)]
        carrier = oal_ray.carrier()
        pending = {
            workers[i % n].run_chunk.remote(step, chunk, cfg, val_generations, otel_carrier=carrier): len(chunk)
            for i, chunk in enumerate(chunks)
            if chunk
        }
        failed_keys: set[tuple[int, int]] = set()
        rewards: list[float] = []
        while pending:
            done, _ = self.ray.wait(list(pending), num_returns=1, timeout=600)
            if not done:
                raise TimeoutError(f"step {step}: no chunk finished in 600 s")
            for ref in done:
                chunk_failed, chunk_rewards, finished = self.ray.get(ref)
                failed_keys.update((int(i), int(n)) for i, n in chunk_failed)
                rewards += chunk_rewards
                pending.pop(ref)
                if bar is not None:
                    bar.advance(finished)  # a hung sample still running is not done
        return failed_keys, rewards

    def collect(self, step: int) -> tuple[StepMetrics, dict[tuple[int, int], list[SpanRecord]]]:
        """The workers' tables merged (and the step's ``rl.step.summary`` written); the slowest samples' spans."""
        finished = self.ray.get([w.finish_step.remote(step) for w in self.workers], timeout=120)
        metrics = oal_ray.merge_metrics(  # log=False: the step's report prints the verdict
            (t for t, _, _, _ in finished), [v for _, _, _, v in finished], log=False
        )
        spans: dict[tuple[int, int], list[SpanRecord]] = {}
        for _, worker_spans, _, _ in finished:
            spans.update(worker_spans)
        return metrics, spans

    def validate(self, cfg: SimConfig, step: int) -> list[float]:
        _, rewards = self.rollout(cfg, step, None, self.generations)
        return rewards

    def finish_validation(self, step: int) -> ValidationCapture:
        """The workers' validation sketches merged; the validation pass's metrics and ``rl.step.summary``."""
        capture = ValidationCapture(self.generations, seed=self.seed)
        validated = self.ray.get([w.finish_validation.remote(step) for w in self.workers], timeout=120)
        for state, offered, _, _ in validated:
            capture.merge(state, offered)
        oal_ray.merge_metrics((t for *_, t, _ in validated), [v for *_, v in validated], log=False)
        return capture
