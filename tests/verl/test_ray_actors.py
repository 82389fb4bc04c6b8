"""The Ray trap, for real: agent-loop worker actors created by a process that called ``instrument()`` (the
driver in the legacy path, ``TaskRunnerV1`` in V1) are traced, with no setup hook instrumenting them."""

from __future__ import annotations

import pytest
import ray_scenarios as rs

from otel_agentloop import semconv as sc
from otel_agentloop.analysis._reading._report import stored_summaries
from otel_agentloop.integrations import verl as oal_verl


@pytest.fixture(scope="module")
def instrumented_cluster():
    from test_verl_instrumentation import _attrs

    before = _attrs()
    with rs.cluster(setup_hook=None) as (handle, receiver):  # workers configure tracing but do not instrument
        assert oal_verl.instrument() and oal_verl.instrument()  # a double instrument() changes nothing
        try:
            yield handle, receiver
        finally:
            oal_verl.uninstrument()
            assert _attrs() == before


def test_legacy_actor_created_by_an_instrumented_driver(instrumented_cluster) -> None:
    import ray

    _handle, receiver = instrumented_cluster
    actor = rs.legacy_actor()
    output = rs.run_legacy(actor, step=5)
    timing = output.meta_info["timing"]
    # the worker's per-sample table came back from the actor: its generate_sequences was ours
    assert timing["agent_loop/num_samples"] == rs.N_LEGACY and "agent_loop/generate_sequences/p90" in timing
    assert ray.get(actor.__ray_call__.remote(rs.chain_counts)) == {"_run_agent_loop": 1, "_compute_score": 1}
    assert rs.wait_for(
        lambda: (
            sum(r.name == sc.SAMPLE_SPAN and r.attributes.get(sc.RL_STEP) == 5 for r in receiver.records) == rs.N_LEGACY
        )
    )
    records = list(receiver.records)
    samples = [r for r in records if r.name == sc.SAMPLE_SPAN and r.attributes.get(sc.RL_STEP) == 5]
    assert sorted((s.attributes[sc.RL_SAMPLE_INDEX], s.attributes[sc.RL_ROLLOUT_N]) for s in samples) == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    assert rs.wait_for(
        lambda: all(len(rs.descendants(rs.children(list(receiver.records)), s.span_id)) >= 2 for s in samples),
        timeout=20,
    ), [(s.attributes, len(rs.descendants(rs.children(list(receiver.records)), s.span_id))) for s in samples]
    records = list(receiver.records)
    for s in samples:  # harness: sample i = its priority; i % 3 == 2 answers at once, the others call tools
        i = s.attributes[sc.RL_SAMPLE_INDEX] * 2 + s.attributes[sc.RL_ROLLOUT_N]
        rs.check_sample_tree(records, s, expect_tools=i % 3 != 2)
        assert s.attributes[sc.RL_PROMPT_LENGTH] > 0 and s.attributes[sc.RL_RESPONSE_LENGTH] > 0
    assert rs.wait_for(
        lambda: any(r.name == sc.STEP_SPAN and r.attributes.get(sc.RL_STEP) == 5 for r in receiver.records), timeout=20
    )
    (step_span,) = [r for r in receiver.records if r.name == sc.STEP_SPAN and r.attributes.get(sc.RL_STEP) == 5]
    assert all(step_span.span_id in [sid for _, sid in s.links] for s in samples)
    # the driver's rl.step.summary: the agent_loop keys verl's manager returned (what verl logs), equal; the
    # actor's spans carry the driver's run
    assert rs.wait_for(lambda: (5, False) in stored_summaries(list(receiver.records)), timeout=20)
    summary = stored_summaries(list(receiver.records))[(5, False)]
    assert dict(summary.metrics) == {k: float(v) for k, v in timing.items() if k.startswith("agent_loop/")}
    assert summary.num_samples == rs.N_LEGACY and summary.start_ns > 0
    (summary_span,) = [r for r in receiver.records if r.name == sc.STEP_SUMMARY_SPAN]
    assert {(s.resource[sc.RL_RUN_ID], s.resource[sc.RL_RUN_ATTEMPT]) for s in samples} == {
        (summary_span.resource[sc.RL_RUN_ID], summary_span.resource[sc.RL_RUN_ATTEMPT])
    }
    assert summary_span.resource["process.pid"] != samples[0].resource["process.pid"]


