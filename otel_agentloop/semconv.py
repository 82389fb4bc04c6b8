"""Every span name and attribute key this library writes or reads.

RL-specific names live under the ``rl.`` namespace (mirroring verl's rollout identity and the
OpenTelemetry RL proposals); generation and tool spans follow the OpenTelemetry GenAI conventions
(``gen_ai.*``), and failures use ``error.type``. Nothing else in the package spells these strings.

Metric attributes (spanmetrics, health) must only use the low-cardinality keys listed in
:data:`LOW_CARDINALITY`: never :data:`RL_SAMPLE_INDEX` or :data:`RL_ROLLOUT_N`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

# -- verl phase keys (the value of ``rl.phase`` and the middle part of the metric keys) --------
GENERATE: Final = "generate_sequences"
TOOL_CALLS: Final = "tool_calls"
COMPUTE_SCORE: Final = "compute_score"
PHASES: Final = (GENERATE, TOOL_CALLS, COMPUTE_SCORE)
"""The timed phases, in verl's order. ``num_preempted`` is a count, not a phase."""

# -- span names -----------------------------------------------------------------------------------
STEP_SPAN: Final = "rl.step"
SAMPLE_SPAN: Final = "rl.sample"
REWARD_SPAN: Final = "rl.reward"
SPAN_NAME_PREFIX: Final = "rl."
"""The library's own span names start with it (``rl.sample``, ``rl.step.summary``, ...)."""
TRAINER_PHASE_SPAN_PREFIX: Final = "rl.train."
"""Trainer phases (rollout, old_log_prob, ref, adv, update_actor, testing) are ``rl.train.<name>``."""
TOOL_SPAN_PREFIX: Final = "execute_tool"
"""GenAI tool span name: ``execute_tool {gen_ai.tool.name}``."""
TOOL_CALLS_SPAN: Final = "rl.tool_calls"
"""A turn's tool calls as one block (verl's ``tool_calls`` timer around ``asyncio.gather``)."""
DEFAULT_GENERATE_OPERATION: Final = "text_completion"
"""GenAI operation for token-in/token-out generation; the span is ``{operation} {model}``."""

# -- RL attributes (namespace ``rl.``) -------------------------------------------------------------
RL_PHASE: Final = "rl.phase"
"""verl's key for the phase a span times: one of :data:`PHASES`. The metrics processor reads it."""
RL_STEP: Final = "rl.step"
RL_VALIDATE: Final = "rl.validate"
RL_SAMPLE_INDEX: Final = "rl.sample.index"
RL_ROLLOUT_N: Final = "rl.sample.rollout_n"
RL_WORKER: Final = "rl.worker"
RL_EXPERIMENT: Final = "rl.experiment.name"
RL_NUM_PREEMPTED: Final = "rl.num_preempted"
RL_PROMPT_LENGTH: Final = "rl.sample.prompt_length"
RL_RESPONSE_LENGTH: Final = "rl.sample.response_length"
RL_REWARD_SCORE: Final = "rl.reward.score"
RL_NUM_TURNS: Final = "rl.sample.turns"
RL_CANCELLED: Final = "rl.cancelled"
RL_SAMPLED: Final = "rl.sample.exported"
RL_PROMPT_CONTENT: Final = "rl.sample.prompt"
RL_RESPONSE_CONTENT: Final = "rl.sample.response"
RL_AGENT_NAME: Final = "rl.agent.name"
"""verl's ``agent_name`` of a sample's agent loop (``tool_agent``, ``single_turn_agent``, ...)."""
RL_TRACE_PER: Final = "rl.trace_per"
"""Not a span attribute: the key of the driver step's ``trace_per`` in the Ray carrier dict (next to
:data:`RL_STEP` and :data:`RL_VALIDATE`)."""
RL_HEALTH_ALERT: Final = "rl.health.alert"
"""The span event a training-health rule adds when it trips, with ``rule``, ``key``, ``value``, ``threshold``
and :data:`RL_STEP`."""

