"""Real Ray actors running real verl agent-loop workers (legacy ``ray.remote(AgentLoopWorker)`` and V1's
``AgentLoopWorkerTQ``), created by this process; spans come back over real OTLP/gRPC to a receiver here.

The workers' model machinery is replaced by the harness (fake LLM server, real tools, fake reward actor):
``__init__`` of the class Ray ships is swapped for a no-op while the actor is created, then
``harness.setup_actor`` runs inside the actor. Everything else is verl's code as Ray ships it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import harness as h
from omegaconf import OmegaConf

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop import testing
from tests._support.otlp_receiver import Receiver, start_grpc
from tests._support.otlp_receiver import wait_for as poll

ROOT = Path(__file__).resolve().parents[2]
N_LEGACY = 4
N_PROMPTS, N_SESSIONS = 3, 2


@contextmanager
def cluster(setup_hook: str | None) -> Iterator[tuple[Any, Receiver]]:
    """A local Ray cluster (2 CPUs) + TransferQueue; workers export over OTLP/gRPC to a receiver here."""
    import ray
    import transfer_queue as tq

    from otel_agentloop.integrations import ray as oal_ray

    receiver = Receiver()
    server, endpoint = start_grpc(receiver)
    handle = oal.configure("verl-ray-test", endpoint=endpoint, protocol="grpc", schedule_delay_s=0.05)
    base: dict[str, Any] = {
        "env_vars": {
            "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "verl"), str(ROOT)]),
            "OTEL_BSP_SCHEDULE_DELAY": "50",
        }
    }
    env = oal_ray.runtime_env(handle, base=base)
    if setup_hook is not None:
        env["worker_process_setup_hook"] = setup_hook
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env=env,
        configure_logging=False,
    )
    try:
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        yield handle, receiver
    finally:
        with suppress(Exception):
            tq.close()
        ray.shutdown()
        handle.shutdown(5)
        server.stop(0)
        testing.reset()


@contextmanager
def light_init(cls: Any) -> Iterator[None]:
    """Swap ``cls.__init__`` (the class Ray ships) for the harness's no-op while actors are created."""
    saved = cls.__dict__["__init__"]
    cls.__init__ = h.light_init
    try:
        yield
    finally:
        cls.__init__ = saved


def wait_for(predicate: Callable[[], bool], timeout: float = 60.0) -> bool:
    """``tests._support.otlp_receiver.wait_for`` with this stage's default (actor starts take seconds here)."""
    return poll(predicate, timeout)


def legacy_actor(fully_async: bool = False, engine: bool = False) -> Any:
    """``ray.remote(AgentLoopWorker)`` as verl's legacy ``AgentLoopManager.__init__`` does, now."""
    import ray
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    actor_cls = ray.remote(AgentLoopWorker)
    with light_init(actor_cls.__ray_metadata__.modified_class):
        actor = actor_cls.options(num_cpus=0).remote(None, None)  # (config, llm_client): ignored
    ray.get(
        actor.__ray_call__.remote(
            lambda self: h.setup_actor(self, v1=False, n=N_SESSIONS, fully_async=fully_async, engine=engine)
        ),
        timeout=120,
    )
    return actor


def v1_actor(engine: bool = False) -> Any:
    """verl V1's ``AgentLoopWorkerTQ`` (made remote when verl imported it)."""
    import ray
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    with light_init(AgentLoopWorkerTQ.__ray_metadata__.modified_class):
        actor = AgentLoopWorkerTQ.options(num_cpus=0).remote(None, None)
    ray.get(
        actor.__ray_call__.remote(lambda self: h.setup_actor(self, v1=True, n=N_SESSIONS, engine=engine)), timeout=120
    )
    return actor


