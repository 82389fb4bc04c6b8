"""verl V1's real ``PPOTrainer.fit`` loop (sync, colocate-async, separate-async), with the model work stubbed.

Real: verl's default config file, the trainer class of the mode and its fit/step/_step_once/_validate/
_compute_metrics, the ReplayBuffer, TransferQueue, ``AgentLoopManagerTQ`` and a real ``AgentLoopWorkerTQ`` Ray
actor running ToolAgentLoop (see ``ray_scenarios``). Stubbed (no GPU, no model): the dataloader (a list of
prompt batches), weight sync / replica control (no-ops), and the model phases: old log-prob, advantage
(writes zero advantages/returns into TransferQueue so verl's metric code runs), actor update.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf


class _Nothing:
    """Answers every method call with None (weight sync, replicas, worker groups)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class _WeightSync(_Nothing):
    """Weight sync: the agent-loop actor's fake server now serves the trainer's current step."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def update_weights(self, global_steps: int, *args: Any, **kwargs: Any) -> None:
        import ray
        from harness import set_weight_version

        ray.get(self.actor.__ray_call__.remote(set_weight_version, global_steps))


class _RewardLoopManager:
    reward_loop_worker_handles = ["rewards are computed in the agent loop"]


class _Resources:
    def get_n_gpus(self) -> int:
        return 1


def make_config(mode: str, *, prompts: int, n: int, steps: int, test_freq: int) -> Any:
    import verl

    path = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
    cfg = OmegaConf.load(path)
    cfg.trainer.v1.trainer_mode = mode
    cfg.trainer.logger = ["console"]
    cfg.trainer.total_training_steps = steps
    cfg.trainer.total_epochs = 100
    cfg.trainer.test_freq = test_freq
    cfg.trainer.val_before_train = False
    cfg.trainer.save_freq = -1
    cfg.trainer.device = "cpu"
    cfg.data.train_batch_size = prompts
    cfg.data.gen_batch_size = None
    cfg.actor_rollout_ref.rollout.n = n
    cfg.actor_rollout_ref.rollout.val_kwargs.n = 1
    cfg.actor_rollout_ref.rollout.agent.default_agent_loop = "tool_agent"
    cfg.trainer.v1.separate_async.parameter_sync_step = 1
    return cfg


def prompt_batches(prompts: int, count: int, first: int = 0) -> list[dict[str, Any]]:
    """What verl's collate function yields: object arrays of raw prompts, dataset index (0: not unique), ..."""
    out = []
    for b in range(count):
        raw = np.empty(prompts, dtype=object)
        for i in range(prompts):
            raw[i] = [{"role": "user", "content": f"What is {first + b * prompts + i} + 1? Use the tools."}]
        out.append(
            {
                "raw_prompt": raw,
                "index": np.zeros(prompts, dtype=object),
                "agent_name": np.array(["tool_agent"] * prompts, dtype=object),
                "data_source": np.array(["sim"] * prompts, dtype=object),
                "reward_model": np.array([{"ground_truth": "1"}] * prompts, dtype=object),
            }
        )
    return out


def make_trainer(mode: str, actor: Any, *, prompts: int, n: int, steps: int, test_freq: int = -1) -> Any:
    import torch
    import transfer_queue as tq
    from verl.trainer.ppo.v1 import get_trainer_cls

    base = get_trainer_cls(mode)

    def _balance_batch(
        self: Any, batch: Any, metrics: Any, logging_prefix: str = "global_seqlen", keep_minibatch: bool = False
    ) -> Any:
        return batch

    def _compute_old_log_prob(self: Any, batch: Any, metrics: Any) -> Any:
        return batch

    def _compute_advantage(self: Any, batch: Any, metrics: Any) -> Any:
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask"])
        masks = [m.float() for m in data["response_mask"].unbind(0)]
        fields = {
            "advantages": torch.nested.as_nested_tensor([torch.zeros_like(m) for m in masks], layout=torch.jagged),
            "returns": torch.nested.as_nested_tensor([torch.zeros_like(m) for m in masks], layout=torch.jagged),
        }
        from tensordict import TensorDict

        tq.kv_batch_put(
            keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(fields, batch_size=[len(masks)])
        )
        return batch

    def _update_actor(self: Any, batch: Any, metrics: Any) -> Any:
        metrics["actor/pg_loss"] = 0.0
        return batch

    stub = type(
        f"Stubbed{base.__name__}",
        (base,),
        {
            "_balance_batch": _balance_batch,
            "_compute_old_log_prob": _compute_old_log_prob,
            "_compute_advantage": _compute_advantage,
            "_update_actor": _update_actor,
            "_save_checkpoint": lambda self: None,
            "_load_checkpoint": lambda self: None,
        },
    )
    cfg = make_config(mode, prompts=prompts, n=n, steps=steps, test_freq=test_freq)
    trainer = stub.__new__(stub)
    trainer.config = cfg
    trainer.trainer_mode = mode
    trainer.parameter_sync_step = 1
    trainer.use_critic = False
    trainer.use_reference_policy = False
    trainer.use_teacher_policy = False
    trainer.local_trigger_step = 0
    trainer._restored_tq_prompt_count = 0
    from verl.trainer.ppo.metric_utils import RolloutMoELoadBalanceMetricsAccumulator

    trainer._rollout_moe_lb_metrics_accumulator = RolloutMoELoadBalanceMetricsAccumulator(
        model_config=cfg.actor_rollout_ref.model
    )
    trainer.replay_buffer = trainer._build_replay_buffer()
    trainer.global_steps = 0
    trainer.total_training_steps = steps
    trainer.steps_per_epoch = 1000
    trainer.train_dataloader = prompt_batches(prompts, 3 * steps + 4)
    trainer.train_dataloader_it = None
    trainer.val_dataloader = prompt_batches(prompts, 1, first=100)
    trainer.checkpoint_manager = _WeightSync(actor)
    trainer.standalone_checkpoint_manager = _WeightSync(actor)
    trainer.actor_rollout_wg = _Nothing()
    trainer.reward_loop_manager = _RewardLoopManager()
    trainer.resource_pool_manager = _Resources()
    from harness import build_tokenizer

    trainer.tokenizer = build_tokenizer()
    trainer._pending_sync_metrics = {}
    trainer._init_dump_executor()
    if mode == "separate_async":
        from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode

        trainer.current_mode = HybridEngineMode.TRAINER
        trainer.hybrid_rollout_config = OmegaConf.create({"enable_switch": False})
        trainer._enable_hybrid_replicas = False
    return trainer