# -- the step key: which step a span belongs to -----------------------------------------------------
StepKey = tuple[int | None, bool]
"""``(step, validate)``: the step a span, a sample or a collect belongs to, a training step and a validation
step with the same number being two steps. ``None`` as the step: no step (a sample outside any
``otel_agentloop.step``, released by ``collect(None)``; a span whose ``rl.step`` is absent or not an int)."""


def step_key(attributes: Mapping[str, object]) -> StepKey:
    """The :data:`StepKey` of a span from its attributes, the one reading every part of the package uses:
    ``rl.step`` when it is an int (``bool`` is not), else ``None``; ``rl.validate`` only when it is ``True``
    (absent or any other value: a training step). Never raises for a mapping."""
    step = attributes.get(RL_STEP)
    return (step if type(step) is int else None, attributes.get(RL_VALIDATE) is True)


# -- OpenTelemetry GenAI and general conventions -------------------------------------------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
EXECUTE_TOOL: Final = "execute_tool"
ERROR_TYPE: Final = "error.type"

LOW_CARDINALITY: Final = (RL_PHASE, GEN_AI_OPERATION_NAME, GEN_AI_TOOL_NAME, RL_VALIDATE, ERROR_TYPE)
"""The only span attributes fit to be metric dimensions (see ``collector/collector.yaml``)."""

# -- metric keys (verl's, plus ours under the same prefix) ----------------------------------------
METRIC_PREFIX: Final = "agent_loop"
RL_PHASE_TRAIN: Final = "rl.train.phase"
"""The trainer phase a ``rl.train.<name>`` span times (verl's ``marked_timer`` name)."""
LATE_SAMPLES: Final = "late_samples"
"""``agent_loop/late_samples``: samples in this result that were still running at an earlier ``collect`` of
the same step (present only when > 0)."""
WORKER_SPAN: Final = "rl.worker"
"""One Ray actor call's share of a step (driver step -> worker call -> samples)."""

# -- verl V1: prompt groups, policy versions, consumption ------------------------------------------
GROUP_SPAN: Final = "rl.group"
"""One prompt's group of sessions (GRPO's group: verl V1's ``rollout.n`` sessions of one ``uid``)."""
RL_SAMPLE_UID: Final = "rl.sample.uid"
"""verl V1: the prompt's ``uid`` (unique; its dataset index is not)."""
RL_SAMPLE_DATASET_INDEX: Final = "rl.sample.dataset_index"
"""verl V1: the prompt's dataset index (``extra_info.index``; not unique)."""
RL_GROUP_SIZE: Final = "rl.group.size"
RL_POLICY_VERSION: Final = "rl.policy.version"
"""The weight version (trainer step) that served a generation turn."""
RL_POLICY_VERSION_MIN: Final = "rl.policy.version.min"
RL_POLICY_VERSION_MAX: Final = "rl.policy.version.max"
RL_CONSUMED_STEP: Final = "rl.consumed_step"
"""The trainer step that trained a sample (async modes: later than its dispatch ``rl.step``)."""
RL_STALENESS: Final = "rl.staleness"
"""consumed step - dispatch step."""
RL_STALENESS_MAX: Final = "rl.staleness.max"
"""On a :data:`CONSUME_SPAN`: the largest :data:`RL_STALENESS` of its batch."""
RL_CONSUME_NUM_SAMPLES: Final = "rl.consume.num_samples"
"""On a :data:`CONSUME_SPAN`: how many samples the trained batch holds."""
CONSUME_SPAN: Final = "rl.consume"
"""One trained step's batch in the trainer, linked to the sample spans it trained."""

