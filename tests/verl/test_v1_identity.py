"""verl V1's real fit loop with a dataset whose ``index`` column is int64 (not the object array verl's
``collate_fn`` makes): the identity value reaching the worker is not a plain int, and it must never cost a
span: every trajectory still has its ``rl.sample`` span (with the dataset index it had), and the trained
steps still log the ``agent_loop/*`` metrics (issue 21)."""

from __future__ import annotations

import fit_harness as fh
import numpy as np
import pytest
import ray_scenarios as rs

from otel_agentloop import semconv as sc
from otel_agentloop.integrations import verl as oal_verl

PROMPTS, SESSIONS, STEPS = 2, rs.N_SESSIONS, 2
DATASET_INDEX = [257, 7]  # 257: two non-zero bytes, so a wrong byte order or width shows


@pytest.fixture(scope="module")
def v1_cluster():
    with rs.cluster(setup_hook=None) as (handle, receiver):
        assert oal_verl.instrument()
        try:
            yield handle, receiver, rs.v1_actor()
        finally:
            oal_verl.uninstrument()


def _int64_batches(count: int) -> list[dict]:
    batches = fh.prompt_batches(PROMPTS, count)
    for batch in batches:
        batch["index"] = np.array(DATASET_INDEX, dtype=np.int64)  # e.g. a dataset loaded with a typed column
    return batches


def test_an_int64_index_column_costs_no_sample_span(v1_cluster, monkeypatch) -> None:
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ
    from verl.utils.tracking import Tracking

    handle, receiver, actor = v1_cluster
    logged: list[tuple[int, dict]] = []
    monkeypatch.setattr(Tracking, "log", lambda self, data, step, **kw: logged.append((step, dict(data))))
    trainer = fh.make_trainer("sync", actor, prompts=PROMPTS, n=SESSIONS, steps=STEPS)
    trainer.train_dataloader = _int64_batches(3 * STEPS + 4)
    manager = AgentLoopManagerTQ.__new__(AgentLoopManagerTQ)
    manager.agent_loop_workers = [actor]
    trainer.fit(manager)

    steps = [s for s, data in logged if "training/global_step" in data]
    assert steps == list(range(1, STEPS + 1))  # verl itself ran
    expected = STEPS * PROMPTS * SESSIONS
    assert handle.force_flush(5)

    def samples() -> list:
        return [r for r in receiver.records if r.name == sc.SAMPLE_SPAN and r.attributes.get(sc.RL_VALIDATE) is False]

    assert rs.wait_for(lambda: len(samples()) >= expected), len(samples())
    spans = samples()
    assert len(spans) == expected
    assert sorted({s.attributes[sc.RL_STEP] for s in spans}) == list(range(1, STEPS + 1))
    # the dataset index as the dataset had it, parsed from what reached the worker
    for step in range(1, STEPS + 1):
        of_step = [s for s in spans if s.attributes[sc.RL_STEP] == step]
        assert sorted(s.attributes.get(sc.RL_SAMPLE_DATASET_INDEX) for s in of_step) == sorted(DATASET_INDEX * SESSIONS)
        assert sorted((s.attributes[sc.RL_SAMPLE_INDEX], s.attributes[sc.RL_ROLLOUT_N]) for s in of_step) == [
            (i, r) for i in range(PROMPTS) for r in range(SESSIONS)
        ]
    # each sample's phases are below it; the group spans exist
    records = list(receiver.records)
    for s in spans:
        rs.check_sample_tree(records, s, expect_tools=False)
    groups = [r for r in records if r.name == sc.GROUP_SPAN and r.attributes.get(sc.RL_VALIDATE) is False]
    assert len(groups) == STEPS * PROMPTS
    assert sorted(g.attributes.get(sc.RL_SAMPLE_DATASET_INDEX) for g in groups) == sorted(DATASET_INDEX * STEPS)
    # and the trained steps log the metrics from those spans
    for step, data in logged:
        if "training/global_step" in data:
            assert data["agent_loop/num_samples"] == PROMPTS * SESSIONS, (step, data.get("agent_loop/num_samples"))
            assert data["agent_loop/generate_sequences/max"] > 0
