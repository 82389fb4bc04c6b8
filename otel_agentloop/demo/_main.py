"""The simulated main job in one process (``otel-agentloop simulate --workers 0``): the shared step loop
(:mod:`._loop`) with the samples run as asyncio tasks here."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..analysis._reading._timeline import TimelineRecorder
from ..analysis._rendering._display import info_stream as _info
from ..analysis._rendering._progress import Progress
from ..analysis._rendering._terminal import counted
from ..health._training import HealthMonitor
from ..health._validation import ValidationCapture
from ..metrics._records import SpanRecord
from ..metrics._table import StepMetrics
from ..setup import Handle
from ._agent import SimConfig, failed, run_samples
from ._loop import StepResult, finish, run_steps, sim_config, sim_configure

if TYPE_CHECKING:
    from ..core._inflight import InflightSample


def simulate(args: argparse.Namespace) -> int:
    """Run ``args.steps`` simulated steps in this process, printing each step's metrics (or JSON at the end)."""
    cfg = sim_config(args)
    timelines = TimelineRecorder()
    handle = sim_configure(args, [timelines])
    monitor = HealthMonitor(log=False)  # alerts are printed below
    print(
        f"otel-agentloop simulate: {counted(args.steps, 'step')} x {counted(len(cfg.work()), 'sample')}; "
        f"traces -> {handle.description}",
        file=_info(args),
    )
    results: list[StepResult] = []
    try:
        results = run_steps(args, cfg, InProcess(handle, timelines, args.val_generations, args.seed), monitor)
    finally:
        flushed = handle.force_flush(args.flush_timeout)
        stats = handle.stats
        handle.shutdown(args.flush_timeout)
    return finish(args, results, monitor, stats, flushed, handle.description)


class InProcess:
    """The step loop's rollouts (:class:`._loop.Rollouts`) as asyncio tasks in this process."""

    where = ""

    def __init__(self, handle: Handle, timelines: TimelineRecorder, generations: int, seed: int) -> None:
        self.handle = handle
        self.timelines = timelines
        self.generations = generations
        self.seed = seed
        self.metrics: StepMetrics | None = None
        self.capture: ValidationCapture | None = None

    def progress(self, step: int) -> tuple[Callable[[], Sequence[InflightSample]], Callable[[], int] | None]:
        return self.handle.inflight, None

    def rollout(self, cfg: SimConfig, step: int, bar: Progress) -> tuple[set[tuple[int, int]], list[float]]:
        """The rollout, and the step's metrics collected at its end (see :func:`_rollout_and_collect`)."""
        outcomes, self.metrics = asyncio.run(_rollout_and_collect(cfg, step, bar.advance, self.handle))
        failed_keys = {k for k, o in zip(cfg.work(), outcomes, strict=True) if failed(o)}
        return failed_keys, [o for o in outcomes if isinstance(o, float)]

    def collect(self, step: int) -> tuple[StepMetrics, dict[tuple[int, int], list[SpanRecord]]]:
        assert self.metrics is not None  # collected by rollout()
        return self.metrics, self.timelines.pop(step)

    def validate(self, cfg: SimConfig, step: int) -> list[float]:
        self.capture = ValidationCapture(self.generations, seed=self.seed)
        outcomes = asyncio.run(_rollout(cfg, step, None, self.capture))
        return [o for o in outcomes if isinstance(o, float)]

    def finish_validation(self, step: int) -> ValidationCapture:
        self.handle.metrics.collect(step, validate=True)
        self.timelines.pop(step, validate=True)
        assert self.capture is not None  # made by validate()
        return self.capture


async def _rollout(
    cfg: SimConfig, step: int, on_done: Callable[[], None] | None, capture: ValidationCapture | None = None
) -> list[float | BaseException]:
    return await run_samples(cfg, step, cfg.work(), on_done=on_done, capture=capture)


async def _rollout_and_collect(
    cfg: SimConfig, step: int, on_done: Callable[[], None] | None, handle: Handle
) -> tuple[list[float | BaseException], StepMetrics]:
    """The rollout, then the step's metrics collected while any hung sample still runs, then it is cancelled
    (what a trainer with a rollout timeout does): the watchdog classifies it hung."""
    stragglers: list[asyncio.Task[float]] = []
    outcomes = await run_samples(cfg, step, cfg.work(), on_done=on_done, stragglers=stragglers)
    metrics = handle.metrics.collect(step)
    for task in stragglers:
        task.cancel()
    await asyncio.gather(*stragglers, return_exceptions=True)
    return outcomes, metrics
