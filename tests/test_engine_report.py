"""Issue 28, item 3: the engine's timing inside each generation turn, read back.

Per step ``agent_loop/engine/<stat>/{p50,p90,p99,max}`` (exact, the same code live and in ``report``), the cause
of the slowest and slow samples in words (``metrics._summary.cause``), and each turn's engine part drawn inside
the turn: terminal waterfall, step page, Perfetto. Spans are written through the public API: a ``trace_generate``
phase whose body sets the engine's attributes on the current span, as an engine integration does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from opentelemetry import trace

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.analysis._decode import read_jsonl
from otel_agentloop.analysis._report import stored_summaries, summary_of
from otel_agentloop.metrics._summary import StepSummary, cause
from otel_agentloop.metrics._table import EngineSample

P = f"{sc.METRIC_PREFIX}/{sc.ENGINE_METRIC}"


@dataclass
class Turn:
    """One generation turn: how long it sleeps, and the engine attributes it sets (None: not set)."""

    sleep_s: float = 0.001
    queue_s: float | None = 0.001
    ttft_s: float | None = 0.002
    prefill_s: float | None = 0.001
    decode_s: float | None = 0.01
    output_tokens: int | None = 100


@dataclass
class Sample:
    turns: Sequence[Turn]
    tool_s: float = 0.0
    reward_s: float = 0.0


@oal.trace_generate(model="tiny")
async def _generate(turn: Turn) -> None:
    span = trace.get_current_span()
    values: Mapping[str, object] = {
        sc.RL_ENGINE_NAME: "vllm",
        sc.RL_ENGINE_QUEUE_S: turn.queue_s,
        sc.RL_ENGINE_TTFT_S: turn.ttft_s,
        sc.RL_ENGINE_PREFILL_S: turn.prefill_s,
        sc.RL_ENGINE_DECODE_S: turn.decode_s,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: turn.output_tokens,
        sc.GEN_AI_USAGE_INPUT_TOKENS: 10,
    }
    for key, value in values.items():
        if value is not None:
            span.set_attribute(key, value)  # type: ignore[arg-type]
    await asyncio.sleep(turn.sleep_s)


@oal.trace_tool("search")
async def _search(seconds: float) -> None:
    await asyncio.sleep(seconds)


@oal.trace_reward
async def _reward(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return 1.0


async def _rollout(step: int, samples: Sequence[Sample]) -> None:
    async def one(i: int, s: Sample) -> None:
        async with oal.sample(i, 0):
            for turn in s.turns:
                await _generate(turn)
            if s.tool_s:
                await _search(s.tool_s)
            await _reward(s.reward_s)

    with oal.step(step):
        await asyncio.gather(*(one(i, s) for i, s in enumerate(samples)))


def normal(n: int = 2) -> Sample:
    return Sample([Turn() for _ in range(n)])
