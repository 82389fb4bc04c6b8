"""Patches of verl's V1 trainer (``verl.trainer.ppo.v1``, the default since 0.9): sync, colocate-async and
separate-async modes, and validation.

- ``AgentLoopManagerTQ.generate_sequences`` (the process creating the actors): the dispatching step's W3C
  carrier (a ``NonTensorData``) and each prompt's position ride in the batch; they are removed again after.
- ``AgentLoopWorkerTQ`` (patched on the class Ray ships, ``__ray_metadata__.modified_class``):
  ``_run_prompt`` is the group span (one per ``uid``, its ``n`` sessions as children); the inherited
  ``_run_agent_loop``/``_compute_score`` as in :mod:`._agent_loop` and :mod:`._phases` (the carrier and
  position keywords are popped before the agent loop sees them).
- ``transfer_queue.async_kv_batch_put``, only while a V1 sample of ours is putting its trajectory: the
  sample's phase times (from its spans) join the trajectory's tags; lengths, policy versions and
  num_preempted go on the ``rl.sample`` span.
- ``PPOTrainer.step``: the ``rl.step`` span. ``PPOTrainer._compute_metrics``: verl's ``agent_loop/*`` keys
  and ours, from the tags of exactly the trajectories the step trained, into the logged metrics.
  ``PPOTrainer._validate`` (with ``ReplayBuffer.sample``): the same for validation, under ``val-aux/``.
"""

from __future__ import annotations

import contextvars
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, cast

import numpy as np
from opentelemetry.trace import Link, SpanContext, TraceFlags

from ... import semconv as sc
from ...core import _context
from ...core._guard import internal_error
from ...core._lifecycle import finish, open_span
from ...core._scope import span_of
from ...core._tracer import current_tracer
from ...metrics._table import PhaseTable, StepMetrics, compute_metrics
from ...setup import current_handle, write_step_summary
from .._patching import Args, AsyncOriginal, Kwargs, Original
from . import _patching as patching
from ._agent_loop import (
    CARRIER_KEY,
    PENDING,
    POSITION_KEY,
    _remote,
    open_rows,
    run_agent_loop,
)
from ._identity import arrival_index, release_stale
from ._objects import TaggedBatch, Trainer
from ._phases import compute_score
from ._rows import TAG, identity_int, read_identity, row_tags, table_from_tags

AGENT_LOOP_TQ = "verl.trainer.ppo.v1.agent_loop_tq"
TRAINER_BASE = "verl.trainer.ppo.v1.trainer_base"
REPLAY_BUFFER = "verl.trainer.ppo.v1.replay_buffer"
VAL_PREFIX = "val-aux/"
_WORKER = "AgentLoopWorkerTQ.__ray_metadata__.modified_class"
_VAL_TAGS: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("otel_agentloop_val_tags", default=None)
MAX_LINKS = 128


def apply_agent_loop_tq(module: ModuleType) -> None:
    patching.patch(module, "AgentLoopManagerTQ", "generate_sequences", _manager_generate_sequences)
    patching.patch(module, _WORKER, "_run_prompt", _run_prompt)
    patching.patch(module, _WORKER, "_run_agent_loop", run_agent_loop)  # skipped when Ray copied ours already
    patching.patch(module, _WORKER, "_compute_score", compute_score)
    patching.patch(sys.modules[module.tq.__name__], "", "async_kv_batch_put", _tq_batch_put)


def apply_trainer_base(module: ModuleType) -> None:
    patching.patch(module, "PPOTrainer", "step", _trainer_step)
    patching.patch(module, "PPOTrainer", "_compute_metrics", _compute_metrics)
    patching.patch(module, "PPOTrainer", "_validate", _validate)


def apply_replay_buffer(module: ModuleType) -> None:
    for name in ("ReplayBuffer", "ReplayBufferAsync"):
        cls = getattr(module, name, None)
        if cls is not None and "sample" in vars(cls):
            patching.patch(module, name, "sample", _replay_sample)


