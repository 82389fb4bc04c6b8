"""The other route: the creating process is NOT instrumented; Ray's ``worker_process_setup_hook``
(``otel_agentloop.integrations.verl.setup_worker``, what a stock ``main_ppo`` run adds) configures tracing and
instruments every worker process, so the agent-loop actors are traced all the same."""

from __future__ import annotations

import pytest
import ray_scenarios as rs

from otel_agentloop import semconv as sc
from otel_agentloop.integrations import verl as oal_verl


@pytest.fixture(scope="module")
def hooked_cluster():
    assert not oal_verl.is_instrumented()
    with rs.cluster(setup_hook="otel_agentloop.integrations.verl.setup_worker") as (handle, receiver):
        yield handle, receiver
    assert not oal_verl.is_instrumented()


def test_legacy_and_v1_actors_traced_through_the_setup_hook(hooked_cluster) -> None:
    import transfer_queue as tq

    _handle, receiver = hooked_cluster
    legacy = rs.legacy_actor()
    rs.run_legacy(legacy, step=11)
    v1 = rs.v1_actor()
    uids, keys = rs.run_v1(v1, step=12)
    n_v1 = rs.N_PROMPTS * rs.N_SESSIONS

    def samples(step: int) -> list:
        return [r for r in receiver.records if r.name == sc.SAMPLE_SPAN and r.attributes.get(sc.RL_STEP) == step]

    assert rs.wait_for(lambda: len(samples(11)) == rs.N_LEGACY and len(samples(12)) == n_v1)
    assert rs.wait_for(
        lambda: all(
            len(rs.descendants(rs.children(list(receiver.records)), s.span_id)) >= 2 for s in samples(11) + samples(12)
        ),
        timeout=20,
    )
    records = list(receiver.records)
    for s in samples(11):
        i = s.attributes[sc.RL_SAMPLE_INDEX] * 2 + s.attributes[sc.RL_ROLLOUT_N]
        rs.check_sample_tree(records, s, expect_tools=i % 3 != 2)
    # without the creator's patches there is no carrier (and no position): the index is the order the worker
    # received the prompts in; uid + session identify each trajectory, and the row still reaches TransferQueue
    assert sorted((s.attributes[sc.RL_SAMPLE_UID], s.attributes[sc.RL_ROLLOUT_N]) for s in samples(12)) == sorted(
        (u, i) for u in uids for i in range(rs.N_SESSIONS)
    )
    assert sorted({s.attributes[sc.RL_SAMPLE_INDEX] for s in samples(12)}) == list(range(rs.N_PROMPTS))
    for s in samples(12):
        assert s.attributes.get(sc.RL_PROMPT_LENGTH, 0) > 0 and s.attributes[sc.RL_REWARD_SCORE] == 0.0, (
            s.attributes,
            s.resource,
        )
    listed = tq.kv_list(partition_id="train")["train"]
    assert all(listed[k]["otel_agentloop.generate_sequences"] > 0 for k in keys)
    tq.kv_clear(keys=keys + uids, partition_id="train")


def test_setup_worker_called_in_a_driver_leaves_ray_init_to_verl(tmp_path) -> None:
    """``setup_worker()`` in a process with no Ray connection (a driver, before ``run_ppo``) must not start a
    local Ray instance: ``run_ppo`` would see ``ray.is_initialized()`` and skip its own ``ray.init``, losing
    the ``runtime_env`` it passes."""
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import ray
        from otel_agentloop.integrations import verl as oal_verl
        oal_verl.setup_worker()
        print("initialized:", ray.is_initialized(), "instrumented:", oal_verl.is_instrumented())
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RAY_ADDRESS"))}
    env["OTEL_TRACES_EXPORTER"] = "none"
    env["PYTHONPATH"] = str(rs.ROOT)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=True
    )
    assert "initialized: False instrumented: True" in out.stdout, out.stderr[-3000:]
