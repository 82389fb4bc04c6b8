"""A task runner for verl's real ``run_ppo`` (what ``python -m verl.trainer.main_ppo`` calls): in place of
``TaskRunnerV1.run`` (models, servers), it does what matters here as the stock one does: initialises
TransferQueue, creates the V1 agent-loop worker actor and dispatches one batch. Instrumenting is left to the
``worker_process_setup_hook`` given on the command line."""

from __future__ import annotations

import ray


@ray.remote(num_cpus=0)
class ProbeTaskRunner:
    def run(self, config) -> None:
        import ray_scenarios as rs
        import transfer_queue as tq
        from omegaconf import OmegaConf

        from otel_agentloop.integrations import verl as oal_verl
        from otel_agentloop.setup import current_handle

        if not oal_verl.is_instrumented() or current_handle() is None:
            raise RuntimeError("the setup hook did not configure and instrument this Ray worker")
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        actor = rs.v1_actor()  # verl V1 imported after instrument(): Ray copied our wrappers, once
        counts = ray.get(actor.__ray_call__.remote(rs.chain_counts))
        if counts != {"_run_agent_loop": 1, "_compute_score": 1, "_run_prompt": 1}:
            raise RuntimeError(f"patched methods wrapped {counts} times")
        rs.run_v1(actor, step=21)
        current_handle().force_flush(5)
        ray.get(actor.__ray_call__.remote(lambda self: __import__("otel_agentloop").integrations.ray._flush(5.0)))
