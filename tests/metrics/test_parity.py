"""The processor's dict equals verl's formula applied to timings taken the way verl's timers take them."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from tests._support.verl_formula import (
    PHASES,
    SCENARIO,
    SLACK,
    BoomError,
    floors,
    phase_times,
    run_sample,
    verl_reference,
)


@pytest.mark.parametrize("trace_per", ["sample", "step"])
def test_processor_matches_verl_formula(traced, trace_per) -> None:
    timings = [
        {
            "generate_sequences": 0.0,
            "tool_calls": 0.0,
            "compute_score": 0.0,
            "num_preempted": -1,
            "prompt_length": 100 + i,
            "response_length": 200 + i,
        }
        for i in range(len(SCENARIO))
    ]

    async def main() -> list[object]:
        with oal.step(7, trace_per=trace_per):
            return await asyncio.gather(
                *(run_sample(i, s, timings[i]) for i, s in enumerate(SCENARIO)), return_exceptions=True
            )

    outcomes = asyncio.run(main())
    assert isinstance(outcomes[3], BoomError) and sum(isinstance(o, BaseException) for o in outcomes) == 1

    ours = traced.handle.metrics.collect(7)
    spans = traced.spans()
    measured = phase_times(spans)
    rows = [{**timings[i], **measured[i]} for i in range(len(SCENARIO))]
    # each span lies inside verl's timer around its call, and covers its sleep: under any load
    for i, row in enumerate(rows):
        for p in PHASES:
            assert floors(SCENARIO[i])[p] - SLACK <= row[p] <= timings[i][p] + SLACK, (i, p, row[p], timings[i][p])
    expected = verl_reference(rows)
    for key, value in expected.items():
        assert ours[key] == pytest.approx(float(value), abs=SLACK), key
    # the verl keys are all there, plus ours
    assert set(expected) <= set(ours)
    assert ours["agent_loop/num_samples"] == len(SCENARIO)
    slowest = int(np.argmax([sum(row[p] for p in PHASES) for row in rows]))
    assert ours["agent_loop/slowest/sample_index"] == slowest
    # parallel tools count once: sample 0's tool time is the gather's wall time (its spans' union), at least its
    # longest call and less than the sum of its calls
    tools_0 = [
        ((s.end_time or 0) - (s.start_time or 0)) / 1e9
        for s in spans
        if s.name.startswith("execute_tool") and (s.attributes or {}).get(sc.RL_SAMPLE_INDEX) == 0
    ]
    assert len(tools_0) == 3 and max(tools_0) <= rows[0]["tool_calls"] < sum(tools_0), tools_0
    # sample without tools: exactly zero
    assert ours["agent_loop/tool_calls/min"] == 0.0
    # the slowest sample's trace id is its sample root's
    roots = {s.attributes["rl.sample.index"]: s for s in traced.by_name("rl.sample")}
    assert ours.slowest_trace_id == format(roots[slowest].context.trace_id, "032x")
    # state released
    assert traced.handle.metrics.open_steps() == []
    assert traced.handle.metrics.collect(7)["agent_loop/num_samples"] == 0


def test_failed_phases_still_count_and_are_marked(traced) -> None:
    timings = {"generate_sequences": 0.0, "tool_calls": 0.0, "compute_score": 0.0, "num_preempted": -1}

    async def main() -> None:
        with oal.step(1):
            await run_sample(3, SCENARIO[3], timings)

    with pytest.raises(BoomError, match="reward failed"):
        asyncio.run(main())
    metrics = traced.handle.metrics.collect(1)
    (rew,) = traced.by_name("rl.reward")
    # the failed reward's span counts: its own time exactly, which covers its sleep and lies inside verl's timer
    assert metrics["agent_loop/compute_score/max"] == pytest.approx(phase_times([rew])[3]["compute_score"], abs=SLACK)
    assert SCENARIO[3][1] - SLACK <= metrics["agent_loop/compute_score/max"] <= timings["compute_score"] + SLACK
    assert rew.status.status_code.name == "ERROR"
    assert rew.attributes["error.type"] == f"{BoomError.__module__}.BoomError"
    (root,) = traced.by_name("rl.sample")
    assert root.status.status_code.name == "ERROR"
