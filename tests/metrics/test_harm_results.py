"""Results are never lost nor wrong (issue 21): samples still running at ``collect(step)`` reach the next
collect of their step, whole and once; a step whose every sample hangs keeps its watchdog verdict."""

from __future__ import annotations

import asyncio
import time

import pytest

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop import testing
from otel_agentloop.integrations import ray as oal_ray
from otel_agentloop.metrics import StepMetrics
from tests._support.spans import span_metrics

TURN_S = 0.02


@oal.trace_generate(model="m")
async def generate(delay: float) -> None:
    await asyncio.sleep(delay)


@oal.trace_tool("hang")
async def hang(release: asyncio.Event) -> None:
    await release.wait()


async def _wait_for(condition, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def _late_step(handle: oal.Handle, *, running: int, finished: int) -> tuple[StepMetrics, ...]:
    """Step 7: ``finished`` samples end before the first collect; ``running`` samples make one generation turn
    before it and one after it. Collects step 7 three times: while they run, after they end, and again."""
    turns_before: list[int] = []

    async def late(i: int, release: asyncio.Event) -> None:
        async with oal.sample(100 + i, rollout_n=i % 2):
            await generate(TURN_S)
            turns_before.append(i)
            await release.wait()
            await generate(TURN_S)

    async def quick(i: int) -> None:
        async with oal.sample(i):
            await generate(0.001)

    async def main() -> tuple[StepMetrics, ...]:
        release = asyncio.Event()
        with oal.step(7):
            tasks = [asyncio.create_task(late(i, release)) for i in range(running)]
            await asyncio.gather(*(quick(i) for i in range(finished)))
            await _wait_for(lambda: len(turns_before) == running)
            first = handle.metrics.collect(7)
            release.set()
            await asyncio.gather(*tasks)
        assert handle.force_flush(5)
        return first, handle.metrics.collect(7), handle.metrics.collect(7)

    return asyncio.run(main())


def test_samples_running_at_collect_reach_the_next_collect_of_their_step_whole_and_once(traced) -> None:
    first, second, third = _late_step(traced.handle, running=20, finished=0)
    # the case: 20 samples in flight at the first collect
    assert first["agent_loop/num_samples"] == 0
    assert first["agent_loop/telemetry/samples_in_flight"] == 20
    # once they end, the next collect of the step holds all 20, flagged late, with both turns (one of them
    # ended before the first collect): 2 x 20 ms each, not one turn
    assert second["agent_loop/num_samples"] == 20
    assert second["agent_loop/late_samples"] == 20
    assert second["agent_loop/telemetry/samples_in_flight"] == 0
    assert 2 * TURN_S <= second["agent_loop/generate_sequences/min"] < 2 * TURN_S + 1.0
    # and never again
    assert span_metrics(third) == {"agent_loop/num_samples": 0.0}


def test_a_partly_running_step_splits_its_samples_between_collects_with_none_counted_twice(traced) -> None:
    first, second, third = _late_step(traced.handle, running=5, finished=8)
    assert first["agent_loop/num_samples"] == 8 and "agent_loop/late_samples" not in first
    assert first["agent_loop/telemetry/samples_in_flight"] == 5
    assert first["agent_loop/slowest/sample_index"] < 8  # only the quick samples
    assert second["agent_loop/num_samples"] == 5 and second["agent_loop/late_samples"] == 5
    assert second["agent_loop/generate_sequences/min"] >= 2 * TURN_S
    assert 100 <= second["agent_loop/slowest/sample_index"] < 105
    assert third["agent_loop/num_samples"] == 0
    spans = traced.by_name(sc.SAMPLE_SPAN)
    assert len(spans) == 13 == first["agent_loop/num_samples"] + second["agent_loop/num_samples"]


def test_a_sample_running_through_two_collects_is_counted_once_at_the_third(traced) -> None:
    handle = traced.handle

    async def main() -> list[StepMetrics]:
        gates = [asyncio.Event(), asyncio.Event()]
        turns: list[int] = []

        async def slow() -> None:
            async with oal.sample(3):
                for gate in gates:
                    await generate(TURN_S)
                    turns.append(1)
                    await gate.wait()
                await generate(TURN_S)

        with oal.step(1):
            task = asyncio.create_task(slow())
            out = []
            for gate in gates:
                await _wait_for(lambda: len(turns) == len(out) + 1)
                out.append(handle.metrics.collect(1))
                gate.set()
            await task
        assert handle.force_flush(5)
        out.append(handle.metrics.collect(1))
        return out

    first, second, third = asyncio.run(main())
    assert [m["agent_loop/num_samples"] for m in (first, second, third)] == [0, 0, 1]
    assert [m["agent_loop/telemetry/samples_in_flight"] for m in (first, second, third)] == [1, 1, 0]
    assert third["agent_loop/late_samples"] == 1
    assert 3 * TURN_S <= third["agent_loop/generate_sequences/max"] < 3 * TURN_S + 1.0  # all three turns


def test_a_span_that_outlives_its_counted_sample_never_makes_it_count_twice(traced) -> None:
    """A generation task that outlives its sample ends after the step's collect: the sample was counted whole
    in that result already; its straggler span is counted in spans_after_collect, never a second result."""
    handle = traced.handle

    async def main() -> tuple[StepMetrics, StepMetrics]:
        release = asyncio.Event()

        async def straggler() -> None:
            await release.wait()
            await generate(0.001)

        with oal.step(6):
            async with oal.sample(0):
                await generate(TURN_S)
                task = asyncio.create_task(straggler())  # copies the sample's context, outlives it
            first = handle.metrics.collect(6)
            release.set()
            await task
            async with oal.sample(1):  # a new sample of the step, after its collect: the next result
                await generate(0.001)
        assert handle.force_flush(5)
        return first, handle.metrics.collect(6)

    first, second = asyncio.run(main())
    assert first["agent_loop/num_samples"] == 1 and first["agent_loop/telemetry/spans_after_collect"] == 0
    assert second["agent_loop/num_samples"] == 1 and second["agent_loop/slowest/sample_index"] == 1
    assert "agent_loop/late_samples" not in second
    assert second["agent_loop/telemetry/spans_after_collect"] == 1


def test_late_samples_are_in_a_later_worker_table_of_the_step_and_merge_like_collect(traced) -> None:
    """The Ray path (worker_table, merge_metrics) carries the late flag like collect()."""
    results: list[object] = []

    async def main() -> None:
        release = asyncio.Event()

        async def late() -> None:
            async with oal.sample(1):
                await generate(TURN_S)
                await release.wait()

        with oal.step(4):
            async with oal.sample(0):
                await generate(0.001)
            task = asyncio.create_task(late())
            await asyncio.sleep(0.1)
            results.append(oal_ray.worker_table(4))
            release.set()
            await task
        results.append(oal_ray.worker_table(4))

    asyncio.run(main())
    first, second = results
    merged = oal_ray.merge_metrics([first, second])  # type: ignore[list-item]
    assert merged["agent_loop/num_samples"] == 2 and merged["agent_loop/late_samples"] == 1
    assert oal_ray.merge_metrics([first])["agent_loop/num_samples"] == 1  # type: ignore[list-item]


def test_late_samples_never_collected_again_are_counted_when_forgotten() -> None:
    with testing.capture() as captured:
        handle = captured.handle
        max_steps = handle.metrics.max_steps

        async def main() -> None:
            release = asyncio.Event()

            async def late() -> None:
                async with oal.sample(0):
                    await generate(0.001)
                    await release.wait()

            with oal.step(0):
                task = asyncio.create_task(late())
                await asyncio.sleep(0.05)
                handle.metrics.collect(0)
                release.set()
                await task
            for step in range(1, max_steps + 1):  # steps never collected push the late state out
                with oal.step(step), oal.sample(0):
                    await generate(0.001)
            assert handle.force_flush(5)

        asyncio.run(main())
        stats = handle.metrics.stats
        assert stats["late_samples_evicted"] == 1
        assert stats["steps_evicted"] == 0  # step 0 was collected: not an uncollected step


# -- a whole step hung: the watchdog's verdict survives a collect with no ended span -------------------------
@pytest.fixture
def live():  # type: ignore[no-untyped-def]
    settings = oal.WatchdogSettings(interval_s=0.05, thresholds_s={"tool:hang": 0.2})
    with testing.capture(watchdog=settings) as captured:
        yield captured


def test_a_step_whose_every_sample_hangs_keeps_its_hung_verdict(live) -> None:
    handle = live.handle

    async def main() -> StepMetrics:
        release = asyncio.Event()

        async def stuck(i: int) -> None:
            async with oal.sample(i):
                await hang(release)  # the first phase never ends before the collect

        with oal.step(9):
            tasks = [asyncio.create_task(stuck(i)) for i in range(2)]
            await _wait_for(lambda: [s.overdue for s in handle.inflight()] == [True, True])
            metrics = handle.metrics.collect(9)
            release.set()
            await asyncio.gather(*tasks)
        return metrics

    metrics = asyncio.run(main())
    roots = live.by_name(sc.SAMPLE_SPAN)
    assert metrics["agent_loop/num_samples"] == 0
    assert metrics["agent_loop/telemetry/samples_in_flight"] == 2
    assert metrics["agent_loop/watchdog/hung"] == 2 and metrics["agent_loop/watchdog/slow"] == 0
    assert sorted(metrics.hung_trace_ids) == sorted(format(s.context.trace_id, "032x") for s in roots)
    assert sorted(s.sample_index for s in metrics.hung_samples) == [0, 1]


def test_a_worker_whose_every_sample_hangs_keeps_its_verdict_on_the_ray_path(live) -> None:
    handle = live.handle

    async def main() -> StepMetrics:
        release = asyncio.Event()

        async def stuck() -> None:
            async with oal.sample(0):
                await hang(release)

        with oal.step(2):
            task = asyncio.create_task(stuck())
            await _wait_for(lambda: [s.overdue for s in handle.inflight()] == [True])
            table = oal_ray.worker_table(2)
            metrics = oal_ray.add_verdicts(oal_ray.merge_metrics([table]), [oal_ray.worker_verdict(2)])
            release.set()
            await task
        return metrics

    metrics = asyncio.run(main())
    assert metrics["agent_loop/watchdog/hung"] == 1 and len(metrics.hung_trace_ids) == 1


# -- a sample's root span is matched with its start, whatever attributes it carries --------------------------
@pytest.mark.parametrize("attrs", [{sc.RL_PHASE: sc.TOOL_CALLS}, {sc.RL_PHASE: "other"}, {sc.RL_SNAPSHOT: True}])
def test_a_sample_with_a_users_reserved_attribute_is_counted_and_leaves_nothing_running(traced, attrs) -> None:
    handle = traced.handle
    for _ in range(2):
        with oal.step(1), oal.sample(0, attributes=attrs), oal.span(sc.TOOL_CALLS, tool="t"):
            time.sleep(0.001)
        metrics = handle.metrics.collect(1)
        assert metrics["agent_loop/num_samples"] == 1
        assert metrics["agent_loop/telemetry/samples_in_flight"] == 0
        assert metrics["agent_loop/tool_calls/max"] >= 0.001


def test_identity_set_on_a_running_sample_never_leaves_it_running_forever(traced) -> None:
    """A root span whose rl.step is rewritten while it runs still ends where it started: the next sample of
    the same identity is counted, not hidden as 'in flight' forever."""
    from opentelemetry import trace

    handle = traced.handle
    with oal.step(1), oal.sample(0):
        trace.get_current_span().set_attribute(sc.RL_STEP, 99)
    handle.metrics.collect(99)
    with oal.step(1), oal.sample(0):
        pass
    metrics = handle.metrics.collect(1)
    assert metrics["agent_loop/num_samples"] == 1
    assert metrics["agent_loop/telemetry/samples_in_flight"] == 0


# -- verl identity values: read whatever form they arrive in, never raise (the span never depends on it) -----
def test_verl_identity_values_are_read_in_every_form_they_arrive_in(caplog) -> None:
    import numpy as np

    from otel_agentloop.integrations.verl._rows import identity_int, read_identity

    class NonTensorData:  # tensordict's wrapper: the value under .data
        def __init__(self, data: object) -> None:
            self.data = data

    class Scalar:  # a 0-d tensor: .item()
        def item(self) -> int:
            return 12

    read = {
        "int64 bytes": np.array([257], dtype=np.int64).tobytes(),  # an int64 column's element in V1's worker
        "int64 bytes, big": np.array([(1 << 40) + 7], dtype=np.int64).tobytes(),
        "negative int32 bytes": np.array([-3], dtype=np.int32).tobytes(),
        "numpy int64": np.int64(5),
        "0-d array": np.array(6),
        "one-element array": np.array([9]),
        "tensor-like": Scalar(),
        "NonTensorData": NonTensorData(np.int64(4)),
        "int": 2,
        "integral float": 3.0,
        "decimal text": " 11 ",
    }
    assert {k: identity_int(v) for k, v in read.items()} == {
        "int64 bytes": 257,
        "int64 bytes, big": (1 << 40) + 7,
        "negative int32 bytes": -3,
        "numpy int64": 5,
        "0-d array": 6,
        "one-element array": 9,
        "tensor-like": 12,
        "NonTensorData": 4,
        "int": 2,
        "integral float": 3,
        "decimal text": 11,
    }
    for bad in (None, b"7", 3.5, float("nan"), "x", np.array([1, 2]), object(), 1 << 70, NonTensorData(None)):
        assert identity_int(bad) is None, bad
    assert read_identity("sample_index", b"xyz") is None and read_identity("sample_index", b"\x00") is None
    warnings = [r.getMessage() for r in caplog.records if "sample_index" in r.getMessage()]
    assert warnings == [
        "otel_agentloop: verl's sample_index (a bytes) cannot be read as an int; sample spans are recorded without it"
    ]


def test_identity_keys_in_sample_attributes_never_split_a_sample() -> None:
    """``attributes={"rl.sample.rollout_n": 0}`` without ``rollout_n=`` put rollout 0 on the root span only: the
    metrics then saw two samples (the root's, and its phases' with no rollout)."""
    with testing.capture() as captured:
        handle = captured.handle
        with oal.step(5), oal.sample(3, attributes={sc.RL_ROLLOUT_N: 0, sc.RL_STEP: 99, "team": "rl"}):
            asyncio.run(generate(0.001))
        assert handle.force_flush(5)
        metrics = handle.metrics.collect(5)
        root = captured.by_name(sc.SAMPLE_SPAN)[0]
    assert sc.RL_ROLLOUT_N not in root.attributes and root.attributes[sc.RL_STEP] == 5
    assert root.attributes["team"] == "rl"
    assert metrics["agent_loop/num_samples"] == 1, metrics
