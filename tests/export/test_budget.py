"""Trace budgets: metrics stay exact, whole prompts are kept, the slowest and failed samples are exported."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.demo._agent import SimConfig, run_samples
from tests._support.verl_formula import PHASES, SCENARIO, assert_bounded, floors, run_sample


def _configure(budget: int | None, **kw) -> tuple[oal.Handle, InMemorySpanExporter]:
    mem = InMemorySpanExporter()
    handle = oal.configure(
        "budget", exporters=[mem], set_global=False, schedule_delay_s=0.05, max_exported_samples_per_step=budget, **kw
    )
    return handle, mem


def _exported_samples(handle: oal.Handle, mem: InMemorySpanExporter) -> dict[int, list]:
    assert handle.force_flush(5)
    out: dict[int, list] = {}
    for span in mem.get_finished_spans():
        if sc.RL_SAMPLE_INDEX in span.attributes:
            out.setdefault(span.attributes[sc.RL_SAMPLE_INDEX], []).append(span)
    return out


@pytest.mark.parametrize("budget", [None, 2, 0])
def test_metrics_are_exact_under_any_budget_and_keepers_are_exported(budget) -> None:
    handle, mem = _configure(budget, keep_slowest=1)
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

    async def main() -> None:
        with oal.step(3):
            await asyncio.gather(
                *(run_sample(i, s, timings[i]) for i, s in enumerate(SCENARIO)), return_exceptions=True
            )

    try:
        asyncio.run(main())
        ours = handle.metrics.collect(3)
        # every sample counted whatever the budget; each value between the sleeps' and verl's timers' (load-proof)
        assert ours["agent_loop/num_samples"] == len(SCENARIO)
        low = [{**t, **floors(spec)} for t, spec in zip(timings, SCENARIO, strict=True)]
        assert_bounded(ours, low, timings)
        slowest = int(ours["agent_loop/slowest/sample_index"])
        exported = _exported_samples(handle, mem)
        failed = {2, 3, 5}  # SCENARIO[3]'s reward fails; samples 2 and 5 have a failing tool
        # the slowest of the samples that did not fail: one whose timer reaches past every other one's sleeps
        # (under no load only sample 4, its 0.12 s generation; under load another may truly be slower)
        ok = set(range(len(SCENARIO))) - failed
        longest_sleeps = max(sum(low[j][p] for p in PHASES) for j in ok)
        can_be_slowest_ok = {i for i in ok if sum(timings[i][p] for p in PHASES) >= longest_sleeps}
        if budget is None:
            assert set(exported) == set(range(len(SCENARIO)))
        else:
            # within budget (whole prompts), plus every failed sample, plus the slowest of the others
            keepers = set(exported) & can_be_slowest_ok
            assert set(exported) >= failed | {slowest} and keepers, (exported, can_be_slowest_ok)
            assert any(len(set(exported) - failed - {x}) <= budget for x in keepers), (exported, keepers)
            if budget == 0:
                (slowest_ok,) = set(exported) - failed
                assert slowest_ok in can_be_slowest_ok and set(exported) == failed | {slowest_ok}
        # kept samples are exported whole: root + every phase span
        for index, spans in exported.items():
            names = [s.name for s in spans]
            assert names.count("rl.sample") == 1 and "rl.reward" in names, index
        if budget == 0:
            stats = handle.stats
            assert stats["kept_errors"] == 3 and stats["kept_slowest"] == 1
            assert stats["samples_not_kept"] == len(SCENARIO) - 3 - 1
            assert ours["agent_loop/telemetry/samples_not_kept"] >= 1
    finally:
        handle.shutdown(5)


def test_budget_keeps_whole_prompts() -> None:
    handle, mem = _configure(3, keep_slowest=0, keep_errors=False)
    cfg = SimConfig(prompts=5, rollout_n=2, time_scale=0.02, tool_fail_prob=0.0)

    async def main() -> None:
        with oal.step(1):
            await run_samples(cfg, 1, cfg.work())

    try:
        asyncio.run(main())
        assert handle.metrics.collect(1)["agent_loop/num_samples"] == 10
        roots = [s for s in mem.get_finished_spans() if s.name == "rl.sample"] if handle.force_flush(5) else []
        by_prompt: dict[int, set[int]] = {}
        for r in roots:
            by_prompt.setdefault(r.attributes[sc.RL_SAMPLE_INDEX], set()).add(r.attributes[sc.RL_ROLLOUT_N])
        # budget 3 rounded up to whole prompts: two prompts, both rollouts each
        assert len(by_prompt) == 2 and all(v == {0, 1} for v in by_prompt.values())
    finally:
        handle.shutdown(5)


def test_sample_buffer_is_bounded_and_spills_are_counted() -> None:
    handle, mem = _configure(0, keep_slowest=10, max_buffered_spans=4)
    cfg = SimConfig(prompts=3, rollout_n=2, time_scale=0.02, max_turns=3, tool_prob=1.0, tool_fail_prob=0.0)

    async def main() -> None:
        with oal.step(1):
            await run_samples(cfg, 1, cfg.work())

    try:
        asyncio.run(main())
        metrics = handle.metrics.collect(1)
        assert metrics["agent_loop/num_samples"] == 6  # metrics unaffected by spills
        stats = handle.stats
        assert stats["samples_spilled"] >= 1
        assert stats["buffered_spans"] == 0
        exported = _exported_samples(handle, mem)
        assert len(exported) == stats["kept_slowest"] <= 6 - stats["samples_spilled"]
        assert metrics["agent_loop/telemetry/samples_spilled"] == stats["samples_spilled"]
    finally:
        handle.shutdown(5)


def test_bad_budget_arguments_raise() -> None:
    with pytest.raises(ValueError, match="max_exported_samples_per_step must be >= 0"):
        oal.configure("x", set_global=False, max_exported_samples_per_step=-1)
    with pytest.raises(ValueError, match="keep_slowest must be >= 0"):
        oal.configure("x", set_global=False, keep_slowest=-2)
