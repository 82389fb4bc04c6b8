"""The soak's Ray worker (bench/soak.py), in a module the workers import: decorated functions defined in a
driver's ``__main__`` are pickled by value, and a decorated phase does not pickle by value today (its closure
reaches the library's sample ContextVar), so the worker code lives here, as verl's does in its package."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import otel_agentloop as oal
from otel_agentloop.integrations import ray as oal_ray

SPANS_PER_SAMPLE = 5  # the sample, generate x2, tool, reward


@oal.trace_generate(model="soak-model")
async def generate(turn: int) -> int:
    return turn + 1


@oal.trace_tool("python")
async def run_tool(turn: int) -> str:
    return "ok"


class SoakSampleError(RuntimeError):
    """A failed sample's error (its reward raises): the sample and reward spans end ERROR with ``error.type``."""


@oal.trace_reward
async def reward(fail: bool) -> float:
    if fail:
        raise SoakSampleError("soak: this sample fails")
    return 1.0


def fails(index: int, fail_every: int) -> bool:
    """Whether sample ``index`` fails: every ``fail_every``-th one (none when 0), the same rule as the driver's."""
    return fail_every > 0 and index % fail_every == fail_every - 1


async def one_sample(index: int, fail_every: int = 0) -> float:
    """One sample's 5 spans; a failing one still makes all 5 (it fails in its last phase, the reward)."""
    async with oal.sample(index, rollout_n=0):
        turn = await generate(0)
        await run_tool(turn)
        await generate(turn)
        return await reward(fails(index, fail_every))


class SoakWorker:
    """An AgentLoopWorker-like actor: each call runs one step's samples of this worker as asyncio tasks."""

    def __init__(self) -> None:
        self.handle = oal_ray.setup_worker()
        self.trace_ids: dict[int, str] = {}

    @oal_ray.traced_remote
    async def run_step(self, first: int, count: int, fail_every: int = 0) -> int:
        """Samples ``first`` .. ``first + count - 1`` of the driver's current step, as concurrent tasks; every
        ``fail_every``-th sample index fails (:func:`fails`). Returns how many failed."""
        results = await asyncio.gather(
            *(one_sample(first + i, fail_every) for i in range(count)), return_exceptions=True
        )
        unexpected = [r for r in results if isinstance(r, BaseException) and not isinstance(r, SoakSampleError)]
        if unexpected:
            raise unexpected[0]
        return sum(isinstance(r, SoakSampleError) for r in results)

    def finish_step(self, step: int) -> tuple[Any, int]:
        """The step's table (releasing the worker's state of it, as verl's metrics collection does)."""
        return oal_ray.worker_table(step), os.getpid()

    def close(self, timeout_s: float) -> dict[str, int]:
        self.handle.force_flush(timeout_s)
        stats = dict(self.handle.stats)
        self.handle.shutdown(timeout_s)
        return stats
