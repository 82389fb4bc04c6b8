"""Issue 36: the engine's state under each turn read back (metrics, causes) and the engine's load over time
(``rl.engine.load`` spans) stored with the traces, found for a step, and drawn (step page, Perfetto, run page).

Spans are written through the public API by a real configured handle writing a real trace folder: generation turns
that set the engine integration's attributes (DESIGN-36's names) on the current span, and ``rl.engine.load`` root
spans made with the handle's tracer provider, as the engine integration makes them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from opentelemetry import trace

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.analysis._reading._decode import Skipped
from otel_agentloop.analysis._reading._report import stored_summaries, summary_of
from otel_agentloop.analysis._reading._store import read_everything
from otel_agentloop.metrics._causes import StepEngine, cause
from otel_agentloop.metrics._table import EngineSample

P = f"{sc.METRIC_PREFIX}/{sc.ENGINE_METRIC}"


@dataclass
class Turn:
    """One generation turn and the engine attributes it sets (absent ones are not set)."""

    sleep_s: float = 0.002
    attrs: Mapping[str, object] = field(default_factory=dict)


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


def _run(
    path: Path, steps: Mapping[int, Sequence[Sequence[Turn]]], monkeypatch: pytest.MonkeyPatch, *, loads: bool = False
) -> dict[int, dict[str, float]]:
    """Each step rolled out and collected by a handle writing ``path``; with ``loads``, each step's engine load as two
    engines' ``rl.engine.load`` spans over the step's time (one without ``rl.step``, as a server actor writes)."""
    monkeypatch.setenv("OTEL_AGENTLOOP_FAST_PATH", "true")
    handle = oal.configure("engine-load", file=str(path), set_global=False, schedule_delay_s=0.05)
    collected = {}
    try:
        for step, samples in steps.items():
            t0 = oal_now()
            asyncio.run(_rollout(step, samples))
            collected[step] = dict(handle.metrics.collect(step))
            if loads:
                assert handle.provider is not None
                pts = [(0, 4, 0, 0.25, 0), (100, 8, 3, 0.97, 2), (200, 6, 1, 0.75, 0)]
                load_span(handle.provider, t0, pts, engine_id="host:1:0", step=step)
                load_span(handle.provider, t0, [(0, 2, 0, 0.1, 0), (300, 3, 0, 0.2, 1)], engine_id="host:2:0")
        assert handle.force_flush(10)
    finally:
        handle.shutdown(5)
    return collected


def oal_now() -> int:
    import time

    return time.time_ns()


# A step: four ordinary samples, one preempted at a full cache, one decoding slowly in a crowded engine, one that
# missed the prefix cache, one partial rollout resumed twice under newer policies.
PREEMPTED = [ordinary(**{sc.RL_ENGINE_PREEMPTIONS: 2, sc.RL_ENGINE_KV_CACHE_USAGE_MAX: 0.97}), ordinary()]
CROWDED = [ordinary(**{sc.RL_ENGINE_DECODE_S: 0.031, sc.RL_ENGINE_BATCH_RUNNING_MEAN: 240.0})]
MISSED = [ordinary(**{sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 0, sc.GEN_AI_USAGE_INPUT_TOKENS: 1800})]
PARTIAL = [
    ordinary(**{sc.RL_ENGINE_SEGMENTS: 3, sc.RL_ENGINE_POLICY_VERSIONS: [13, 14, 15]}),
]
STEP1 = [[ordinary()], [ordinary()], [ordinary()], [ordinary()], PREEMPTED, CROWDED, MISSED, PARTIAL]


def test_engine_state_metrics_are_exact_live_and_in_report(tmp_path, monkeypatch) -> None:
    """``collect()`` gives DESIGN-36's per-step engine figures from the turns' attributes, a report rebuilds the same
    from the trace folder, and the step summary stores them (what the run page reads)."""
    path = tmp_path / "traces"
    collected = _run(path, {1: STEP1, 2: [[Turn()], [Turn()]]}, monkeypatch)
    m = collected[1]
    means = [60.0] * 9
    means[5] = 240.0  # the crowded turn (the ninth turn, PREEMPTED having two)
    assert m[f"{P}/{sc.ENGINE_KV_CACHE_USAGE}/max"] == 0.97
    assert m[f"{P}/{sc.ENGINE_BATCH_RUNNING}/mean"] == pytest.approx(float(np.mean(means)))
    assert m[f"{P}/{sc.ENGINE_BATCH_RUNNING}/max"] == 64.0
    assert m[f"{P}/{sc.ENGINE_PREEMPTIONS}"] == 2.0
    assert m[f"{P}/{sc.ENGINE_CACHED_TOKENS}"] == 1500.0 * 8
    assert m[f"{P}/{sc.ENGINE_SEGMENTS}/max"] == 3.0
    assert not [k for k in collected[2] if "/engine/" in k]  # turns without the engine's facts: none of ours
    records = list(read_everything(str(path), Skipped(), lambda _: None))
    rebuilt = summary_of(records, 1)
    assert {k: v for k, v in rebuilt.metrics.items() if k.startswith(P)} == {
        k: v for k, v in m.items() if k.startswith(P)
    }
    stored = stored_summaries(records)[(1, False)]
    assert stored.metrics[f"{P}/{sc.ENGINE_KV_CACHE_USAGE}/max"] == 0.97
    assert stored.metrics[f"{P}/{sc.ENGINE_PREEMPTIONS}"] == 2.0


def test_causes_read_from_the_engine_state(tmp_path, monkeypatch) -> None:
    """Each slow sample's cause names the engine's state behind it, the same in ``report --json`` (from the trace
    folder) as in the step summary ``collect()`` wrote."""
    path = tmp_path / "traces"
    _run(path, {1: STEP1}, monkeypatch)
    out = subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "report", "--file", str(path), "--step", "1", "--json", "--top", "8"],
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    causes = {row["sample_index"]: row["cause"] for row in json.loads(out.stdout)["slowest"]}
    assert causes[4] == "preempted 2 times at 97 % KV cache"
    assert causes[5] == "decoded 3.1x slower than the step's median while the engine ran 240 sequences (step median 60)"
    assert causes[6] == "no prefix-cache hit on 1,800 prompt tokens (turn median 1,500 cached)"
    assert causes[7] == "aborted by 2 weight syncs, resumed under policy 14 and 15"
    assert causes[0].startswith("generation ")
    stored = stored_summaries(list(read_everything(str(path), Skipped(), lambda _: None)))[(1, False)]
    assert {s.index: s.cause for s in stored.top} == causes


STEP = StepEngine(100.0, 200.0, 900.0, 1900.0, running_median=60.0, cached_median=1500.0)


def _sample(**over: object) -> EngineSample:
    base = EngineSample(turns=1, queue_s=0.0, output_tokens=200, decode_s=2.0, decoded_tokens=200)
    return base._replace(**over)


def test_cause_rules_in_order() -> None:
    gen = lambda e: cause(generate_s=10.0, tool_s=0.0, score_s=0.0, engine=e, step=STEP)  # noqa: E731
    assert gen(_sample(preemptions=1, kv_max=None)) == "preempted once"
    assert gen(_sample(aborts=1, policy_versions=(3,))) == "aborted once"  # no newer policy known
    assert gen(_sample(aborts=1, policy_versions=(3, 4))) == "aborted by 1 weight sync, resumed under policy 4"
    assert gen(_sample(aborts=3, policy_versions=(1, 2, 3, 4))) == (
        "aborted by 3 weight syncs, resumed under policy 2, 3 and 4"
    )
    # aborts first, then preemption, then the queue, whichever else holds
    both = _sample(aborts=1, policy_versions=(3, 4), preemptions=2, kv_max=0.9, queue_s=9.0)
    assert gen(both).startswith("aborted")
    assert gen(both._replace(aborts=0)) == "preempted 2 times at 90 % KV cache"
    assert gen(_sample(queue_s=9.0, running_mean=500.0)) == "waited 9.00 s in the engine queue"
    # a slow decode among as many sequences as usual: the speed, not the load
    slow = _sample(decode_s=8.0, running_mean=80.0)
    assert gen(slow) == "decoded 4.0 times slower than the step's median (25 vs 100 tokens/s)"
    assert gen(slow._replace(running_mean=90.0)).endswith("while the engine ran 90 sequences (step median 60)")
    # a prefix-cache miss only when the step's turns usually hit it
    assert gen(_sample(missed_prompt_tokens=50)).startswith("no prefix-cache hit on 50 prompt tokens")
    no_cache = STEP._replace(cached_median=0.0)
    assert cause(generate_s=10.0, tool_s=0.0, score_s=0.0, engine=_sample(missed_prompt_tokens=50), step=no_cache) == (
        "generation 10.00 s"
    )
