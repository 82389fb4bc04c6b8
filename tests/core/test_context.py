"""Sample identity and parentage survive asyncio.gather, to_thread, executors (with bind) and threads."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import otel_agentloop as oal
from otel_agentloop import semconv as sc


@oal.trace_tool("work")
def work(tag: str) -> str:
    return tag


def test_identity_survives_gather_threads_and_executors(traced) -> None:
    pool = ThreadPoolExecutor(2)

    async def one(i: int) -> None:
        async with oal.sample(i, rollout_n=i + 10):
            loop = asyncio.get_running_loop()
            await asyncio.gather(
                asyncio.to_thread(work, "to_thread"),
                loop.run_in_executor(pool, oal.bind(work), "executor"),
            )
            t = threading.Thread(target=oal.bind(work), args=("thread",))
            t.start()
            t.join(5)

    async def main() -> None:
        with oal.step(5, validate=True):
            await asyncio.gather(*(one(i) for i in range(4)))

    asyncio.run(main())
    pool.shutdown()
    roots = {s.attributes[sc.RL_SAMPLE_INDEX]: s for s in traced.by_name("rl.sample")}
    tools = traced.by_name("execute_tool work")
    assert len(tools) == 12
    for span in tools:
        idx = span.attributes[sc.RL_SAMPLE_INDEX]
        assert span.attributes[sc.RL_STEP] == 5
        assert span.attributes[sc.RL_VALIDATE] is True
        assert span.attributes[sc.RL_ROLLOUT_N] == idx + 10
        assert span.parent.span_id == roots[idx].context.span_id
        assert span.context.trace_id == roots[idx].context.trace_id
    metrics = traced.handle.metrics.collect(5, validate=True)
    assert metrics["agent_loop/num_samples"] == 4


def test_run_in_executor_without_bind_loses_the_sample(traced) -> None:
    """The documented trap: run_in_executor does not copy context; the span is then outside any sample."""
    pool = ThreadPoolExecutor(1)

    async def main() -> None:
        async with oal.sample(0):
            await asyncio.get_running_loop().run_in_executor(pool, work, "lost")

    asyncio.run(main())
    pool.shutdown()
    (span,) = traced.by_name("execute_tool work")
    assert sc.RL_SAMPLE_INDEX not in span.attributes
    assert traced.handle.metrics.stats["spans_outside_sample"] == 1


def test_trace_per_sample_links_to_step_and_per_step_nests(traced) -> None:
    async def main(mode: str, step_no: int) -> None:
        with oal.step(step_no, trace_per=mode):
            await asyncio.gather(*(_sample(i) for i in range(3)))

    async def _sample(i: int) -> None:
        async with oal.sample(i):
            work("x")

    asyncio.run(main("sample", 1))
    asyncio.run(main("step", 2))
    spans = traced.spans()
    steps = {s.attributes[sc.RL_STEP]: s for s in spans if s.name == "rl.step"}
    roots1 = [s for s in spans if s.name == "rl.sample" and s.attributes[sc.RL_STEP] == 1]
    roots2 = [s for s in spans if s.name == "rl.sample" and s.attributes[sc.RL_STEP] == 2]
    # per sample: three distinct traces, each root a trace root linked to the step span
    assert len({r.context.trace_id for r in roots1}) == 3
    for r in roots1:
        assert r.parent is None
        assert [link.context.span_id for link in r.links] == [steps[1].context.span_id]
    # per step: one trace, samples are children of the step span
    assert {r.context.trace_id for r in roots2} == {steps[2].context.trace_id}
    assert all(r.parent.span_id == steps[2].context.span_id for r in roots2)
    assert all(not r.links for r in roots2)  # a link to its own parent says nothing (core/_context.root_context)


def test_sample_outside_a_step_starts_a_trace_linked_to_the_current_span(traced) -> None:
    # the rule verl's group span shares (core/_context.root_context): no step, so the current span is the link
    with oal.span("tool_calls", tool="dispatch"), oal.sample(0, step=1):
        work("x")
    spans = traced.spans()
    (outer,) = [s for s in spans if s.attributes.get(sc.RL_PHASE) == "tool_calls" and s.name.endswith("dispatch")]
    (root,) = [s for s in spans if s.name == "rl.sample"]
    assert root.parent is None and root.context.trace_id != outer.context.trace_id
    assert [link.context.span_id for link in root.links] == [outer.context.span_id]


def test_sample_outside_step_and_explicit_identity(traced) -> None:
    with oal.sample(4, rollout_n=1, step=9, validate=True) as s:
        work("x")
        assert oal.current_sample() is s
    assert oal.current_sample() is None
    (span,) = traced.by_name("execute_tool work")
    assert span.attributes[sc.RL_STEP] == 9 and span.attributes[sc.RL_VALIDATE] is True
    assert traced.handle.metrics.collect(9, validate=True)["agent_loop/num_samples"] == 1
