"""instrument() on the installed verl 0.9.1: spans for real ToolAgentLoop runs, and verl's own formula agrees."""

from __future__ import annotations

import asyncio
import importlib
import logging

import harness as h
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.integrations import verl as oal_verl
from otel_agentloop.metrics import compute_metrics

N = 8
STEP = 3
GEN = {0: 0.04, 1: 0.02, 2: 0.09, 3: 0.03}  # turn-0 delay by sample % 4 (sample 2: one long turn, no tools)


def gen_delay(sample: int, turn: int) -> float:
    return GEN[sample % 4] if turn == 0 else 0.01 + 0.005 * (sample % 3)


def tool_delay(name: str, x: int) -> float:
    return 0.03 if name == "add" else 0.05  # 'lookup' runs in parallel with 'add'


_TQ_WORKER = "AgentLoopWorkerTQ.__ray_metadata__.modified_class"
_ROLLOUTER = "FullyAsyncRollouter.__ray_metadata__.modified_class"
PATCHED = [  # (module, owner path, attribute): everything instrument() replaces, legacy, V1 and fully-async
    ("verl.experimental.agent_loop.agent_loop", "AgentLoopManager", "generate_sequences"),
    ("verl.experimental.agent_loop.agent_loop", "AgentLoopManager", "_performance_metrics"),
    ("verl.experimental.agent_loop.agent_loop", "AgentLoopWorker", "generate_sequences"),
    ("verl.experimental.agent_loop.agent_loop", "AgentLoopWorker", "_run_agent_loop"),
    ("verl.experimental.agent_loop.agent_loop", "AgentLoopWorker", "_compute_score"),
    ("verl.experimental.agent_loop.agent_loop", "", "simple_timer"),
    ("verl.experimental.agent_loop.tool_agent_loop", "ToolAgentLoop", "_call_tool"),
    ("verl.experimental.agent_loop.tool_agent_loop", "", "simple_timer"),
    ("verl.experimental.agent_loop.single_turn_agent_loop", "", "simple_timer"),
    ("verl.workers.rollout.llm_server", "LLMServerClient", "generate"),
    ("verl.workers.rollout.llm_server", "FullyAsyncLLMServerClient", "generate"),
    ("verl.workers.rollout.llm_server", "LLMServerClient", "_acquire_server"),
    ("verl.trainer.ppo.v1.agent_loop_tq", "AgentLoopManagerTQ", "generate_sequences"),
    ("verl.trainer.ppo.v1.agent_loop_tq", _TQ_WORKER, "_run_prompt"),
    ("verl.trainer.ppo.v1.agent_loop_tq", _TQ_WORKER, "_run_agent_loop"),
    ("verl.trainer.ppo.v1.agent_loop_tq", _TQ_WORKER, "_compute_score"),
    ("transfer_queue", "", "async_kv_batch_put"),
    ("verl.trainer.ppo.v1.replay_buffer", "ReplayBuffer", "sample"),
    ("verl.trainer.ppo.v1.replay_buffer", "ReplayBufferAsync", "sample"),
    ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer", "step"),
    ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer", "_compute_metrics"),
    ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer", "_validate"),
    ("verl.experimental.fully_async_policy.fully_async_rollouter", _ROLLOUTER, "_process_single_sample_streaming"),
    ("verl.experimental.fully_async_policy.fully_async_trainer", "", "assemble_batch_from_rollout_samples"),
    ("verl.trainer.constants_ppo", "", "get_ppo_ray_runtime_env"),
]


def _attrs() -> dict[tuple[str, str, str], object]:
    out = {}
    for module, path, attr in PATCHED:
        owner = importlib.import_module(module)
        for part in path.split(".") if path else ():
            owner = getattr(owner, part)
        out[(module, path, attr)] = vars(owner)[attr]
    return out


@pytest.fixture
def instrumented():
    before = _attrs()
    mem = InMemorySpanExporter()
    handle = oal.configure("verl-test", exporters=[mem], set_global=False, schedule_delay_s=0.05)
    assert oal_verl.instrument()
    try:
        yield handle, mem
    finally:
        oal_verl.uninstrument()
        handle.shutdown(5)
        assert _attrs() == before


def _run_worker(validate: bool = False):
    tok = h.build_tokenizer()
    server = h.FakeServer(tok, gen_delay, lambda i, k: (i % 3) if k == 0 else (None if i % 2 else 1))
    tools = h.make_tools(tool_delay)
    reward = h.FakeRewardWorker(lambda i: 0.01 + 0.004 * i)

    async def main():
        worker = h.make_worker(tok, server, tools, reward)
        return await worker.generate_sequences(h.make_batch(N, STEP, validate))

    return asyncio.run(main())


