"""verl V1's real fit loop (sync, colocate-async, separate-async) with a real agent-loop worker actor: the
logged metrics of every trained step hold verl's 18 ``agent_loop/*`` keys, equal (within 2 ms) to verl's own
``AgentLoopManager._performance_metrics`` on the AgentLoopMetrics of exactly the trajectories that step
trained, read back from TransferQueue; plus ours; validation under its own keys."""

from __future__ import annotations

import time

import fit_harness as fh
import numpy as np
import pytest
import ray_scenarios as rs
import torch

from otel_agentloop import semconv as sc
from otel_agentloop.analysis._reading._report import stored_summaries
from otel_agentloop.integrations import verl as oal_verl

PROMPTS, SESSIONS, STEPS = 2, rs.N_SESSIONS, 3
VERL_KEYS = [
    f"agent_loop/{m}/{s}"
    for m in ("num_preempted", "generate_sequences", "tool_calls", "compute_score")
    for s in ("min", "max", "mean")
] + [
    f"agent_loop/slowest/{m}"
    for m in ("generate_sequences", "tool_calls", "compute_score", "num_preempted", "prompt_length", "response_length")
]


@pytest.fixture(scope="module")
def v1_cluster():
    with rs.cluster(setup_hook=None) as (handle, receiver):
        assert oal_verl.instrument()
        try:
            yield handle, receiver, rs.v1_actor(engine=True)
        finally:
            oal_verl.uninstrument()


def _reference(batch) -> dict[str, float]:
    """verl's own formula on the AgentLoopMetrics the worker stored for these trajectories."""
    import transfer_queue as tq
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics

    keep = [i for i, t in enumerate(batch.tags) if not t.get("is_padding", False)]
    keys = [batch.keys[i] for i in keep]
    data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=["metrics"])
    stored = data.get("metrics")
    stored = stored.tolist() if hasattr(stored, "tolist") else list(stored)
    rows = [AgentLoopMetrics(**getattr(m, "data", m)).model_dump() for m in stored]
    plen = [batch.tags[i]["prompt_len"] for i in keep]
    rlen = [batch.tags[i]["response_len"] for i in keep]
    width = max(plen)
    mask = torch.zeros(len(keys), width + max(rlen), dtype=torch.int64)
    for r, (p, q) in enumerate(zip(plen, rlen, strict=True)):
        mask[r, :p] = 1
        mask[r, width : width + q] = 1
    out = DataProto.from_dict({"prompts": torch.zeros(len(keys), width, dtype=torch.int64), "attention_mask": mask})
    return oal_verl.uninstrumented_performance_metrics([rows], out)


@pytest.fixture
def clean_tq():
    """Each fit starts and ends with empty partitions (an async fit leaves prefetched groups behind)."""
    import transfer_queue as tq

    def clear() -> None:
        for partition, keys in (tq.kv_list() or {}).items():
            if keys:
                tq.kv_clear(keys=list(keys), partition_id=partition)

    clear()
    yield
    rs.wait_for(
        lambda: (
            not any(
                s == "running"
                for keys in (tq.kv_list() or {}).values()
                for s in (t.get("status") for t in keys.values())
            )
        ),
        timeout=30,
    )
    clear()