# -- dispatch (the process that creates the actors) ----------------------------------------------------
def _manager_generate_sequences(original: Original, args: Args, kwargs: Kwargs) -> object:
    prompts: Any = args[1] if len(args) > 1 else kwargs.get("prompts")
    added = False
    try:
        import torch  # pyright: ignore[reportMissingImports]  # verl's own dependency, present when it runs
        from verl.utils import tensordict_utils as tu  # pyright: ignore[reportMissingImports]

        from ..ray import carrier

        step = int(_value(prompts["global_steps"])) if "global_steps" in prompts else -1
        validate = bool(_value(prompts["validate"])) if "validate" in prompts else False
        current = _context.current_step()
        scope = _context.step(step, validate) if current is None or current.validate != validate else None
    except Exception:
        internal_error("verl.v1.dispatch")
        return original(*args, **kwargs)
    if scope is not None:
        scope.__enter__()
    try:
        try:
            tu.assign_non_tensor_data(prompts, CARRIER_KEY, carrier())
            first = _next_positions(step, validate, len(prompts))
            prompts[POSITION_KEY] = torch.arange(first, first + len(prompts), dtype=torch.int64)
            added = True
        except Exception:
            internal_error("verl.v1.dispatch.carrier")
        return original(*args, **kwargs)
    finally:
        if added:
            for key in (CARRIER_KEY, POSITION_KEY):
                try:
                    prompts.pop(key, None)
                except Exception:
                    internal_error("verl.v1.dispatch.pop")
        if scope is not None:
            scope.__exit__(None, None, None)


_dispatched: dict[tuple[int, bool], int] = {}


def _next_positions(step: int, validate: bool, count: int, keep: int = 16) -> int:
    """The first position of a dispatch of ``count`` prompts: positions are unique per (step, validate) even
    when a step dispatches several batches (async warmup, refills)."""
    with patching.lock:
        first = _dispatched.get((step, validate), 0)
        if first == 0:
            for old in [k for k in _dispatched if k[1] == validate and k[0] < step - keep]:
                del _dispatched[old]
        _dispatched[(step, validate)] = first + count
        return first


def _value(v: Any) -> Any:
    data = getattr(v, "data", v)
    try:
        return data.item()
    except Exception:
        return data


