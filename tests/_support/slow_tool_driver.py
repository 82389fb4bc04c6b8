"""A small agent-loop job where one thing gets slower from a given step on (run as a script: its code is in
``__main__``, the way users write it).

Each step runs ``--prompts`` x ``--rollout-n`` samples concurrently: 2-3 generation turns, between turns one or
two of the tools ``search``, ``calculator``, ``python`` in parallel, then a reward; each step's metrics are
collected with ``handle.metrics.collect`` (printed as one JSON line per step). Spans go to ``--file``, and over
OTLP too when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set. ``--slow NAME --factor X
--from-step S``: from step S on, the tool NAME (or ``generate``) takes X times longer. Latencies are seeded.
"""

import argparse
import asyncio
import json
import random

import otel_agentloop as oal

TOOLS = ("search", "calculator", "python")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--file", required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--rollout-n", type=int, default=2)
    p.add_argument("--slow", default="search", help="a tool name, or 'generate'")
    p.add_argument("--factor", type=float, default=10.0)
    p.add_argument("--from-step", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--service", default="compare-driver")
    args = p.parse_args()
    handle = oal.configure(args.service, file=args.file)  # and OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set

    def factor(step: int, name: str) -> float:
        return args.factor if step >= args.from_step and name == args.slow else 1.0

    @oal.trace_generate(model="driver-7b")
    async def generate(step: int, rng: random.Random) -> None:
        await asyncio.sleep(rng.lognormvariate(0.0, 0.3) * 0.05 * factor(step, "generate"))

    def make_tool(name: str):  # one decorated function per tool name
        @oal.trace_tool(name)
        async def tool(step: int, rng: random.Random) -> str:
            await asyncio.sleep(rng.uniform(0.02, 0.05) * factor(step, name))
            return "ok"

        return tool

    tools = {name: make_tool(name) for name in TOOLS}

    @oal.trace_reward
    async def reward(rng: random.Random) -> float:
        await asyncio.sleep(0.01)
        return rng.random()

    async def one(step: int, index: int, rollout: int) -> None:
        rng = random.Random(hash((args.seed, step, index, rollout)) & 0xFFFFFFFF)
        async with oal.sample(index, rollout_n=rollout):
            turns = rng.randint(2, 3)
            for turn in range(turns):
                await generate(step, rng)
                if turn < turns - 1:
                    names = rng.sample(TOOLS, rng.randint(1, 2))
                    await asyncio.gather(*(tools[n](step, rng) for n in names))
            await reward(rng)

    for step in range(1, args.steps + 1):
        with oal.step(step):
            work = [(i, n) for i in range(args.prompts) for n in range(args.rollout_n)]

            async def rollout() -> None:
                await asyncio.gather(*(one(step, i, n) for i, n in work))  # noqa: B023 (awaited here)

            asyncio.run(rollout())
        metrics = handle.metrics.collect(step)
        print(json.dumps({"step": step, "metrics": dict(metrics)}), flush=True)
    handle.force_flush(30)
    handle.shutdown()


if __name__ == "__main__":
    main()