@pytest.mark.parametrize("mode", ["sync", "colocate_async", "separate_async"])
def test_fit_logs_agent_loop_metrics_from_spans(v1_cluster, clean_tq, mode, monkeypatch) -> None:
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.utils.tracking import Tracking

    handle, receiver, actor = v1_cluster
    logged: list[tuple[int, dict]] = []
    monkeypatch.setattr(Tracking, "log", lambda self, data, step, **kw: logged.append((step, dict(data))))
    references: dict[int, dict] = {}
    trained: dict[int, list[dict]] = {}
    ours = PPOTrainer._compute_metrics  # the instrumented one; the reference is read just before it runs

    def compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        references[global_steps] = _reference(batch)
        trained[global_steps] = [dict(t) for t in batch.tags if not t.get("is_padding", False)]
        return ours(self, batch, metrics, timing_raw, global_steps, epoch)

    monkeypatch.setattr(PPOTrainer, "_compute_metrics", compute_metrics)
    trainer = fh.make_trainer(mode, actor, prompts=PROMPTS, n=SESSIONS, steps=STEPS, test_freq=STEPS)
    manager = AgentLoopManagerTQ.__new__(AgentLoopManagerTQ)
    manager.agent_loop_workers = [actor]
    fit_started_ns = time.time_ns()
    trainer.fit(manager)

    steps = [s for s, data in logged if "training/global_step" in data]
    assert steps == list(range(1, STEPS + 1))
    for step, data in logged:
        if "training/global_step" not in data:
            continue
        ref = references[step]
        assert sorted(ref) == sorted(VERL_KEYS)
        for key in VERL_KEYS:
            assert abs(float(data[key]) - float(ref[key])) <= 0.002, (mode, step, key, data[key], ref[key])
        n = len(trained[step])
        assert n == PROMPTS * SESSIONS and data["agent_loop/num_samples"] == n
        for key in (
            "agent_loop/generate_sequences/p99",
            "agent_loop/slowest/sample_index",
            "agent_loop/group/completion_time/p90",
            "agent_loop/group/spread/mean",
            "agent_loop/staleness/mean",
            "agent_loop/telemetry/spans_dropped",
        ):
            assert key in data, (mode, key)
        assert data["agent_loop/group/num_groups"] == PROMPTS
        dispatched = [t["global_steps"] for t in trained[step]]
        assert data["agent_loop/staleness/max"] == step - min(dispatched)
        if mode != "sync" and step > 1:  # async: with the warmup batch, step k trains what k-1 dispatched
            assert min(dispatched) < step
    val = [data for _, data in logged if "val-aux/agent_loop/num_samples" in data]
    assert rs.wait_for(
        lambda: any(
            r.name == sc.SAMPLE_SPAN
            and r.attributes.get(sc.RL_VALIDATE) is True
            and r.attributes.get(sc.RL_STEP) == STEPS
            for r in receiver.records
        )
    )
    assert val and val[-1]["val-aux/agent_loop/num_samples"] == PROMPTS  # val n = 1
    assert "val-aux/agent_loop/generate_sequences/max" in val[-1]
    # spans: one per trajectory, with the dispatch step and policy versions; the trainer's consume spans
    assert handle.force_flush(5)
    uids = {t["otel_agentloop.uid"] for s in trained for t in trained[s]}
    assert rs.wait_for(
        lambda: {r.attributes.get(sc.RL_SAMPLE_UID) for r in receiver.records if r.name == sc.SAMPLE_SPAN} >= uids
    )
    by_id = {
        (r.attributes.get(sc.RL_SAMPLE_UID), r.attributes.get(sc.RL_ROLLOUT_N)): r
        for r in receiver.records
        if r.name == sc.SAMPLE_SPAN
    }
    for tags in trained.values():  # identity: dispatch step, uid + session; the weight versions that generated it
        for t in tags:
            span = by_id[(t["otel_agentloop.uid"], t["otel_agentloop.rollout_n"])]
            assert span.attributes[sc.RL_STEP] == t["global_steps"]
            assert span.attributes[sc.RL_POLICY_VERSION_MIN] == t["min_global_steps"]
            assert span.attributes[sc.RL_POLICY_VERSION_MAX] == t["max_global_steps"]
            assert span.attributes[sc.RL_PROMPT_LENGTH] == t["prompt_len"]
            assert span.attributes[sc.RL_RESPONSE_LENGTH] == t["response_len"]
    _engine_keys_from_turns(receiver, logged, trained, val[-1], fit_started_ns)
    consumed = [r for r in receiver.records if r.name == sc.CONSUME_SPAN]
    assert {r.attributes[sc.RL_CONSUMED_STEP] for r in consumed} >= set(range(1, STEPS + 1))
    for r in consumed:  # linked to the samples it trained (their trace and span ids, from the tags)
        step = r.attributes[sc.RL_CONSUMED_STEP]
        if step in trained:
            assert len(r.links) == len(trained[step])
            assert {sid for _, sid in r.links} <= {s.span_id for s in by_id.values()}
    assert np.isfinite([float(v) for _, d in logged for k, v in d.items() if k.startswith("agent_loop/")]).all()

    # one rl.step.summary per trained step and for the validation: the agent_loop keys verl logged, equal
    def summaries() -> dict:
        return {
            (s.step, s.validate): s
            for s in stored_summaries(list(receiver.records)).values()
            if s.collected_ns >= fit_started_ns
        }

    assert rs.wait_for(lambda: {(k, False) for k in range(1, STEPS + 1)} | {(STEPS, True)} <= set(summaries()))
    written = summaries()
    for step, data in logged:
        if "training/global_step" in data:
            summary = written[(step, False)]
            assert dict(summary.metrics) == {k: float(v) for k, v in data.items() if k.startswith("agent_loop/")}
            assert summary.num_samples == PROMPTS * SESSIONS
            assert 0 < summary.start_ns < summary.median_end_ns <= summary.end_ns  # the samples' wall times
            assert sum(d.count for d in summary.tools.values()) > 0 and summary.phases["tool_calls"].max > 0
            assert summary.staleness_max == data["agent_loop/staleness/max"]
            assert summary.staleness_mean == pytest.approx(data["agent_loop/staleness/mean"])
    val_summary = written[(STEPS, True)]
    prefix = "val-aux/"
    assert dict(val_summary.metrics) == {
        k[len(prefix) :]: float(v) for k, v in val[-1].items() if k.startswith(prefix + "agent_loop/")
    }


def _engine_keys_from_turns(receiver, logged, trained, val, since_ns: int) -> None:
    """``agent_loop/engine/*`` reach what the trainer logs for every trained step (and the validation), from
    the engine numbers on the turn spans of exactly the trajectories that step trained (this fit's)."""
    turns: dict[tuple, list] = {}
    for r in receiver.records:
        attrs = r.attributes
        if r.start_ns < since_ns or attrs.get(sc.RL_PHASE) != sc.GENERATE or attrs.get(sc.RL_VALIDATE):
            continue
        if sc.RL_ENGINE_QUEUE_S in attrs:
            key = (
                r.attributes.get(sc.RL_STEP),
                r.attributes.get(sc.RL_SAMPLE_INDEX),
                r.attributes.get(sc.RL_ROLLOUT_N),
            )
            turns.setdefault(key, []).append(r)
    for step, data in logged:
        if "training/global_step" not in data:
            continue
        mine = [
            turn
            for t in trained[step]
            for turn in turns[(t["otel_agentloop.step"], t["otel_agentloop.index"], t["otel_agentloop.rollout_n"])]
        ]
        assert len(mine) >= len(trained[step])  # every trajectory has at least one turn with engine numbers
        for stat, attr in (("queue_s", sc.RL_ENGINE_QUEUE_S), ("decode_s", sc.RL_ENGINE_DECODE_S)):
            values = [turn.attributes[attr] for turn in mine]
            assert data[f"agent_loop/engine/{stat}/max"] == pytest.approx(max(values)), (step, stat)
            assert data[f"agent_loop/engine/{stat}/p50"] == pytest.approx(float(np.percentile(values, 50)))
        assert "agent_loop/engine/decode_tokens_per_s/p99" in data
    assert "val-aux/agent_loop/engine/queue_s/max" in val