def test_v1_actor_created_by_an_instrumented_process(instrumented_cluster) -> None:
    import ray
    import transfer_queue as tq

    _handle, receiver = instrumented_cluster
    actor = rs.v1_actor()
    assert ray.get(actor.__ray_call__.remote(rs.chain_counts)) == {
        "_run_agent_loop": 1,
        "_compute_score": 1,
        "_run_prompt": 1,
    }
    uids, keys = rs.run_v1(actor, step=7)
    n = rs.N_PROMPTS * rs.N_SESSIONS
    assert rs.wait_for(
        lambda: sum(r.name == sc.SAMPLE_SPAN and r.attributes.get(sc.RL_STEP) == 7 for r in receiver.records) == n
    )
    assert rs.wait_for(
        lambda: (
            sum(r.name == sc.GROUP_SPAN and r.attributes.get(sc.RL_STEP) == 7 for r in receiver.records) == rs.N_PROMPTS
        )
    )
    records = list(receiver.records)
    samples = [r for r in records if r.name == sc.SAMPLE_SPAN and r.attributes.get(sc.RL_STEP) == 7]
    groups = {r.attributes[sc.RL_SAMPLE_UID]: r for r in records if r.name == sc.GROUP_SPAN}
    # identity: uid + session; index = the prompt's position in the dispatch batch (dataset index is 0 for all)
    assert sorted((s.attributes[sc.RL_SAMPLE_UID], s.attributes[sc.RL_ROLLOUT_N]) for s in samples) == sorted(
        (u, i) for u in uids for i in range(rs.N_SESSIONS)
    )
    for s in samples:
        uid = s.attributes[sc.RL_SAMPLE_UID]
        assert s.attributes[sc.RL_SAMPLE_INDEX] == uids.index(uid)
        assert s.attributes[sc.RL_SAMPLE_DATASET_INDEX] == 0 and s.attributes[sc.RL_VALIDATE] is False
        assert s.parent_id == groups[uid].span_id and s.trace_id == groups[uid].trace_id  # group -> sessions
        assert s.attributes[sc.RL_PROMPT_LENGTH] > 0 and s.attributes[sc.RL_RESPONSE_LENGTH] > 0
        assert s.attributes[sc.RL_REWARD_SCORE] == 0.0 and sc.RL_NUM_PREEMPTED in s.attributes
    for g in groups.values():
        assert g.attributes[sc.RL_GROUP_SIZE] == rs.N_SESSIONS and g.links  # linked to the dispatching step
    assert rs.wait_for(
        lambda: all(len(rs.descendants(rs.children(list(receiver.records)), s.span_id)) >= 2 for s in samples),
        timeout=20,
    )
    records = list(receiver.records)
    for s in samples:  # the prompt at position i asks "What is i + 1?": i % 3 == 2 answers without tools
        rs.check_sample_tree(records, s, expect_tools=s.attributes[sc.RL_SAMPLE_INDEX] % 3 != 2)
    # each trajectory in TransferQueue carries its row from spans; the carrier never became a field
    listed = tq.kv_list(partition_id="train")["train"]
    for key in keys:
        assert listed[key]["otel_agentloop.generate_sequences"] > 0
    data = tq.kv_batch_get(keys=keys, partition_id="train")
    assert oal_verl.CARRIER_KEY not in data and oal_verl.POSITION_KEY not in data
    tq.kv_clear(keys=keys + uids, partition_id="train")