def run_legacy(actor: Any, step: int) -> Any:
    """The real (patched) legacy manager dispatching to the real actor: a sync call, as verl's trainer makes."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    manager = AgentLoopManager.__new__(AgentLoopManager)
    manager.agent_loop_workers = [actor]
    return manager.generate_sequences(h.make_batch(N_LEGACY, step))


def run_v1(actor: Any, step: int, validate: bool = False) -> tuple[list[str], list[str]]:
    """The real (patched) ``AgentLoopManagerTQ`` dispatching a V1 batch, as ``PPOTrainer`` submits it; waits
    until every prompt's group is finished in TransferQueue. Returns (prompt uids, trajectory keys)."""
    import transfer_queue as tq
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ

    partition = "val" if validate else "train"
    batch = h.make_v1_batch(N_PROMPTS, step, validate=validate)
    uids = [str(u) for u in batch["uid"]]
    tq.kv_batch_put(
        keys=uids,
        partition_id=partition,
        tags=[{"is_prompt": True, "status": "pending", "global_steps": step} for _ in uids],
    )
    manager = AgentLoopManagerTQ.__new__(AgentLoopManagerTQ)
    manager.agent_loop_workers = [actor]
    manager.generate_sequences(batch)

    def done() -> bool:
        listed = tq.kv_list(partition_id=partition).get(partition, {})
        return all(listed.get(u, {}).get("status") in ("finished", "failure") for u in uids)

    assert wait_for(done), tq.kv_list(partition_id=partition)
    listed = tq.kv_list(partition_id=partition)[partition]
    assert all(listed[u]["status"] == "finished" for u in uids), listed
    keys = [f"{u}_{s}_0" for u in uids for s in range(N_SESSIONS)]
    assert all(k in listed for k in keys), sorted(listed)
    return uids, keys


def _count_ours(fn: Any) -> int:
    """How many of our wrappers a call goes through (Ray's copies carry our marks: count our code only)."""
    from otel_agentloop.integrations import _patching  # verl's wrappers are made there (switched)

    n = 0
    while fn is not None:
        code = getattr(fn, "__code__", None)
        n += (
            code is not None
            and code.co_name in ("async_wrapper", "sync_wrapper")
            and code.co_filename == _patching.__file__
        )
        fn = getattr(fn, "__wrapped__", None)
    return n


def chain_counts(self: Any) -> dict[str, int]:
    """Run inside an actor: our wrappers on the path of each patched method of its class."""
    cls = type(self)
    return {
        name: _count_ours(getattr(cls, name))
        for name in ("_run_agent_loop", "_compute_score", "_run_prompt")
        if hasattr(cls, name)
    }


def children(records: list[Any]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for r in records:
        if r.parent_id:
            out.setdefault(r.parent_id, []).append(r)
    return out


def descendants(by_parent: dict[int, list[Any]], span_id: int) -> list[Any]:
    out, todo = [], [span_id]
    while todo:
        for child in by_parent.get(todo.pop(), []):
            out.append(child)
            todo.append(child.span_id)
    return out


def check_sample_tree(records: list[Any], sample: Any, expect_tools: bool) -> None:
    """A sample's generation, tool and reward spans arrived, below it, with its identity."""
    below = descendants(children(records), sample.span_id)
    gens = [r for r in below if r.attributes.get(sc.RL_PHASE) == sc.GENERATE]
    tools = [r for r in below if r.name.startswith(sc.TOOL_SPAN_PREFIX)]
    rewards = [r for r in below if r.name == sc.REWARD_SPAN]
    assert gens and rewards, (sample.attributes, [r.name for r in below])
    assert all(t.attributes[sc.GEN_AI_TOOL_NAME] in ("add", "lookup") for t in tools)
    if expect_tools:
        assert tools and len(gens) >= 2, (sample.attributes, [r.name for r in below])
    for r in gens + tools + rewards:
        for key in (sc.RL_STEP, sc.RL_SAMPLE_INDEX, sc.RL_ROLLOUT_N, sc.RL_VALIDATE):
            assert r.attributes[key] == sample.attributes[key], (r.name, key)
