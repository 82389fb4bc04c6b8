"""Steps of generation turns carrying an engine's state (issue 36), rolled out and collected by a real handle,
with the engines' load as ``rl.engine.load`` spans over each step's time (tests/analysis/test_engine_load.py and
its Jaeger twin in tests/e2e)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from opentelemetry import trace

import otel_agentloop as oal
from otel_agentloop import semconv as sc


@dataclass
class Turn:
    """One generation turn and the engine attributes it sets (absent ones are not set); ``mark``: note its start in
    :data:`MARKS` (the engine's load is drawn from then on)."""

    sleep_s: float = 0.002
    attrs: Mapping[str, object] = field(default_factory=dict)
    mark: bool = False


MARKS: list[int] = []


def ordinary(**over: object) -> Turn:
    attrs: dict[str, object] = {
        sc.RL_ENGINE_NAME: "vllm",
        sc.RL_ENGINE_QUEUE_S: 0.001,
        sc.RL_ENGINE_DECODE_S: 0.01,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 10,
        sc.GEN_AI_USAGE_INPUT_TOKENS: 1600,
        sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 1500,
        sc.RL_ENGINE_BATCH_RUNNING_MAX: 64,
        sc.RL_ENGINE_BATCH_RUNNING_MEAN: 60.0,
        sc.RL_ENGINE_BATCH_WAITING_MAX: 2,
        sc.RL_ENGINE_KV_CACHE_USAGE_MAX: 0.5,
        sc.RL_ENGINE_ITERATIONS: 12,
        sc.RL_ENGINE_PREEMPTIONS: 0,
        sc.RL_ENGINE_FINISH: "finished",
    }
    attrs.update(over)
    return Turn(attrs={k: v for k, v in attrs.items() if v is not None})


@oal.trace_generate(model="tiny")
async def _generate(turn: Turn) -> None:
    span = trace.get_current_span()
    if turn.mark:
        MARKS.append(time.time_ns())
    for key, value in turn.attrs.items():
        span.set_attribute(key, value)  # type: ignore[arg-type]
    await asyncio.sleep(turn.sleep_s)


@oal.trace_reward
async def _reward() -> float:
    return 1.0


async def _rollout(step: int, samples: Sequence[Sequence[Turn]]) -> None:
    async def one(i: int, turns: Sequence[Turn]) -> None:
        async with oal.sample(i, 0):
            for turn in turns:
                await _generate(turn)
            await _reward()

    with oal.step(step):
        await asyncio.gather(*(one(i, s) for i, s in enumerate(samples)))


def load_span(
    provider: trace.TracerProvider,
    start_ns: int,
    points: Sequence[tuple[int, int, int, float, int]],
    *,
    engine_id: str = "host:1:0",
    step: int | None = None,
) -> None:
    """One ``rl.engine.load`` root span, as DESIGN-36 shapes it: points (offset ms, running, waiting, kv, preempted)."""
    attrs: dict[str, object] = {
        sc.RL_ENGINE_NAME: "vllm",
        sc.RL_ENGINE_ID: engine_id,
        sc.RL_ENGINE_LOAD_OFFSET_MS: [p[0] for p in points],
        sc.RL_ENGINE_LOAD_RUNNING: [p[1] for p in points],
        sc.RL_ENGINE_LOAD_WAITING: [p[2] for p in points],
        sc.RL_ENGINE_LOAD_KV_CACHE_USAGE: [p[3] for p in points],
        sc.RL_ENGINE_LOAD_PREEMPTIONS: [p[4] for p in points],
    }
    if step is not None:
        attrs[sc.RL_STEP] = step
    tracer = provider.get_tracer("otel_agentloop.integrations.vllm")
    span = tracer.start_span(
        sc.ENGINE_LOAD_SPAN,
        context=trace.set_span_in_context(trace.INVALID_SPAN),
        kind=trace.SpanKind.INTERNAL,
        attributes=attrs,  # type: ignore[arg-type]
        start_time=start_ns,
    )
    span.end(end_time=start_ns + points[-1][0] * 1_000_000)


def run_steps(
    path: Path | None,
    steps: Mapping[int, Sequence[Sequence[Turn]]],
    monkeypatch: pytest.MonkeyPatch,
    *,
    loads: bool = False,
    service: str = "engine-load",
    endpoint: str | None = None,
) -> dict[int, dict[str, float]]:
    """Each step rolled out and collected by a handle writing ``path`` (or exporting to ``endpoint``); with ``loads``,
    each step's engine load as two engines' ``rl.engine.load`` spans over the step's time (one without ``rl.step``,
    as a server actor writes, beginning ``UNSTEPPED_LEAD_MS`` before the points it has in the step)."""
    monkeypatch.setenv("OTEL_AGENTLOOP_FAST_PATH", "true")
    where = {"file": str(path)} if path is not None else {"endpoint": endpoint}
    handle = oal.configure(service, **where, set_global=False, schedule_delay_s=0.05)  # type: ignore[arg-type]
    collected = {}
    try:
        for step, samples in steps.items():
            MARKS.clear()
            asyncio.run(_rollout(step, samples))
            collected[step] = dict(handle.metrics.collect(step))
            if loads:  # the engine's load from 10 ms after the long turn began (it lasts LONG_S)
                assert handle.provider is not None and MARKS
                t0 = MARKS[0] + 10_000_000
                load_span(handle.provider, t0, POINTS_A, engine_id="host:1:0", step=step)
                lead = [(0, 0, 0, 0.0, 0)] + [(o + UNSTEPPED_LEAD_MS, *p) for o, *p in POINTS_B]  # idle until then
                load_span(handle.provider, t0 - UNSTEPPED_LEAD_MS * 1_000_000, lead, engine_id="host:2:0")
                if step == 1:  # a span of step 2 over step 1's time: never step 1's
                    load_span(handle.provider, t0, POINTS_B, engine_id="host:3:0", step=2)
        assert handle.force_flush(10)
    finally:
        handle.shutdown(5)
    return collected


LONG_S = 0.5
POINTS_A = [(0, 4, 0, 0.25, 0), (100, 8, 3, 0.97, 2), (200, 6, 1, 0.75, 0)]
POINTS_B = [(0, 2, 0, 0.1, 0), (300, 3, 0, 0.2, 1)]
UNSTEPPED_LEAD_MS = 45_000
"""The unstepped engine's window began this long before its points in the step (an engine idle until then): past
Jaeger's step window slack (30 s), within a reader's reach (60 s)."""
# A step: four ordinary samples, one preempted at a full cache, one decoding slowly in a crowded engine, one that
# missed the prefix cache, one partial rollout resumed twice under newer policies.
PREEMPTED = [ordinary(**{sc.RL_ENGINE_PREEMPTIONS: 2, sc.RL_ENGINE_KV_CACHE_USAGE_MAX: 0.97}), ordinary()]
CROWDED = [ordinary(**{sc.RL_ENGINE_DECODE_S: 0.031, sc.RL_ENGINE_BATCH_RUNNING_MEAN: 240.0})]
MISSED = [ordinary(**{sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 0, sc.GEN_AI_USAGE_INPUT_TOKENS: 1800})]
PARTIAL = [
    ordinary(**{sc.RL_ENGINE_SEGMENTS: 3, sc.RL_ENGINE_POLICY_VERSIONS: [13, 14, 15]}),
]
STEP1 = [[ordinary()], [ordinary()], [ordinary()], [ordinary()], PREEMPTED, CROWDED, MISSED, PARTIAL]
LOADED = {
    1: [[Turn(sleep_s=LONG_S, attrs=ordinary().attrs, mark=True)], PREEMPTED, [ordinary()], PARTIAL],
    2: [[Turn(sleep_s=LONG_S, attrs=ordinary().attrs, mark=True)], [ordinary()]],
}
