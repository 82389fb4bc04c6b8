"""The documented way to trace a stock run, checked on verl's real entry point: the Hydra override composed
with verl's own ``ppo_trainer`` config, then verl's ``run_ppo`` (its ``ray.init`` with the merged
``runtime_env``, its task runner actor); the task runner creates the agent-loop worker actor as
``TaskRunnerV1`` does. Nothing in the test process calls ``instrument()``."""

from __future__ import annotations

import os
from pathlib import Path

import ray_scenarios as rs

from otel_agentloop import semconv as sc
from otel_agentloop import testing
from otel_agentloop.integrations import verl as oal_verl
from tests._support.otlp_receiver import Receiver, start_grpc

HOOK = "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=otel_agentloop.integrations.verl.setup_worker"


def test_stock_run_ppo_with_the_setup_hook_override(monkeypatch) -> None:
    import ray
    import verl
    from hydra import compose, initialize_config_dir
    from stock_probe import ProbeTaskRunner
    from verl.trainer.main_ppo import run_ppo

    receiver = Receiver()
    server, endpoint = start_grpc(receiver)
    # what a user exports before `python -m verl.trainer.main_ppo ...` (a local cluster's workers inherit it)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "verl-stock")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(rs.ROOT / "tests" / "verl"), str(rs.ROOT), os.environ.get("PYTHONPATH", "")])
    )
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose("ppo_trainer", overrides=[HOOK, "ray_kwargs.ray_init.num_cpus=2"])
    assert config.ray_kwargs.ray_init.runtime_env.worker_process_setup_hook.endswith("verl.setup_worker")
    try:
        run_ppo(config, task_runner_class=ProbeTaskRunner)
        n = rs.N_PROMPTS * rs.N_SESSIONS
        assert rs.wait_for(
            lambda: sum(r.name == sc.SAMPLE_SPAN and r.attributes.get(sc.RL_STEP) == 21 for r in receiver.records) == n
        )
        assert rs.wait_for(lambda: sum(r.name == sc.GROUP_SPAN for r in receiver.records) == rs.N_PROMPTS)
        samples = [r for r in receiver.records if r.name == sc.SAMPLE_SPAN]
        assert all(r.resource.get("service.name") == "verl-stock" for r in samples)
        assert not oal_verl.is_instrumented()  # only the Ray workers were
    finally:
        ray.shutdown()
        server.stop(0)
        testing.reset()
