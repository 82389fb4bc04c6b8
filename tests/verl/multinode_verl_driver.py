"""``python -m verl.trainer.main_ppo`` as a user runs it against a cluster started elsewhere, run as ``__main__``:
verl's own ``ppo_trainer`` config composed with the command line's overrides (``argv[3:]``, plus
``ray_kwargs.ray_init.address=argv[1]``), then verl's real ``run_ppo`` (its ``ray.init`` with the merged
``runtime_env``, its task runner actor). The task runner does what matters here as ``TaskRunnerV1`` does:

- ``full``: TransferQueue, then one V1 agent-loop worker actor pinned to each node (custom resources), and
  verl's ``AgentLoopManagerTQ`` dispatching one batch over both;
- ``light``: one small task with a sample on the worker node.

Prints one JSON line: what the task runner and the worker-node task saw.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ray

HEAD, NODE2 = "head", "node2"
STEP = 31


def _describe() -> dict:
    import os

    from otel_agentloop.integrations import verl as oal_verl
    from otel_agentloop.setup import current_handle

    handle = current_handle()
    return {
        "node": ray.get_runtime_context().get_node_id(),
        "pid": os.getpid(),
        "instrumented": oal_verl.is_instrumented(),
        "exports": None if handle is None else handle.description,
    }


@ray.remote(num_cpus=0)
def node2_task() -> dict:
    import otel_agentloop as oal

    with oal.step(STEP), oal.sample(99, 0), oal.span("tool_calls", tool="probe"):
        pass
    out = _describe()
    handle = oal.current_handle()
    if handle is not None:
        handle.force_flush(5)
    return out


def _v1_actor(resources: dict) -> object:
    import harness as h
    import ray_scenarios as rs
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    with rs.light_init(AgentLoopWorkerTQ.__ray_metadata__.modified_class):
        actor = AgentLoopWorkerTQ.options(num_cpus=0, resources=resources).remote(None, None)
    ray.get(actor.__ray_call__.remote(lambda self: h.setup_actor(self, v1=True, n=rs.N_SESSIONS)), timeout=180)
    return actor


def _dispatch(actors: list) -> None:
    """``AgentLoopManagerTQ.generate_sequences`` over ``actors`` (it chunks the batch across them), as
    ``PPOTrainer`` submits it; waits until every prompt's group is finished in TransferQueue."""
    import harness as h
    import ray_scenarios as rs
    import transfer_queue as tq
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ

    batch = h.make_v1_batch(rs.N_PROMPTS, STEP)
    uids = [str(u) for u in batch["uid"]]
    tags = [{"is_prompt": True, "status": "pending", "global_steps": STEP} for _ in uids]
    tq.kv_batch_put(keys=uids, partition_id="train", tags=tags)
    manager = AgentLoopManagerTQ.__new__(AgentLoopManagerTQ)
    manager.agent_loop_workers = actors
    manager.generate_sequences(batch)

    def done() -> bool:
        listed = tq.kv_list(partition_id="train").get("train", {})
        return all(listed.get(u, {}).get("status") == "finished" for u in uids)

    if not rs.wait_for(done, timeout=180):
        raise RuntimeError(f"the batch did not finish: {tq.kv_list(partition_id='train')}")


@ray.remote(num_cpus=0)
class MultiNodeTaskRunner:
    def run(self, config) -> dict:
        mode = config.get("probe_mode", "light")
        out = {"runner": _describe()}
        if mode == "full":
            import transfer_queue as tq
            from omegaconf import OmegaConf

            import otel_agentloop as oal

            tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
            actors = [_v1_actor({HEAD: 0.01}), _v1_actor({NODE2: 0.01})]
            out["actors"] = ray.get([a.__ray_call__.remote(lambda self: _describe()) for a in actors])
            _dispatch(actors)
            for actor in actors:
                ray.get(actor.__ray_call__.remote(lambda self: oal.current_handle().force_flush(5)))
            tq.close()
        out["node2_task"] = ray.get(node2_task.options(resources={NODE2: 0.01}).remote())
        return out


def main() -> None:
    import verl
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf, open_dict
    from verl.trainer.main_ppo import run_ppo

    address, mode, overrides = sys.argv[1], sys.argv[2], sys.argv[3:]
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose("ppo_trainer", overrides=[*overrides, f"+ray_kwargs.ray_init.address={address}"])
    with open_dict(config):
        config.probe_mode = mode
    seen: dict = {}

    class Runner:  # verl calls task_runner_class.remote() and then runner.run.remote(config)
        @staticmethod
        def remote() -> object:
            actor = MultiNodeTaskRunner.remote()

            class Run:
                class run:  # noqa: N801 - mirrors the actor method's interface
                    @staticmethod
                    def remote(cfg: object) -> object:
                        ref = actor.run.remote(cfg)
                        seen["ref"] = ref
                        return ref

            return Run

    run_ppo(config, task_runner_class=Runner)
    print(json.dumps(ray.get(seen["ref"])), flush=True)
    print("ray init runtime_env hook:", OmegaConf.select(config, "ray_kwargs.ray_init.runtime_env"), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