def test_verl_metrics_and_ours_agree_on_the_same_run(instrumented) -> None:
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    handle, mem = instrumented
    assert instrumented[0].enabled
    output = _run_worker()
    rows = output.meta_info["metrics"]
    assert len(rows) == N and oal_verl.TABLE_KEY in rows[0]
    table = rows[0][oal_verl.TABLE_KEY]
    assert len(table) == N
    # verl's own formula on verl's own per-sample timers (our key removed first, as the patched method does)
    plain = [{k: v for k, v in r.items() if k != oal_verl.TABLE_KEY} for r in rows]
    reference = oal_verl.uninstrumented_performance_metrics([plain], output)
    ours = compute_metrics(table)
    verl_keys = [k for k in reference]
    assert len(verl_keys) == 18  # 4 x {min,max,mean} + slowest/{4 phases/counts} + the two lengths
    for key in verl_keys:
        assert float(ours[key]) == pytest.approx(float(reference[key]), abs=0.002), key
    # and the patched manager method returns verl's values untouched, plus ours
    timing = AgentLoopManager._performance_metrics(None, [rows], output)
    for key in verl_keys:
        assert float(timing[key]) == float(reference[key]), key
    assert timing["agent_loop/num_samples"] == N and "agent_loop/generate_sequences/p99" in timing
    assert oal_verl.TABLE_KEY not in rows[0]  # consumed, not left for verl
    # the run really had what the metrics claim: parallel tools, multiple turns, scores
    # 'add' and 'lookup' in parallel: a turn's tool time is at least the 0.05 s lookup, and its tool spans overlap
    # (their union less than their sum: an ordering of the spans' own times that load cannot change)
    assert reference["agent_loop/tool_calls/max"] >= 0.049
    assert handle.force_flush(5)
    calls: dict[tuple[object, object], list[tuple[int, int]]] = {}
    for span in mem.get_finished_spans():
        if span.name.startswith(sc.TOOL_SPAN_PREFIX) and span.start_time and span.end_time:
            key = (span.attributes.get(sc.RL_SAMPLE_INDEX), span.attributes.get(sc.RL_ROLLOUT_N))
            calls.setdefault(key, []).append((span.start_time, span.end_time))

    def covered(intervals: list[tuple[int, int]]) -> int:
        total = reach = 0
        for start, end in sorted(intervals):
            total += max(0, end - max(start, reach))
            reach = max(reach, end)
        return total

    overlapping = [k for k, c in calls.items() if covered(c) < sum(e - s for s, e in c)]
    assert overlapping, calls
    assert reference["agent_loop/tool_calls/min"] == 0.0  # samples 2 and 5 called no tool


def test_spans_of_a_verl_run(instrumented) -> None:
    handle, mem = instrumented
    _run_worker()
    assert handle.force_flush(5)
    spans = list(mem.get_finished_spans())
    roots = {
        s.attributes[sc.RL_SAMPLE_INDEX] * 10 + s.attributes[sc.RL_ROLLOUT_N]: s
        for s in spans
        if s.name == sc.SAMPLE_SPAN
    }
    assert len(roots) == N
    for root in roots.values():
        assert root.attributes[sc.RL_STEP] == STEP and root.attributes[sc.RL_VALIDATE] is False
        assert root.attributes["rl.agent.name"] == "tool_agent"
        assert root.attributes[sc.RL_PROMPT_LENGTH] > 0 and root.attributes[sc.RL_RESPONSE_LENGTH] > 0
    by_parent: dict[int, list] = {}
    for s in spans:
        if s.parent is not None:
            by_parent.setdefault(s.parent.span_id, []).append(s)
    turns = tools = 0
    for root in roots.values():
        children = by_parent[root.context.span_id]
        gens = [c for c in children if c.attributes.get(sc.RL_PHASE) == sc.GENERATE]
        blocks = [c for c in children if c.name == sc.TOOL_CALLS_SPAN]  # verl's timed gather, per turn
        tool_spans = [t for b in blocks for t in by_parent.get(b.context.span_id, [])]
        assert all(t.name.startswith("execute_tool ") for t in tool_spans)
        assert all(
            b.start_time <= t.start_time and t.end_time <= b.end_time
            for b in blocks
            for t in by_parent.get(b.context.span_id, [])
        )
        rewards = [c for c in children if c.name == sc.REWARD_SPAN]
        assert len(rewards) == 1 and rewards[0].attributes[sc.RL_REWARD_SCORE] in (0.0, 1.0)
        assert gens and all(
            g.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] > 0
            and g.attributes[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("completed",)
            and g.attributes[sc.GEN_AI_PROVIDER_NAME] == "vllm"
            for g in gens
        )
        for c in gens + blocks + tool_spans + rewards:  # the trajectory identity on every phase span
            for key in (sc.RL_STEP, sc.RL_SAMPLE_INDEX, sc.RL_ROLLOUT_N, sc.RL_VALIDATE):
                assert c.attributes[key] == root.attributes[key]
        turns += len(gens)
        tools += len(tool_spans)
        if len(tool_spans) == 2:  # the parallel pair overlaps in time
            a, b = sorted(tool_spans, key=lambda s: s.start_time)
            assert b.start_time < a.end_time
            assert {t.name for t in tool_spans} == {"execute_tool add", "execute_tool lookup"}
    assert turns > N and tools > 0


