"""A user's Ray driver script, run as ``__main__`` on a real local Ray cluster: Ray pickles its functions and
classes by value (cloudpickle), decorated ones included, and the workers' spans reach a real OTLP receiver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from otel_agentloop import semconv as sc
from tests._support import REPO_ROOT
from tests._support.otlp_receiver import Receiver, start_grpc, wait_for

pytestmark = pytest.mark.e2e  # a Ray driver script in a subprocess

pytest.importorskip("ray")

ROOT = str(REPO_ROOT)

DRIVER = textwrap.dedent('''
    """The ordinary user script of the README: decorated functions used by Ray tasks and by an actor."""
    import asyncio
    import json
    import os
    import sys

    import ray

    import otel_agentloop as oal
    from otel_agentloop.integrations import ray as oal_ray


    @oal.trace_tool("search")
    def search(q):
        return q.upper()


    @oal.trace_generate(model="m")
    async def generate(prompt):
        await asyncio.sleep(0)
        return prompt + "!"


    @oal.trace_reward
    def reward(text):
        return float(len(text))


    @oal.phase("tool_calls", tool="stream")
    def stream(n):
        for i in range(n):
            yield i


    @oal.trace_generate(model="tokens")
    async def tokens(n):
        for i in range(n):
            await asyncio.sleep(0)
            yield i


    def flush():
        assert oal.current_handle().force_flush(10)


    @ray.remote
    def task(i):
        with oal.sample(i, step=1):
            text = asyncio.run(generate(search("q")))
            parts = list(stream(2))
            score = reward(text)
        flush()
        return os.getpid(), text, parts, score


    @ray.remote
    class Agent:
        @oal.trace_tool("actor_tool")
        def tool(self, x):
            return x * 2

        @oal.trace_generate(model="actor")
        async def think(self, x):
            await asyncio.sleep(0)
            return x + 1

        async def episode(self, i):
            async with oal.sample(i, step=2):
                text = await generate(search("a"))
                got = [t async for t in tokens(3)]
                parts = list(stream(1))
                thought = await self.think(len(got))
                score = reward(text)
                doubled = self.tool(len(parts))
            flush()
            return os.getpid(), text, got, thought, score, doubled

        def done(self):
            flush()


    if __name__ == "__main__":
        handle = oal.configure("main-script", endpoint=sys.argv[1], protocol="grpc", schedule_delay_s=0.05)
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            runtime_env=oal_ray.runtime_env(handle, base={"env_vars": {"PYTHONPATH": sys.argv[2]}}),
        )
        try:
            tasks = ray.get([task.remote(i) for i in range(2)], timeout=120)
            agent = Agent.remote()
            episodes = ray.get([agent.episode.remote(i) for i in (10, 11)], timeout=120)
            direct = ray.get([agent.tool.remote(4), agent.think.remote(4)], timeout=120)
            ray.get(agent.done.remote(), timeout=60)
        finally:
            ray.shutdown()
        handle.shutdown(5)
        print(json.dumps({"driver": os.getpid(), "tasks": tasks, "episodes": episodes, "direct": direct}))
''')


def test_driver_script_decorated_functions_run_in_ray_tasks_and_an_actor(tmp_path) -> None:
    receiver = Receiver()
    server, endpoint = start_grpc(receiver)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = ROOT
    try:
        out = subprocess.run(
            [sys.executable, str(script), endpoint, ROOT],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-4000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert [t[1:] for t in result["tasks"]] == [["Q!", [0, 1], 2.0]] * 2
        assert [e[1:] for e in result["episodes"]] == [["A!", [0, 1, 2], 4, 2.0, 2]] * 2
        assert result["direct"] == [8, 5]
        workers = {t[0] for t in result["tasks"]} | {e[0] for e in result["episodes"]}
        assert result["driver"] not in workers

        # every phase of every sample, from the worker processes, below its sample's root span
        expected = {  # span name -> (phase, count per task sample, count per actor sample)
            "execute_tool search": (sc.TOOL_CALLS, 1, 1),
            "text_completion m": (sc.GENERATE, 1, 1),
            "execute_tool stream": (sc.TOOL_CALLS, 1, 1),
            sc.REWARD_SPAN: (sc.COMPUTE_SCORE, 1, 1),
            "text_completion tokens": (sc.GENERATE, 0, 1),
            "text_completion actor": (sc.GENERATE, 0, 1),
            "execute_tool actor_tool": (sc.TOOL_CALLS, 0, 1),
        }
        total = sum(n for _, n, _ in expected.values()) * 2 + sum(n for _, _, n in expected.values()) * 2
        phases = lambda: [r for r in receiver.records if sc.RL_PHASE in r.attributes]  # noqa: E731
        assert wait_for(lambda: len(phases()) >= total + 2, 30), sorted(r.name for r in receiver.records)
        roots = {r.span_id: r for r in receiver.records if r.name == sc.SAMPLE_SPAN}
        assert sorted(r.attributes[sc.RL_SAMPLE_INDEX] for r in roots.values()) == [0, 1, 10, 11]
        for index, step, column in ((0, 1, 1), (1, 1, 1), (10, 2, 2), (11, 2, 2)):
            (root,) = [r for r in roots.values() if r.attributes[sc.RL_SAMPLE_INDEX] == index]
            assert root.attributes[sc.RL_STEP] == step
            assert root.resource["process.pid"] in workers
            children = [r for r in phases() if r.parent_id == root.span_id]
            for name, spec in expected.items():
                matching = [r for r in children if r.name == name]
                assert len(matching) == spec[column], (index, name, [r.name for r in children])
                for r in matching:
                    assert r.trace_id == root.trace_id and r.attributes[sc.RL_PHASE] == spec[0]
                    assert r.attributes[sc.RL_SAMPLE_INDEX] == index and r.attributes[sc.RL_STEP] == step
                    assert r.resource["process.pid"] == root.resource["process.pid"]
        # the actor's decorated methods called straight from the driver: phase spans outside any sample
        outside = [r for r in phases() if r.parent_id not in roots]
        assert sorted(r.name for r in outside) == ["execute_tool actor_tool", "text_completion actor"]
        assert all(sc.RL_SAMPLE_INDEX not in r.attributes for r in outside)
    finally:
        server.stop(0)