# -- live view: in-flight samples, watchdog snapshots, metrics from the library ------------------
RL_SNAPSHOT: Final = "rl.snapshot"
"""``True`` on a watchdog snapshot span: a still-running sample as seen at snapshot time. Not a phase span:
metrics and reports skip it."""
SNAPSHOT_SUFFIX: Final = " (in progress)"
"""A snapshot span is named ``"<sample span name> (in progress)"``, in the sample's trace, linked to the open
sample span, from the sample's start to the snapshot time, with the sample's identity, ``rl.phase`` (the
phase running at snapshot time) and ``gen_ai.tool.name`` when in a tool."""
RL_SNAPSHOT_PHASE_AGE: Final = "rl.snapshot.phase_age_s"
"""Seconds the current phase had run at snapshot time."""
GEN_AI_CLIENT_OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
GEN_AI_EXECUTE_TOOL_DURATION: Final = "gen_ai.execute_tool.duration"
RL_REWARD_DURATION: Final = "rl.reward.duration"
RL_SAMPLE_DURATION: Final = "rl.sample.duration"
RL_INFLIGHT_SAMPLES: Final = "rl.samples.in_flight"
RL_INFLIGHT_OLDEST_AGE: Final = "rl.samples.in_flight.oldest_age"
WATCHDOG_SLOW: Final = "watchdog/slow"
"""``agent_loop/watchdog/slow``: samples the watchdog reported that finished before the step was collected."""
WATCHDOG_HUNG: Final = "watchdog/hung"
"""``agent_loop/watchdog/hung``: samples the watchdog reported still running when the step was collected."""

# -- the run: identity and per-step summaries ------------------------------------------------------
RL_RUN_ID: Final = "rl.run.id"
"""Resource attribute: the training run. The same on every process of the run (Ray workers get it through
``runtime_env``) and across a resume from a checkpoint; ``report`` never merges two runs."""
RL_RUN_ATTEMPT: Final = "rl.run.attempt"
"""Resource attribute: one launch of the run's driver (a resume is a new attempt of the same run). A step run
twice in one run (after a resume) is read from its latest attempt."""
STEP_SUMMARY_SPAN: Final = "rl.step.summary"
"""One span per collected step, written when the step is collected, in a trace of its own, never sampled out:
the compact record the run page and ``report --compare`` read instead of the step's sample spans."""
RL_STEP_SUMMARY: Final = "rl.step.summary"
"""On a :data:`STEP_SUMMARY_SPAN`: the step's :class:`~otel_agentloop.metrics.StepSummary` as versioned JSON."""

# -- inside a generation turn: the inference engine's own timing (issue 28) -----------------------
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
"""GenAI convention: the engine's request id of the turn (vLLM's ``request_id``, SGLang's ``rid``)."""
RL_ENGINE_NAME: Final = "rl.engine.name"
"""The inference engine that served the turn: ``vllm`` or ``sglang``."""
RL_ENGINE_QUEUE_S: Final = "rl.engine.queue_s"
"""Seconds the turn's request waited in the engine's queue before it was scheduled (vLLM's
``gen_ai.latency.time_in_queue``)."""
RL_ENGINE_TTFT_S: Final = "rl.engine.time_to_first_token_s"
"""Seconds from the engine's arrival of the request to its first output token."""
RL_ENGINE_PREFILL_S: Final = "rl.engine.prefill_s"
"""Seconds the engine spent prefilling the prompt (scheduled to first token)."""
RL_ENGINE_DECODE_S: Final = "rl.engine.decode_s"
"""Seconds the engine spent decoding (first to last token)."""
RL_ENGINE_PREEMPTIONS: Final = "rl.engine.preemptions"
"""Times the engine preempted the request, where it reports it (also summed into :data:`RL_NUM_PREEMPTED`)."""
ENGINE_ATTRIBUTES: Final = (
    GEN_AI_RESPONSE_ID,
    RL_ENGINE_NAME,
    RL_ENGINE_QUEUE_S,
    RL_ENGINE_TTFT_S,
    RL_ENGINE_PREFILL_S,
    RL_ENGINE_DECODE_S,
    RL_ENGINE_PREEMPTIONS,
)
"""What a generation turn span may carry of the engine's timing, besides ``gen_ai.usage.*_tokens`` and
``gen_ai.response.finish_reasons``. Seconds are floats; an attribute the engine does not report is absent."""
ENGINE_METRIC: Final = "engine"
"""Per step, ``agent_loop/engine/{queue_s,time_to_first_token_s,decode_s,output_tokens,decode_tokens_per_s}/
{p50,p90,p99,max}`` over the step's generation turns that carry the engine's timing."""
ENGINE_QUEUE_S: Final = "queue_s"
"""``agent_loop/engine/queue_s/<stat>``: :data:`RL_ENGINE_QUEUE_S` per turn."""
ENGINE_TTFT_S: Final = "time_to_first_token_s"
"""``agent_loop/engine/time_to_first_token_s/<stat>``: :data:`RL_ENGINE_TTFT_S` per turn."""
ENGINE_DECODE_S: Final = "decode_s"
"""``agent_loop/engine/decode_s/<stat>``: :data:`RL_ENGINE_DECODE_S` per turn."""
ENGINE_OUTPUT_TOKENS: Final = "output_tokens"
"""``agent_loop/engine/output_tokens/<stat>``: :data:`GEN_AI_USAGE_OUTPUT_TOKENS` of each turn with engine timing."""
ENGINE_DECODE_TPS: Final = "decode_tokens_per_s"
"""``agent_loop/engine/decode_tokens_per_s/<stat>``: output tokens / :data:`RL_ENGINE_DECODE_S` per turn (turns
with both, decode time > 0)."""
ENGINE_STATS: Final = (ENGINE_QUEUE_S, ENGINE_TTFT_S, ENGINE_DECODE_S, ENGINE_OUTPUT_TOKENS, ENGINE_DECODE_TPS)
"""The per-step engine statistics, in display order."""
ENGINE_STAT_COLUMNS: Final = ("p50", "p90", "p99", "max")
"""The columns of each: ``agent_loop/engine/<stat>/<column>`` (linear interpolation, as the phases' p50)."""