def test_instrument_is_idempotent_and_uninstrument_restores_everything() -> None:
    before = _attrs()
    assert oal_verl.instrument() and oal_verl.instrument()
    patched = _attrs()
    assert all(patched[k] is not before[k] for k in before)
    import wrapt

    assert not any(isinstance(getattr(v, "__wrapped__", None), wrapt.FunctionWrapper) for v in patched.values())
    oal_verl.uninstrument()
    oal_verl.uninstrument()
    after = _attrs()
    assert all(after[k] is before[k] for k in before)


def test_unsupported_verl_is_left_alone(monkeypatch, caplog) -> None:
    before = _attrs()
    monkeypatch.setattr(oal_verl.importlib.metadata, "version", lambda name: "0.7.1")
    with caplog.at_level(logging.WARNING):
        assert oal_verl.instrument() is False
    assert "verl 0.7.1 is not supported" in caplog.text
    assert _attrs() == before and not oal_verl.is_instrumented()


def test_manager_step_span_carrier_and_extra_keys_from_a_sync_caller(instrumented) -> None:
    """Called synchronously as verl's trainer does (auto_await runs the loop), through the patched manager."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    handle, mem = instrumented
    tok = h.build_tokenizer()
    server = h.FakeServer(tok, gen_delay, lambda i, k: 0)
    holder: dict[str, object] = {}

    class WorkerHandle:  # stands in for the AgentLoopWorker actor handle
        class _Method:
            def remote(self, chunk):
                holder["carrier_seen"] = dict(chunk.meta_info.get(oal_verl.CARRIER_KEY) or {})
                return holder["worker"].generate_sequences(chunk)

        generate_sequences = _Method()

    async def make_worker():
        holder["worker"] = h.make_worker(tok, server, h.make_tools(tool_delay), h.FakeRewardWorker(lambda i: 0.01))

    asyncio.run(make_worker())
    manager = AgentLoopManager.__new__(AgentLoopManager)
    manager.agent_loop_workers = [WorkerHandle()]
    output = manager.generate_sequences(h.make_batch(N, 7))  # sync call: auto_await drives the event loop
    timing = output.meta_info["timing"]
    assert timing["agent_loop/num_samples"] == N and "agent_loop/slowest/sample_index" in timing
    assert {
        "agent_loop/generate_sequences/max",
        "agent_loop/tool_calls/max",
        "agent_loop/slowest/prompt_length",
        "agent_loop/generate_sequences/p90",
    } <= set(timing)
    extra = output.meta_info[oal_verl.META_KEY]
    assert len(extra["slowest_trace_id"]) == 32
    assert oal_verl.CARRIER_KEY not in output.meta_info
    assert holder["carrier_seen"]["rl.step"] == 7 and "traceparent" in holder["carrier_seen"]
    assert handle.force_flush(5)
    spans = list(mem.get_finished_spans())
    (step_span,) = [s for s in spans if s.name == sc.STEP_SPAN]
    assert step_span.attributes[sc.RL_STEP] == 7
    roots = [s for s in spans if s.name == sc.SAMPLE_SPAN]
    assert len(roots) == N and all(r.links[0].context.span_id == step_span.context.span_id for r in roots)
    (slowest,) = [r for r in roots if format(r.context.trace_id, "032x") == extra["slowest_trace_id"]]
    # the trace id points at the sample verl's own formula calls slowest (by batch position: index // 2)
    assert slowest.attributes[sc.RL_SAMPLE_INDEX] == timing["agent_loop/slowest/sample_index"]


def test_every_target_is_listed_for_the_unpickling_fallback() -> None:
    from otel_agentloop.integrations.verl._engine_path import SERVER_TARGETS
    from otel_agentloop.integrations.verl._targets import TARGETS

    # the engine servers' modules import vLLM / SGLang: tests/verl/test_engine_carrier.py patches them
    assert set(TARGETS) == set(PATCHED) | set(SERVER_TARGETS)


def test_a_wrapper_arriving_where_instrument_fails_resolves_to_the_original(monkeypatch, caplog) -> None:
    """An actor unpickling one of our wrappers instruments its process; if that fails, it runs verl's
    original (and starts), with a warning."""
    import pickle

    from otel_agentloop.integrations.verl import _patching

    assert oal_verl.instrument()
    try:
        agent_loop = importlib.import_module("verl.experimental.agent_loop.agent_loop")
        wrapper = vars(agent_loop.AgentLoopWorker)["_run_agent_loop"]
        payload = pickle.dumps(wrapper)  # by reference: module + registry name
    finally:
        oal_verl.uninstrument()
    original = vars(agent_loop.AgentLoopWorker)["_run_agent_loop"]

    def broken(*args, **kwargs):
        raise RuntimeError("cannot instrument here")

    monkeypatch.setattr(oal_verl, "instrument", broken)
    monkeypatch.setattr(_patching, "_retired", {})  # as in a fresh actor process
    monkeypatch.setattr(_patching, "_sources", {})
    with caplog.at_level(logging.WARNING):
        assert pickle.loads(payload) is original
    assert "running it uninstrumented" in caplog.text
