"""A scenario of samples timed the way verl's timers time them, and verl's formula for its ``agent_loop/*`` keys:
what the processor's metrics are checked against (tests/metrics/test_parity.py, tests/export/test_budget.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping

import numpy as np
from opentelemetry.sdk.trace import ReadableSpan

import otel_agentloop as oal
from otel_agentloop import semconv as sc

# seconds: float rounding of integer-nanosecond readings of the one monotonic clock. verl's timers wrap the call
# sites (a tool turn's timer includes creating and scheduling the gather's tasks) while spans start inside them,
# so on a loaded machine a timer can exceed its span by any amount: the checks are bounds and orderings, never a
# tolerance on that difference. What is exact: the metrics against the spans' own times.
SLACK = 1e-6
PHASES = ("generate_sequences", "tool_calls", "compute_score")


class BoomError(RuntimeError):
    pass


@oal.trace_generate(model="m")
async def generate(delay: float, preempted: int | None) -> None:
    await asyncio.sleep(delay)
    if preempted is not None:
        oal.record_generation(num_preempted=preempted)


@oal.trace_tool("search")
async def tool(delay: float, fail: bool) -> str:
    await asyncio.sleep(delay)
    if fail:
        raise BoomError("tool failed")
    return "ok"


@oal.trace_reward
async def reward(delay: float, fail: bool) -> float:
    await asyncio.sleep(delay)
    if fail:
        raise BoomError("reward failed")
    return 1.0


# (turns: list of (gen delay, num_preempted, [tool delays], failing tool index)), reward delay, reward fails
SCENARIO = [
    ([(0.03, 0, [0.02, 0.04, 0.03], None), (0.02, 1, [], None)], 0.01, False),  # parallel tools, 2 turns
    ([(0.08, None, [], None)], 0.02, False),  # no tools, single turn
    ([(0.02, 2, [0.05], None), (0.02, None, [0.01, 0.03], 1), (0.01, 0, [], None)], 0.01, False),  # failing tool
    ([(0.04, None, [0.02, 0.02], None), (0.01, 3, [], None)], 0.03, True),  # failing reward
    ([(0.12, 0, [], None)], 0.005, False),  # the slowest by generation
    ([(0.01, 0, [0.06, 0.01], 0)], 0.02, False),  # single failing parallel tool
]


async def run_sample(index: int, spec: object, timings: dict[str, float]) -> None:
    turns, reward_delay, reward_fails = spec  # type: ignore[misc]
    async with oal.sample(index, rollout_n=index % 2) as handle:
        preempted: int | None = None
        for gen_delay, npre, tools, failing in turns:
            t0 = time.perf_counter()
            await generate(gen_delay, npre)
            timings["generate_sequences"] += time.perf_counter() - t0
            # verl (tool_agent_loop): first turn sets num_preempted (None -> -1), later turns add (None -> 0)
            preempted = (npre if npre is not None else -1) if preempted is None else preempted + (npre or 0)
            if tools:
                t0 = time.perf_counter()
                await asyncio.gather(*(tool(d, i == failing) for i, d in enumerate(tools)), return_exceptions=True)
                timings["tool_calls"] += time.perf_counter() - t0
        timings["num_preempted"] = preempted if preempted is not None else -1
        handle.record(prompt_length=100 + index, response_length=200 + index)
        t0 = time.perf_counter()
        try:
            await reward(reward_delay, reward_fails)
        finally:
            timings["compute_score"] = time.perf_counter() - t0


def floors(spec: object) -> dict[str, float]:
    """The least time each phase of a SCENARIO sample can take under any load: its sleeps (a turn's parallel
    tools: the longest of them)."""
    turns, reward_delay, _ = spec  # type: ignore[misc]
    return {
        "generate_sequences": sum(turn[0] for turn in turns),
        "tool_calls": sum(max(turn[2]) for turn in turns if turn[2]),
        "compute_score": reward_delay,
    }


def phase_times(spans: Iterable[ReadableSpan]) -> dict[int, dict[str, float]]:
    """Per sample index, each phase's wall time covered by its spans (overlapping spans once), from the spans'
    own start and end: an independent reading of what the metrics must equal exactly."""
    intervals: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for span in spans:
        attrs = span.attributes or {}
        phase, index = attrs.get(sc.RL_PHASE), attrs.get(sc.RL_SAMPLE_INDEX)
        if phase in PHASES and isinstance(index, int) and span.start_time and span.end_time:
            intervals.setdefault((index, str(phase)), []).append((span.start_time, span.end_time))
    out: dict[int, dict[str, float]] = {}
    for (index, phase), spans_of in intervals.items():
        covered, reach = 0, 0
        for start, end in sorted(spans_of):
            covered += max(0, end - max(start, reach))
            reach = max(reach, end)
        out.setdefault(index, dict.fromkeys(PHASES, 0.0))[phase] = covered / 1e9
    return out


def assert_bounded(ours: Mapping[str, float], low: list[dict[str, float]], high: list[dict[str, float]]) -> None:
    """Load-proof check of verl's keys when the spans are not at hand: every sample's phase time lies between
    ``low`` (its sleeps) and ``high`` (verl-style timers around the calls), so each min/max/mean lies between the
    formula applied to either; counts are exact; the slowest sample is one that can be the slowest, with its
    own values."""
    lo, hi = verl_reference(low), verl_reference(high)
    for key, value in hi.items():
        if key.startswith("agent_loop/slowest/"):
            continue
        if "num_preempted" in key:
            assert ours[key] == value, key
        else:
            assert lo[key] - SLACK <= ours[key] <= value + SLACK, (key, lo[key], ours[key], value)
    k = int(ours["agent_loop/slowest/sample_index"])
    assert sum(high[k][p] for p in PHASES) + SLACK >= max(sum(r[p] for p in PHASES) for r in low), k
    for p in PHASES:
        assert low[k][p] - SLACK <= ours[f"agent_loop/slowest/{p}"] <= high[k][p] + SLACK, (k, p)
    for field in ("num_preempted", "prompt_length", "response_length"):
        assert ours[f"agent_loop/slowest/{field}"] == high[k][field], (k, field)


def verl_reference(rows: list[dict[str, float]]) -> dict[str, float]:
    """verl's AgentLoopManager._performance_metrics, written out independently."""
    gen = np.array([r["generate_sequences"] for r in rows])
    tool_t = np.array([r["tool_calls"] for r in rows])
    score = np.array([r["compute_score"] for r in rows])
    npre = np.array([r["num_preempted"] for r in rows])
    out: dict[str, float] = {}
    for name, arr in (
        ("num_preempted", npre),
        ("generate_sequences", gen),
        ("tool_calls", tool_t),
        ("compute_score", score),
    ):
        out[f"agent_loop/{name}/min"] = arr.min()
        out[f"agent_loop/{name}/max"] = arr.max()
        out[f"agent_loop/{name}/mean"] = arr.mean()
    slowest = int(np.argmax(gen + tool_t + score))
    out["agent_loop/slowest/generate_sequences"] = gen[slowest]
    out["agent_loop/slowest/tool_calls"] = tool_t[slowest]
    out["agent_loop/slowest/compute_score"] = score[slowest]
    out["agent_loop/slowest/num_preempted"] = npre[slowest]
    out["agent_loop/slowest/prompt_length"] = rows[slowest]["prompt_length"]
    out["agent_loop/slowest/response_length"] = rows[slowest]["response_length"]
    return out
