"""experimental/fully_async_policy: the rollouter's real per-prompt path to a real legacy agent-loop worker
actor, then the trainer's real batch assembly. Spans carry the real step; the per-sample rows reach the
trainer; ``fully_async/processing_time/*`` is reproduced from spans within 2 ms of verl's formula."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import ray_scenarios as rs
from omegaconf import OmegaConf

from otel_agentloop import semconv as sc
from otel_agentloop.integrations import verl as oal_verl

PROMPTS, STEP = 4, 4
STATS = ("avg", "max", "min", "tp50", "tp95", "tp99")


class _Queue:
    def __init__(self) -> None:
        self.samples: list[bytes] = []

    async def put_sample(self, sample: bytes) -> bool:
        self.samples.append(sample)
        return True

    async def get_statistics(self) -> dict:
        return {"queue_size": len(self.samples)}


class _Rollouter:
    """The attributes ``FullyAsyncRollouter._process_single_sample_streaming`` uses (the real rollouter needs
    model workers); ``_completed_steps`` is its param-sync step counter."""

    def __init__(self, manager) -> None:
        self.async_rollout_manager = manager
        self.message_queue_client = _Queue()
        self.total_generated_samples = self._step_generated_samples = 0
        self.dropped_stale_samples = self.processed_sample_count = 0
        self._completed_steps = STEP

    async def get_statistics(self) -> dict:
        return {"count/total_generated_samples": self.total_generated_samples}


@pytest.fixture(scope="module")
def fa_cluster():
    with rs.cluster(setup_hook=None) as (handle, receiver):
        assert oal_verl.instrument()
        try:
            yield handle, receiver
        finally:
            oal_verl.uninstrument()


def test_fully_async_rows_reach_the_trainer_and_processing_time_from_spans(fa_cluster) -> None:
    from ray import cloudpickle
    from verl.experimental.fully_async_policy import fully_async_trainer
    from verl.experimental.fully_async_policy.detach_utils import RolloutSample, prepare_single_generation_data
    from verl.experimental.fully_async_policy.fully_async_rollouter import (
        FullyAsyncAgentLoopManager,
        FullyAsyncRollouter,
    )

    _handle, receiver = fa_cluster
    actor = rs.legacy_actor(fully_async=True, engine=True)
    manager = FullyAsyncAgentLoopManager.__new__(FullyAsyncAgentLoopManager)
    manager.agent_loop_workers = [actor]
    rollouter = _Rollouter(manager)
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {"n": rs.N_SESSIONS, "multi_turn": {"enable": True}}},
            "trainer": {"balance_batch": False},
        }
    )
    process = FullyAsyncRollouter.__ray_metadata__.modified_class._process_single_sample_streaming

    async def feed() -> None:
        samples = []
        for i in range(PROMPTS):
            raw = np.empty(1, dtype=object)
            raw[0] = [{"role": "user", "content": f"What is {i} + 1? Use the tools."}]
            batch_dict = {
                "raw_prompt": raw,
                "index": np.zeros(1, dtype=object),  # dataset index: not unique
                "agent_name": np.array(["tool_agent"], dtype=object),
                "data_source": np.array(["sim"], dtype=object),
            }
            samples.append(
                RolloutSample(
                    full_batch=prepare_single_generation_data(batch_dict, config),
                    sample_id=f"sample_0_{i}",
                    epoch=0,
                    rollout_status={},
                )
            )
        await asyncio.gather(*(process(rollouter, s) for s in samples))  # in flight together, like the rollouter

    asyncio.run(feed())
    samples = [cloudpickle.loads(b) for b in rollouter.message_queue_client.samples]
    batch = fully_async_trainer.assemble_batch_from_rollout_samples(samples, None, config, None)
    meta = batch.meta_info
    n = PROMPTS * rs.N_SESSIONS
    assert len(batch) == n and "otel_agentloop_row" not in batch.non_tensor_batch  # popped before training
    for stat in STATS:
        ours = meta[f"fully_async/agent_loop/processing_time/{stat}"]
        verls = meta[f"fully_async/processing_time/{stat}"]
        assert abs(ours - verls) <= 0.002, (stat, ours, verls)
    assert meta["fully_async/agent_loop/num_samples"] == n
    for key in (
        "generate_sequences/max",
        "tool_calls/mean",
        "compute_score/p90",
        "slowest/generate_sequences",
        "group/completion_time/max",
    ):
        assert f"fully_async/agent_loop/{key}" in meta, key
    assert abs(meta["fully_async/agent_loop/tool_calls/max"] - meta["timing_s/agent_loop/tool_calls/max"]) <= 0.002
    # the engine's numbers on the turn spans reach the trainer's metrics too (harness.engine_numbers)
    assert rs.wait_for(lambda: sum(r.name == sc.SAMPLE_SPAN for r in receiver.records) >= n)
    turns = [r for r in receiver.records if r.attributes.get(sc.RL_PHASE) == sc.GENERATE]
    queues = [r.attributes[sc.RL_ENGINE_QUEUE_S] for r in turns]
    assert len(queues) >= n and sc.RL_ENGINE_SEGMENTS not in turns[0].attributes  # one attempt: no segments
    assert meta["fully_async/agent_loop/engine/queue_s/max"] == pytest.approx(max(queues))
    assert meta["fully_async/agent_loop/engine/queue_s/p50"] == pytest.approx(float(np.percentile(queues, 50)))
    assert "fully_async/agent_loop/engine/decode_tokens_per_s/max" in meta
    # spans: the real step (the rollouter's param-sync step, was -1), one sample span per trajectory
    assert rs.wait_for(lambda: sum(r.name == sc.SAMPLE_SPAN for r in receiver.records) >= n)
    spans = [r for r in receiver.records if r.name == sc.SAMPLE_SPAN]
    assert len(spans) == n and {r.attributes[sc.RL_STEP] for r in spans} == {STEP}
    assert len({(r.attributes[sc.RL_SAMPLE_UID], r.attributes[sc.RL_ROLLOUT_N]) for r in spans}) == n
    assert len({(r.attributes[sc.RL_SAMPLE_INDEX], r.attributes[sc.RL_ROLLOUT_N]) for r in spans}) == n