# -- issue 36, partial rollouts (verl fully-async) and the per-turn engine state they combine ---------------
# (the strings of DESIGN-36; the same constants the engine and metrics helpers append: keep one of each)
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
"""On a turn: prompt tokens the engine served from its prefix cache (vLLM's ``RequestOutput.num_cached_tokens``)."""
RL_ENGINE_FINISH: Final = "rl.engine.finish"
"""How an engine request ended: :data:`ENGINE_FINISHED` or :data:`ENGINE_ABORTED` (e.g. a weight sync)."""
ENGINE_FINISHED: Final = "finished"
ENGINE_ABORTED: Final = "aborted"
RL_ENGINE_BATCH_RUNNING_MAX: Final = "rl.engine.batch.running.max"
"""On a turn: the most sequences running in one engine iteration while its request was in the engine."""
RL_ENGINE_BATCH_RUNNING_MEAN: Final = "rl.engine.batch.running.mean"
"""On a turn: the mean sequences running over those iterations."""
RL_ENGINE_BATCH_WAITING_MAX: Final = "rl.engine.batch.waiting.max"
"""On a turn: the most requests waiting in one of those iterations."""
RL_ENGINE_KV_CACHE_USAGE_MAX: Final = "rl.engine.kv_cache.usage.max"
"""On a turn: the highest KV cache usage (a fraction, 0 to 1) over those iterations."""
RL_ENGINE_ITERATIONS: Final = "rl.engine.iterations"
"""On a turn: how many engine iterations its request's figures cover."""
SEGMENT_SPAN: Final = "rl.engine.segment"
"""One engine attempt of a turn (a partial rollout resumed after an abort), child of the turn."""
RL_ENGINE_SEGMENT_INDEX: Final = "rl.engine.segment.index"
"""On a segment: the attempt's index in its turn, from 0."""
RL_ENGINE_POLICY_VERSION: Final = "rl.engine.policy_version"
"""On a segment: the policy version (verl's param version / ``global_steps``) the attempt ran under."""
RL_ENGINE_SEGMENTS: Final = "rl.engine.segments"
"""On a turn: its engine attempts (present when one was aborted)."""
RL_ENGINE_POLICY_VERSIONS: Final = "rl.engine.policy_versions"
"""On a turn: the distinct policy versions its attempts ran under, in order (int array)."""
RL_SAMPLE_STALENESS: Final = "rl.sample.staleness"
"""On a sample: the newest policy version its turns ran under minus the oldest (0 with one version)."""
