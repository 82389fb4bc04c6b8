"""Run identity and the merged step summary across Ray workers (issue 19): a driver script run as ``__main__``
on a real local Ray cluster; every worker span carries the driver's ``rl.run.id`` and ``rl.run.attempt``, and
the driver writes one ``rl.step.summary`` per step equal to what ``merge_metrics`` returned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import read_jsonl
from otel_agentloop.analysis._reading._report import stored_summaries
from tests._support import REPO_ROOT

pytestmark = pytest.mark.e2e  # a Ray main job in a subprocess

pytest.importorskip("ray")

ROOT = str(REPO_ROOT)

DRIVER = textwrap.dedent("""
    import asyncio, json, os, sys

    import ray

    import otel_agentloop as oal
    from otel_agentloop.integrations import ray as oal_ray


    @oal.trace_tool("search")
    async def search(i):
        await asyncio.sleep(0.002)
        return i


    @oal.trace_generate(model="m")
    async def generate(i):
        await asyncio.sleep(0.001 * (1 + i % 3))
        return i


    @ray.remote
    class Worker:
        @oal_ray.traced_remote
        async def rollout(self, first, n):
            async def one(i):
                async with oal.sample(i, 0):
                    await generate(i)
                    await asyncio.gather(search(i), search(i + 1))
            await asyncio.gather(*(one(i) for i in range(first, first + n)))
            return os.getpid()

        def finish(self, step):
            return oal_ray.worker_table(step), oal_ray.worker_verdict(step)

        def identity(self):
            h = oal.current_handle()
            return h.run_id, h.run_attempt


    if __name__ == "__main__":
        handle = oal.configure("ray-run", file=sys.argv[1], schedule_delay_s=0.05)
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            runtime_env=oal_ray.runtime_env(handle, base={"env_vars": {"PYTHONPATH": sys.argv[2]}}),
        )
        merged = {}
        try:
            workers = [Worker.remote() for _ in range(2)]
            for step in (1, 2):
                with oal.step(step):
                    carrier = oal_ray.carrier()
                    ray.get([w.rollout.remote(4 * k, 4, otel_carrier=carrier) for k, w in enumerate(workers)])
                finished = ray.get([w.finish.remote(step) for w in workers], timeout=120)
                metrics = oal_ray.merge_metrics([t for t, _ in finished], [v for _, v in finished])
                merged[step] = dict(metrics)
            identities = ray.get([w.identity.remote() for w in workers])
        finally:
            ray.shutdown()
        handle.shutdown(5)
        print(json.dumps({"run": [handle.run_id, handle.run_attempt], "workers": identities, "merged": merged,
                          "pid": os.getpid()}))
""")


def test_ray_workers_carry_the_drivers_run_and_the_driver_writes_the_merged_summary(tmp_path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    path = tmp_path / "run.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = ROOT
    out = subprocess.run(
        [sys.executable, str(script), str(path), ROOT],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    run = tuple(result["run"])
    assert all(tuple(w) == run for w in result["workers"])
    records = list(read_jsonl(str(path)))
    samples = [r for r in records if r.name == sc.SAMPLE_SPAN]
    assert len(samples) == 2 * 8
    assert {r.resource["process.pid"] for r in samples} - {result["pid"]}  # written by the workers
    assert {r.resource["process.pid"] for r in samples}.isdisjoint({result["pid"]})
    for r in records:  # every span of every process: the driver's run and attempt
        assert (r.resource[sc.RL_RUN_ID], r.resource[sc.RL_RUN_ATTEMPT]) == run, r.name
    summaries = [r for r in records if r.name == sc.STEP_SUMMARY_SPAN]
    assert sorted(r.attributes[sc.RL_STEP] for r in summaries) == [1, 2]
    assert all(r.resource["process.pid"] == result["pid"] for r in summaries)  # the driver's, once per step
    stored = stored_summaries(records)
    for step in (1, 2):
        summary = stored[(step, False)]
        assert dict(summary.metrics) == result["merged"][str(step)]  # every key, equal
        assert summary.num_samples == 8 and summary.tools["search"].count == 16
        assert summary.start_ns > 0 and summary.end_ns > summary.start_ns