# -- the worker actor -------------------------------------------------------------------------------------
async def _run_prompt(original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    """The group span: a new trace per prompt (linked to the dispatching step), its sessions as children."""
    try:
        # identity values that cannot be read are left out (warned once), never the span (see read_identity)
        # Any: verl's worker (its OmegaConf config has dynamic attributes), the prompt row and the trajectory dict
        self: Any = args[0]
        prompt: Any = args[1]
        trajectory: Any = args[3] if len(args) > 3 else kwargs["trajectory"]
        carrier = prompt.get(CARRIER_KEY)
        read_step = read_identity("trajectory step", trajectory.get("step"))
        validate = bool(trajectory.get("validate"))
        position = identity_int(prompt.get(POSITION_KEY))
        uid = str(prompt.get("uid", ""))
        attrs: dict[str, Any] = {sc.RL_VALIDATE: validate, sc.RL_SAMPLE_UID: uid}
        dataset_index = read_identity("sample_index", trajectory.get("sample_index"))
        if dataset_index is not None:
            attrs[sc.RL_SAMPLE_DATASET_INDEX] = dataset_index
        config = self.config.actor_rollout_ref.rollout
        n = identity_int(prompt.get("__rollout_n__", config.n if not validate else config.val_kwargs.n))
        if n is not None:
            attrs[sc.RL_GROUP_SIZE] = n
    except Exception:
        internal_error("verl.v1._run_prompt.identity")
        return await original(*args, **kwargs)
    with _remote(carrier):
        tracer = current_tracer()
        if tracer is None:
            return await original(*args, **kwargs)
        scope = None
        step_token = None
        try:
            outer = _context.current_step()
            step = read_step if read_step is not None else outer.step if outer is not None else -1  # the dispatch's
            attrs[sc.RL_STEP] = step
            attrs[sc.RL_SAMPLE_INDEX] = position if position is not None else arrival_index(step, validate, uid)
            release_stale(step, validate)
            parent, links = _context.root_context(outer)
            scope = open_span(tracer, sc.GROUP_SPAN, attrs, context=parent, links=links)
            if scope is not None:
                state_ = _context.StepState(step, validate, "step", span_of(scope))
                step_token = _context.enter_step_state(state_)
        except Exception:
            internal_error("verl.v1._run_prompt.start")
        error: BaseException | None = None
        try:
            return await original(*args, **kwargs)
        except BaseException as exc:
            error = exc
            raise
        finally:
            try:
                if step_token is not None:
                    _context.leave_step_state(step_token)
                if scope is not None:
                    finish(scope, error)
            except Exception:
                internal_error("verl.v1._run_prompt.end")


async def _tq_batch_put(original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    pending = PENDING.get()
    if pending is not None:
        PENDING.set(None)
        try:
            _tag_trajectory(pending, cast("Sequence[dict[str, Any]] | None", kwargs.get("tags")))
        except Exception:
            internal_error("verl.v1.tq_put")
    return await original(*args, **kwargs)


def _tag_trajectory(pending: Any, tags: Sequence[dict[str, Any]] | None) -> None:
    rows = open_rows()
    values = rows.peek(pending.key) if rows is not None else None
    if values is None or not tags:
        return
    step, _, index, rollout = pending.key
    handle = pending.handle
    span_ctx = handle.span.get_span_context() if handle.span is not None else None
    start_ns = getattr(handle.span, "start_time", None) if handle.span is not None else None
    extra = row_tags(
        values,
        index=index,
        rollout_n=rollout,
        uid=pending.uid,
        step=step,
        trace_id=handle.trace_id,
        start_ns=start_ns if isinstance(start_ns, int) else None,
    )
    if span_ctx is not None:
        extra[TAG + "span_id"] = format(span_ctx.span_id, "016x")
    for tag in tags:
        if isinstance(tag, dict):
            tag.update(extra)
    last = tags[-1]
    handle.record(
        prompt_length=last.get("prompt_len"),
        response_length=last.get("response_len"),
        num_preempted=int(values["num_preempted"]),
    )
    if handle.span is not None:
        for key, attr in (
            ("min_global_steps", sc.RL_POLICY_VERSION_MIN),
            ("max_global_steps", sc.RL_POLICY_VERSION_MAX),
        ):
            version = last.get(key)
            if version is not None:
                handle.span.set_attribute(attr, int(version))


# -- the trainer ------------------------------------------------------------------------------------------
def _trainer_step(original: Original, args: Args, kwargs: Kwargs) -> object:
    try:
        scope = _context.step(int(cast(Trainer, args[0]).global_steps))
    except Exception:
        internal_error("verl.v1.step")
        return original(*args, **kwargs)
    with scope:
        return original(*args, **kwargs)


def _compute_metrics(original: Original, args: Args, kwargs: Kwargs) -> object:
    result = original(*args, **kwargs)
    try:
        names = ("batch", "metrics", "timing_raw", "global_steps", "epoch")
        bound = dict(zip(names, args[1:], strict=False))
        bound.update({k: v for k, v in kwargs.items() if k in names})
        metrics = cast("dict[str, float]", bound["metrics"])
        batch = cast(TaggedBatch, bound["batch"])
        consumed = int(cast(int, bound.get("global_steps", getattr(args[0], "global_steps", -1))))
        ours, table, staleness = _step_results(batch.tags, consumed_step=consumed, emit=True)
        for key, value in ours.items():
            metrics.setdefault(key, value)  # verl's own values are never replaced
        write_summary(table, metrics, consumed, False, staleness=staleness)
    except Exception:
        internal_error("verl.v1._compute_metrics")
    return result


def _validate(original: Original, args: Args, kwargs: Kwargs) -> object:
    collected: list[Any] = []
    token = _VAL_TAGS.set(collected)
    try:
        scope = _context.step(int(cast(Trainer, args[0]).global_steps), validate=True)
    except Exception:
        scope = None
    try:
        if scope is None:
            result = original(*args, **kwargs)
        else:
            with scope:
                result = original(*args, **kwargs)
    finally:
        _VAL_TAGS.reset(token)
    try:
        if collected and isinstance(result, dict):
            ours, table, _ = _step_results(collected, emit=False)
            for key, value in ours.items():
                result.setdefault(VAL_PREFIX + key, value)
            write_summary(table, result, int(cast(Trainer, args[0]).global_steps), True, prefix=VAL_PREFIX)
    except Exception:
        internal_error("verl.v1._validate")
    return result


def _replay_sample(original: Callable[..., Sequence[TaggedBatch]], args: Args, kwargs: Kwargs) -> object:
    result = original(*args, **kwargs)
    collected = _VAL_TAGS.get()
    if collected is not None:
        try:
            partition = kwargs.get("partition_id", args[2] if len(args) > 2 else None)
            if partition == "val":
                collected.extend(result[0].tags)
        except Exception:
            internal_error("verl.v1.replay_sample")
    return result


def step_metrics(
    tags: Sequence[Mapping[str, Any]], *, consumed_step: int | None = None, emit: bool = True
) -> dict[str, float]:
    """verl's ``agent_loop/*`` keys and ours for the trajectories whose tags are given (one trained step)."""
    return _step_results(tags, consumed_step=consumed_step, emit=emit)[0]


def _step_results(
    tags: Sequence[Mapping[str, Any]], *, consumed_step: int | None = None, emit: bool = True
) -> tuple[dict[str, float], PhaseTable, Any]:
    """:func:`step_metrics`, with the table it was computed from and the per-sample staleness (or ``None``)."""
    table, rows = table_from_tags(tags)
    staleness = None
    out: dict[str, float] = dict(compute_metrics(table))
    prefix = sc.METRIC_PREFIX
    if len(table):
        out.update(_group_metrics(table, rows))
        if consumed_step is not None:
            dispatched = np.array(
                [r.get("global_steps", r.get(TAG + "step", consumed_step)) for r in rows], dtype=np.float64
            )
            staleness = consumed_step - dispatched
            out[f"{prefix}/staleness/mean"] = float(staleness.mean())
            out[f"{prefix}/staleness/max"] = float(staleness.max())
            if emit:
                _consume_span(rows, consumed_step, staleness)
    handle = current_handle()
    if handle is not None:
        try:
            for name, value in handle.export_counters().items():
                out[f"{prefix}/telemetry/{name}"] = float(value)
        except Exception:
            internal_error("verl.v1.telemetry")
    return out, table, staleness


def write_summary(
    table: PhaseTable,
    logged: Mapping[str, Any],
    step: int | None,
    validate: bool,
    *,
    staleness: Any = None,
    prefix: str = "",
) -> None:
    """The step's ``rl.step.summary``: its metrics are the ``<prefix>agent_loop/*`` keys verl logs (``logged``,
    verl's own values where verl computed the key), the prefix removed."""
    try:
        head = prefix + sc.METRIC_PREFIX + "/"
        metrics = StepMetrics({k[len(prefix) :]: float(v) for k, v in logged.items() if k.startswith(head)})
    except Exception:
        internal_error("verl.v1.summary")
        return
    write_step_summary(table, metrics, step, validate, staleness=staleness)


def _group_metrics(table: PhaseTable, rows: list[Mapping[str, Any]]) -> dict[str, float]:
    """Group stragglers: a prompt's group completes with its slowest session (verl's total: generation +
    tools + reward); spread = slowest - fastest session of the group."""
    total = table.total
    groups: dict[tuple[Any, Any], list[float]] = {}
    for row, value in zip(rows, total, strict=True):
        groups.setdefault((row.get(TAG + "uid"), row.get(TAG + "step")), []).append(float(value))
    completion = np.array([max(v) for v in groups.values()])
    spread = np.array([max(v) - min(v) for v in groups.values()])
    prefix = f"{sc.METRIC_PREFIX}/group"
    return {
        f"{prefix}/completion_time/mean": float(completion.mean()),
        f"{prefix}/completion_time/p90": float(np.percentile(completion, 90)),
        f"{prefix}/completion_time/max": float(completion.max()),
        f"{prefix}/spread/mean": float(spread.mean()),
        f"{prefix}/num_groups": float(len(groups)),
    }


def _consume_span(rows: list[Mapping[str, Any]], consumed_step: int, staleness: Any) -> None:
    """``rl.consume``: the trained step's batch, linked to (up to ``MAX_LINKS``) sample spans it trained, each
    link with the sample's dispatch step and staleness."""
    tracer = current_tracer()
    if tracer is None:
        return
    links = []
    for row, stale in zip(rows[:MAX_LINKS], staleness[:MAX_LINKS], strict=False):
        try:
            ctx = SpanContext(
                int(row[TAG + "trace_id"], 16),
                int(row[TAG + "span_id"], 16),
                is_remote=True,
                trace_flags=TraceFlags(TraceFlags.SAMPLED),
            )
        except Exception:
            continue
        links.append(Link(ctx, {sc.RL_STEP: int(row.get(TAG + "step", -1)), sc.RL_STALENESS: float(stale)}))
    attrs = {
        sc.RL_CONSUMED_STEP: consumed_step,
        sc.RL_CONSUME_NUM_SAMPLES: len(rows),
        sc.RL_STALENESS_MAX: float(staleness.max()),
    }
    tracer.start_span(sc.CONSUME_SPAN, attributes=attrs, links=links).end()
