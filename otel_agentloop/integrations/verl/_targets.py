"""Every attribute the verl instrumentor may replace: (module, owner path from the module, attribute).

Used to resolve a wrapper shipped by reference to a process that cannot be instrumented (see ``_patching``):
it then gets verl's original attribute.
"""

from __future__ import annotations

_TQ_WORKER = "AgentLoopWorkerTQ.__ray_metadata__.modified_class"
_ROLLOUTER = "FullyAsyncRollouter.__ray_metadata__.modified_class"
_AGENT_LOOP = "verl.experimental.agent_loop.agent_loop"
_V1 = "verl.trainer.ppo.v1."
_VLLM_SERVER = "verl.workers.rollout.vllm_rollout.vllm_async_server"
_SGLANG_SERVER = "verl.workers.rollout.sglang_rollout.async_sglang_server"

TARGETS: tuple[tuple[str, str, str], ...] = (
    (_AGENT_LOOP, "AgentLoopManager", "generate_sequences"),
    (_AGENT_LOOP, "AgentLoopManager", "_performance_metrics"),
    (_AGENT_LOOP, "AgentLoopWorker", "generate_sequences"),
    (_AGENT_LOOP, "AgentLoopWorker", "_run_agent_loop"),
    (_AGENT_LOOP, "AgentLoopWorker", "_compute_score"),
    (_AGENT_LOOP, "", "simple_timer"),
    ("verl.experimental.agent_loop.tool_agent_loop", "ToolAgentLoop", "_call_tool"),
    ("verl.experimental.agent_loop.tool_agent_loop", "", "simple_timer"),
    ("verl.experimental.agent_loop.single_turn_agent_loop", "", "simple_timer"),
    ("verl.workers.rollout.llm_server", "LLMServerClient", "generate"),
    ("verl.workers.rollout.llm_server", "FullyAsyncLLMServerClient", "generate"),
    ("verl.workers.rollout.llm_server", "LLMServerClient", "_acquire_server"),
    (_VLLM_SERVER, "vLLMHttpServer", "generate"),
    (_VLLM_SERVER, "vLLMHttpServer", "_preprocess_engine_kwargs"),
    (_SGLANG_SERVER, "SGLangHttpServer", "generate"),
    (_V1 + "agent_loop_tq", "AgentLoopManagerTQ", "generate_sequences"),
    (_V1 + "agent_loop_tq", _TQ_WORKER, "_run_prompt"),
    (_V1 + "agent_loop_tq", _TQ_WORKER, "_run_agent_loop"),
    (_V1 + "agent_loop_tq", _TQ_WORKER, "_compute_score"),
    ("transfer_queue", "", "async_kv_batch_put"),
    (_V1 + "replay_buffer", "ReplayBuffer", "sample"),
    (_V1 + "replay_buffer", "ReplayBufferAsync", "sample"),
    (_V1 + "trainer_base", "PPOTrainer", "step"),
    (_V1 + "trainer_base", "PPOTrainer", "_compute_metrics"),
    (_V1 + "trainer_base", "PPOTrainer", "_validate"),
    ("verl.experimental.fully_async_policy.fully_async_rollouter", _ROLLOUTER, "_process_single_sample_streaming"),
    ("verl.experimental.fully_async_policy.fully_async_trainer", "", "assemble_batch_from_rollout_samples"),
    ("verl.trainer.constants_ppo", "", "get_ppo_ray_runtime_env"),
)
