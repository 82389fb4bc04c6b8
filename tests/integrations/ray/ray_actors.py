"""Actor code for tests/integrations/ray/test_ray_cluster.py (imported by Ray workers through PYTHONPATH)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.health import ValidationCapture
from otel_agentloop.integrations import ray as oal_ray

# (sample index, rollout n, [(phase, start offset s, duration s)], fail)
Item = tuple[int, int, list[tuple[str, float, float]], bool]
BASE_NS = 1_700_000_000_000_000_000


class SampleFailedError(RuntimeError):
    pass


def synthetic_samples(items: list[Item]) -> None:
    """Sample and phase spans with fixed times (real spans through the real provider), so any split of the
    same items across processes must give identical metrics."""
    tracer = oal.current_handle().provider.get_tracer("tests")
    for index, rollout, phases, _ in items:
        with oal.sample(index, rollout) as s:
            for phase, offset, duration in phases:
                start = BASE_NS + int(offset * 1e9)
                span = tracer.start_span(phase, attributes={sc.RL_PHASE: phase, **s.phase_attributes}, start_time=start)
                span.end(end_time=start + int(duration * 1e9))


@oal.trace_generate(model="tiny")
async def generate(delay: float) -> None:
    await asyncio.sleep(delay)


@oal.trace_tool("lookup")
async def lookup(delay: float) -> None:
    await asyncio.sleep(delay)


@oal.trace_reward
async def reward(delay: float, fail: bool) -> float:
    await asyncio.sleep(delay)
    if fail:
        raise SampleFailedError("reward exploded")
    return 1.0


async def real_sample(index: int, rollout: int, fail: bool) -> None:
    async with oal.sample(index, rollout):
        await generate(0.01)
        await asyncio.gather(lookup(0.01), lookup(0.02))
        await reward(0.05 if fail else 0.005, fail)


class Worker:
    def __init__(self) -> None:
        oal_ray.setup_worker()

    @oal_ray.traced_remote
    async def run_async(self, items: list[Item]) -> int:
        """Real decorated phases; raises after the others finished if an item fails."""
        results = await asyncio.gather(*(real_sample(i, n, f) for i, n, _, f in items), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return len(results)

    @oal_ray.traced_remote
    def run_sync(self, items: list[Item]) -> int:
        synthetic_samples(items)
        return len(items)

    def validation_state(self, batches: list[list[tuple[str, str, float, int]]], n: int, seed: int) -> Any:
        """Offer every sample of several validation batches; return the sketch to merge in the driver."""
        capture = ValidationCapture(n, seed)
        for batch in batches:
            for inp, out, score, index in batch:
                capture.offer(inp, out, score, sample_index=index, rollout_n=0, step=5)
        return capture.state(), os.getpid()

    def table(self, step: int) -> Any:
        return oal_ray.worker_table(step)

    def info(self) -> dict[str, Any]:
        handle = oal.current_handle()
        handle.force_flush(5)
        return {"pid": os.getpid(), "stats": handle.stats, "env": handle.worker_env}


class BackendProbe:
    """An actor whose calls make real phase spans; for the dead/hung/slow backend test."""

    def __init__(self) -> None:
        oal_ray.setup_worker()

    @oal_ray.traced_remote
    def work(self, step: int, n: int) -> float:
        import time

        t0 = time.perf_counter()
        for i in range(n):
            with oal.sample(i, step=step):
                _sync_generate()
        return time.perf_counter() - t0

    @oal_ray.traced_remote
    async def work_async(self, step: int, n: int) -> int:
        for i in range(n):
            async with oal.sample(i, step=step):
                await generate(0.0)
        return n

    def stats(self) -> dict[str, Any]:
        handle = oal.current_handle()
        return dict(handle.stats)


@oal.trace_generate(model="tiny")
def _sync_generate() -> None:
    return None
