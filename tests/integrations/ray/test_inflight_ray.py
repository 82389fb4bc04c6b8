"""In-flight samples and the watchdog on a real local Ray cluster: two actor workers, snapshots gathered by the
driver, a hung tool reported by the worker's watchdog, exported over OTLP, and classified hung at collection."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop import testing
from otel_agentloop.health import WatchdogSettings
from tests._support import REPO_ROOT
from tests._support.otlp_receiver import Receiver, start_grpc, wait_for

ray = pytest.importorskip("ray") if not os.environ.get("CI") else __import__("ray")
from otel_agentloop.integrations import ray as oal_ray  # noqa: E402 - after the Ray check

pytestmark = pytest.mark.e2e  # a local Ray cluster

ROOT = str(REPO_ROOT)
HANG_S = 0.5


@oal.trace_generate(model="tiny")
async def generate(delay: float) -> None:
    await asyncio.sleep(delay)


@oal.trace_tool("hang")
async def hang(event: asyncio.Event) -> None:
    await event.wait()


class LiveWorker:
    """An async agent-loop worker: its chunk's samples generate, then wait (one on a hung tool call)."""

    def __init__(self) -> None:
        oal_ray.setup_worker()
        self.release = asyncio.Event()

    @oal_ray.traced_remote
    async def run_chunk(self, work: list[tuple[int, int]], hung: list[tuple[int, int]]) -> int:
        async def one(i: int, n: int) -> None:
            async with oal.sample(i, n):
                await generate(0.01)
                if (i, n) in hung:
                    await hang(self.release)
                else:
                    await generate(60.0)  # cancelled by finish()

        self.tasks = [asyncio.ensure_future(one(i, n)) for i, n in work]
        await asyncio.gather(*self.tasks, return_exceptions=True)
        return len(work)

    def table(self, step: int) -> tuple[object, object, int]:
        table = oal_ray.worker_table(step)
        return table, oal_ray.worker_verdict(step), os.getpid()

    def finish(self) -> None:
        self.release.set()
        for task in self.tasks:
            task.cancel()

    def flush(self) -> None:
        oal.current_handle().force_flush(5)


@pytest.fixture(scope="module")
def cluster():
    receiver = Receiver()
    server, endpoint = start_grpc(receiver)
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("OTEL_")}
    handle = oal.configure(
        "ray-live",
        endpoint=endpoint,
        protocol="grpc",
        schedule_delay_s=0.05,
        watchdog=WatchdogSettings(interval_s=0.1, thresholds_s={"tool:hang": HANG_S}),
    )
    env = oal_ray.runtime_env(handle, base={"env_vars": {"PYTHONPATH": ROOT, "OTEL_BSP_SCHEDULE_DELAY": "50"}})
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env=env,
        configure_logging=False,
    )
    actor = ray.remote(num_cpus=0)(LiveWorker)
    workers = [actor.remote(), actor.remote()]
    try:
        yield handle, receiver, workers
    finally:
        ray.shutdown()
        handle.shutdown(5)
        server.stop(0)
        os.environ.update(saved)
        testing.reset()


def test_driver_gathers_running_samples_and_hung_verdicts_from_two_workers(cluster) -> None:
    handle, receiver, workers = cluster
    assert handle.worker_env["OTEL_AGENTLOOP_WATCHDOG_THRESHOLDS"] == f"tool:hang={HANG_S!r}"  # workers get it
    work = [(i, n) for i in range(3) for n in range(2)]
    chunks = [work[0::2], work[1::2]]  # worker 0: (0,0) (1,0) (2,0); worker 1: (0,1) (1,1) (2,1)
    hung = [(1, 0)]
    with oal.step(11):
        carrier = oal_ray.carrier()
        refs = [w.run_chunk.remote(c, hung, otel_carrier=carrier) for w, c in zip(workers, chunks, strict=True)]
        deadline = time.monotonic() + 60
        while True:
            snap = oal_ray.gather_inflight(workers, timeout_s=10)
            overdue = [s for s in snap if s.overdue]
            if len(snap) == 6 and overdue:
                break
            assert time.monotonic() < deadline, snap
            time.sleep(0.1)
        assert not ray.wait(refs, timeout=0)[0]  # still running while we looked
        assert {(s.sample_index, s.rollout_n) for s in snap} == set(work)
        assert {s.step for s in snap} == {11} and len({s.pid for s in snap}) == 2
        assert os.getpid() not in {s.pid for s in snap}
        assert snap == sorted(snap, key=lambda s: -s.sample_age_s)
        (stuck,) = overdue
        assert (stuck.sample_index, stuck.rollout_n, stuck.phase, stuck.tool) == (1, 0, sc.TOOL_CALLS, "hang")
        assert stuck.phase_age_s >= HANG_S
        others = [s for s in snap if not s.overdue]
        assert {(s.phase, s.tool) for s in others} == {(sc.GENERATE, None)}
        # the worker exported a snapshot of the running sample
        assert wait_for(lambda: any(r.attributes.get(sc.RL_SNAPSHOT) for r in list(receiver.records)), 30)
        snapshot = next(r for r in list(receiver.records) if r.attributes.get(sc.RL_SNAPSHOT))
        assert snapshot.name == "rl.sample (in progress)" and snapshot.trace_id_hex == stuck.trace_id
        assert snapshot.attributes[sc.RL_SAMPLE_INDEX] == 1 and snapshot.attributes[sc.GEN_AI_TOOL_NAME] == "hang"
        # collection while it still runs: hung
        finished = ray.get([w.table.remote(11) for w in workers], timeout=60)
        metrics = oal_ray.merge_metrics([t for t, _, _ in finished], [v for _, v, _ in finished])
        assert metrics["agent_loop/watchdog/hung"] == 1.0 and metrics["agent_loop/watchdog/slow"] == 0.0
        assert metrics.hung_trace_ids == (stuck.trace_id,)
        ray.get([w.finish.remote() for w in workers], timeout=30)
        assert ray.get(refs, timeout=30) == [3, 3]
    assert wait_for(lambda: oal_ray.gather_inflight(workers, timeout_s=10) == [], 30)
    ray.get([w.flush.remote() for w in workers], timeout=30)


def test_gather_inflight_with_no_actors_and_in_the_driver(cluster) -> None:
    handle, _, _ = cluster
    assert oal_ray.gather_inflight([]) == []
    with oal.step(1), oal.sample(4):
        assert [s.sample_index for s in oal_ray.inflight()] == [4]
    assert oal_ray.inflight() == handle.inflight() == []
