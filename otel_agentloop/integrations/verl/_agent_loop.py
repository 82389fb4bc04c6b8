"""Patches of verl's agent loop shared by every trainer (legacy, V1, fully-async): phase spans, the sample.

Each ``apply_*`` patches one verl module (called at import or at once); each wrapper has the
``impl(original, args, kwargs)`` shape of :func:`._patching.patch`, with ``self`` in ``args``.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import itertools
from collections.abc import Callable, Generator, Mapping
from typing import Any

from ... import semconv as sc
from ...core import _context
from ...core._guard import internal_error
from ...core._lifecycle import finish
from ...core._phase import PhaseSpec, start
from ...core._scope import OpenSpan, span_of
from ...metrics._table import PhaseTable, StepMetrics, compute_metrics
from ...metrics._verdicts import apply_verdicts
from ...setup import current_handle, write_step_summary
from . import _engine_path
from . import _patching as patching
from ._rows import OpenSampleRows, identity_int, read_identity

AGENT_LOOP = "verl.experimental.agent_loop.agent_loop"
TOOL_LOOP = "verl.experimental.agent_loop.tool_agent_loop"
SINGLE_TURN_LOOP = "verl.experimental.agent_loop.single_turn_agent_loop"
LLM_SERVER = "verl.workers.rollout.llm_server"
TABLE_KEY = "otel_agentloop_table"
VERDICT_KEY = "otel_agentloop_verdict"
META_KEY = "otel_agentloop"
CARRIER_KEY = "otel_agentloop_carrier"
POSITION_KEY = "otel_agentloop_position"


class Pending:
    """The open V1 sample whose TransferQueue put is coming (see ``_v1.tq_batch_put``)."""

    __slots__ = ("handle", "key", "uid")

    def __init__(self, handle: _context.SampleHandle, key: tuple[Any, ...], uid: str) -> None:
        self.handle, self.key, self.uid = handle, key, uid


PENDING: contextvars.ContextVar[Pending | None] = contextvars.ContextVar("otel_agentloop_verl_pending", default=None)
_rows_by_provider: dict[int, OpenSampleRows] = {}
FULLY_ASYNC_KEY = "otel_agentloop_fully_async"
ROW_COLUMN = "otel_agentloop_row"
_CALL_ROWS: contextvars.ContextVar[dict[tuple[int, int], dict[str, Any]] | None] = contextvars.ContextVar(
    "otel_agentloop_call_rows", default=None
)
"""fully_async_policy: this worker call's per-trajectory rows, by verl's (sample_index, rollout_n)."""


def open_rows() -> OpenSampleRows | None:
    """This process's :class:`OpenSampleRows`, added once to the configured provider (``None`` when off)."""
    handle = current_handle()
    provider = getattr(handle, "provider", None) if handle is not None and handle.enabled else None
    if provider is None:
        return None
    rows = _rows_by_provider.get(id(provider))
    if rows is None:
        with patching.lock:
            rows = _rows_by_provider.get(id(provider))
            if rows is None:
                pipeline = getattr(provider, "pipeline", None)
                rows = OpenSampleRows(drain=pipeline.drain if pipeline is not None else None)
                provider.add_span_processor(rows)
                _rows_by_provider[id(provider)] = rows
    return rows


# -- module patches ---------------------------------------------------------------------------------
def apply_agent_loop(module: Any) -> None:
    patching.replace(module, "AgentLoopManager", "generate_sequences", _manager_generate_sequences(module))
    patching.patch(module, "AgentLoopManager", "_performance_metrics", _performance_metrics)
    patching.patch(module, "AgentLoopWorker", "generate_sequences", _worker_generate_sequences)
    patching.patch(module, "AgentLoopWorker", "_run_agent_loop", run_agent_loop)
    patching.patch(module, "AgentLoopWorker", "_compute_score", _compute_score)
    patching.replace(module, "", "simple_timer", _traced_timer(vars(module)["simple_timer"]))


def apply_tool_loop(module: Any) -> None:
    patching.patch(module, "ToolAgentLoop", "_call_tool", _call_tool)
    patching.replace(module, "", "simple_timer", _traced_timer(vars(module)["simple_timer"]))


def apply_single_turn_loop(module: Any) -> None:
    patching.replace(module, "", "simple_timer", _traced_timer(vars(module)["simple_timer"]))


def apply_llm_server(module: Any) -> None:
    for name in ("LLMServerClient", "FullyAsyncLLMServerClient"):
        cls = getattr(module, name, None)
        if cls is not None and "generate" in vars(cls):
            patching.patch(module, name, "generate", _generate)
    _engine_path.apply_llm_server(module)  # the turn's context to the engine (issue 28)


# -- the legacy manager (driver) ----------------------------------------------------------------------
def _manager_generate_sequences(agent_loop: Any) -> Any:
    """verl's ``auto_await`` inspects its caller, so it must stay outermost: wrap the function beneath it."""
    original = vars(agent_loop.AgentLoopManager)["generate_sequences"]
    inner = getattr(original, "__wrapped__", original)

    async def generate_sequences(self: Any, prompts: Any, *args: Any, **kwargs: Any) -> Any:
        if not patching.state.active:
            return await inner(self, prompts, *args, **kwargs)
        meta = prompts.meta_info
        step = meta.get("global_steps", -1)
        validate = bool(meta.get("validate", False))
        from ..ray import carrier

        with _context.step(int(step), validate=validate):
            meta[CARRIER_KEY] = carrier()
            try:
                output = await inner(self, prompts, *args, **kwargs)
            finally:
                meta.pop(CARRIER_KEY, None)
        try:
            output.meta_info.pop(CARRIER_KEY, None)
            extra = getattr(self, "_otel_agentloop_last", None)
            if extra is not None:
                output.meta_info[META_KEY] = extra
        except Exception:
            internal_error("verl.generate_sequences.meta")
        return output

    generate_sequences.__wrapped__ = original  # type: ignore[attr-defined]
    return agent_loop.auto_await(generate_sequences)


def _performance_metrics(original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # (self, metrics, output): self may be None when verl's formula is called through the class
    instance = args[0] if args else None
    metrics = kwargs.get("metrics", args[1] if len(args) > 1 else None)
    tables = []
    try:
        for chunk in metrics or ():
            for row in chunk:
                table = row.pop(TABLE_KEY, None) if isinstance(row, dict) else None
                if table is not None:
                    tables.append(table)
    except Exception:
        internal_error("verl._performance_metrics.tables")
    verdicts = []
    try:
        for chunk in metrics or ():
            for row in chunk:
                verdict = row.pop(VERDICT_KEY, None) if isinstance(row, dict) else None
                if verdict is not None:
                    verdicts.append(verdict)
    except Exception:
        internal_error("verl._performance_metrics.verdicts")
    timing = original(*args, **kwargs)
    if tables:
        try:
            table = PhaseTable.concat(tables)
            ours = compute_metrics(table)
            apply_verdicts(ours, verdicts)
            for key, value in ours.items():
                timing.setdefault(key, value)  # verl's own values are never replaced
            extra = {"slowest_trace_id": ours.slowest_trace_id, "slowest_sample": ours.slowest_sample}
            if instance is not None:
                instance._otel_agentloop_last = extra
            _write_summary(table, ours, timing)
        except Exception:
            internal_error("verl._performance_metrics.ours")
    return timing


def _write_summary(table: PhaseTable, ours: StepMetrics, timing: Mapping[str, Any]) -> None:
    """The step's ``rl.step.summary``: its metrics are the ``agent_loop/*`` keys verl logs (``timing``), with
    the watchdog's verdicts of ``ours``; the step is the one the workers' tables were taken for."""
    logged = StepMetrics({k: float(v) for k, v in timing.items() if k.startswith(sc.METRIC_PREFIX + "/")})
    logged.hung_samples, logged.slow_samples = ours.hung_samples, ours.slow_samples
    key = table.step_key
    if key is None:
        current = _context.current_step()
        key = (current.step, current.validate) if current is not None else (None, False)
    write_step_summary(table, logged, key[0], key[1])


# -- the worker (actor) ---------------------------------------------------------------------------------
async def _worker_generate_sequences(original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    batch = args[1] if len(args) > 1 else kwargs.get("batch")
    meta = getattr(batch, "meta_info", {}) or {}
    carrier = meta.pop(CARRIER_KEY, None)
    step = meta.get("global_steps", -1)
    validate = bool(meta.get("validate", False))
    from ..ray import remote_step

    if meta.pop(FULLY_ASYNC_KEY, False):
        return await _fully_async_call(original, args, kwargs, batch)
    with remote_step(carrier):
        output = await original(*args, **kwargs)
    try:
        handle = current_handle()
        rows = output.meta_info.get("metrics")
        if handle is not None and rows:
            handle.force_flush(5.0)
            rows[0][TABLE_KEY] = handle.metrics.take(int(step), validate)
            if handle.live is not None:  # the watchdog's verdict, classified at that take
                rows[0][VERDICT_KEY] = handle.live.verdict(int(step), validate)
    except Exception:
        internal_error("verl.worker.generate_sequences.table")
    return output


async def _fully_async_call(original: Any, args: tuple[Any, ...], kwargs: dict[str, Any], batch: Any) -> Any:
    """fully_async_policy: one prompt x n per call, many calls of one step in flight on this worker: each
    trajectory's row (from its spans) rides back in a non-tensor column, aligned with the output rows (verl's
    ``addition_process`` drops anything else); the trainer-side patch pops it."""
    collected: dict[tuple[int, int], dict[str, Any]] = {}
    token = _CALL_ROWS.set(collected)
    try:
        output = await original(*args, **kwargs)
    finally:
        _CALL_ROWS.reset(token)
    try:
        index = batch.non_tensor_batch["index"] if "index" in batch.non_tensor_batch else range(len(batch))
        column = []
        rollout = 0
        for i, value in enumerate(index):
            rollout = rollout + 1 if i > 0 and index[i - 1] == value else 0  # verl's get_trajectory_info
            column.append(collected.get((as_int(value), rollout)))
        if len(column) == len(output) and all(row is not None for row in column):
            import numpy as np

            array = np.empty(len(column), dtype=object)
            array[:] = column
            output.non_tensor_batch[ROW_COLUMN] = array
    except Exception:
        internal_error("verl.fully_async.rows")
    return output


async def run_agent_loop(original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The sample span. Legacy: identity from ``trajectory``. V1 (a ``session_id`` keyword): rollout = the
    session, index = the prompt's position in its dispatch batch (the dataset index is not unique), uid and
    dataset index as attributes; the carrier and position keywords are removed before verl sees them."""
    carrier = kwargs.pop(CARRIER_KEY, None)
    position = kwargs.pop(POSITION_KEY, None)
    try:
        # identity values that cannot be read are left out (warned once), never the span (see read_identity)
        trajectory = args[2] if len(args) > 2 else kwargs["trajectory"]
        step = read_identity("trajectory step", _field(trajectory, "step"))
        validate = bool(_field(trajectory, "validate"))
        attrs: dict[str, Any] = {}
        agent = kwargs.get("agent_name")
        if agent:
            attrs[sc.RL_AGENT_NAME] = str(agent)
        v1 = "session_id" in kwargs
        call_rows = None
        verl_key: tuple[int, int] | None = None
        if v1:
            rollout = read_identity("session_id", kwargs["session_id"])
            dataset_index = read_identity("sample_index", _field(trajectory, "sample_index"))
            uid = str(kwargs.get("uid", ""))
            index = identity_int(position) if position is not None else None
            if index is None:
                index = arrival_index(-1 if step is None else step, validate, uid)
            attrs[sc.RL_SAMPLE_UID] = uid
            if dataset_index is not None:
                attrs[sc.RL_SAMPLE_DATASET_INDEX] = dataset_index
        else:
            uid = ""
            read = read_identity("sample_index", _field(trajectory, "sample_index"))
            rollout = read_identity("rollout_n", _field(trajectory, "rollout_n"))
            index = read if read is not None else arrival_index(-1 if step is None else step, validate, _unique())
            call_rows = _CALL_ROWS.get()
            if call_rows is not None:  # fully-async: the dataset index is not unique among in-flight prompts
                verl_key = (index, rollout) if rollout is not None else None  # how verl's output rows are keyed
                uid = str(kwargs.get("uid", ""))
                attrs[sc.RL_SAMPLE_UID] = uid
                attrs[sc.RL_SAMPLE_DATASET_INDEX] = index
                index = arrival_index(-1 if step is None else step, validate, uid)
    except Exception:
        internal_error("verl._run_agent_loop.trajectory")
        return await original(*args, **kwargs)
    with _remote(carrier):
        async with _context.sample(index, rollout, step=step, validate=validate, attributes=attrs) as handle:
            step = handle.step  # the enclosing (dispatching) step's when verl's could not be read
            if (v1 or call_rows is not None) and step is not None:
                release_stale(step, validate)
            token = None
            rows = None
            key = (step, validate, index, rollout)
            if (v1 or call_rows is not None) and handle.span is not None:
                rows = open_rows()
                if rows is not None:
                    rows.open(key)
                if v1:
                    token = PENDING.set(Pending(handle, key, uid))
            values = None
            try:
                output = await original(*args, **kwargs)
            finally:
                if token is not None:
                    PENDING.reset(token)
                if rows is not None:
                    values = rows.close(key)
            if output is not None:  # V1 returns None: its facts were recorded at the TransferQueue put
                try:
                    _record_sample(handle, output)
                    if call_rows is not None and values is not None and verl_key is not None and step is not None:
                        call_rows[verl_key] = _call_row(handle, output, values, index, verl_key[1], uid, step)
                except Exception:
                    internal_error("verl._run_agent_loop.record")
            return output


_arrivals: dict[tuple[int, bool], dict[str, int]] = {}


def arrival_index(step: int, validate: bool, uid: str, keep: int = 8) -> int:
    """V1 without the dispatching process's position (it was not instrumented): the order in which this worker
    received the prompt in its step. verl's dataset index is not unique, and the index keys a sample's row."""
    with patching.lock:
        seen = _arrivals.get((step, validate))
        if seen is None:
            seen = _arrivals[(step, validate)] = {}
            for old in [k for k in _arrivals if k[1] == validate and k[0] < step - keep]:
                del _arrivals[old]
        return seen.setdefault(uid, len(seen))


_released_before: dict[bool, int] = {}


def release_stale(step: int, validate: bool, keep: int = 4) -> None:
    """Nobody collects the worker's per-step tables in V1 and fully-async (the trainer gets per-trajectory rows):
    release steps more than ``keep`` behind the newest dispatch, so they are not evicted with a warning."""
    if _released_before.get(validate, -1) >= step - keep:
        return
    _released_before[validate] = step - keep
    handle = current_handle()
    if handle is None:
        return
    try:
        for old, old_validate in handle.metrics.open_steps():
            if old_validate == validate and isinstance(old, int) and old < step - keep:
                handle.metrics.take(old, old_validate)
    except Exception:
        internal_error("verl.v1.release_stale")


def as_int(value: Any) -> int:
    """verl's identity value as an int (see :func:`._rows.identity_int`); raises ``ValueError`` when it is not one."""
    number = identity_int(value)
    if number is None:
        raise ValueError(f"not an int identity: a {type(value).__qualname__}")
    return number


def _field(trajectory: Any, key: str) -> Any:
    """``trajectory[key]``, ``None`` when missing."""
    try:
        return trajectory[key]
    except Exception:
        return None


_unique_ids = itertools.count()


def _unique() -> str:
    """A key that :func:`arrival_index` never saw: the sample's own arrival number."""
    return f"#{next(_unique_ids)}"


@contextlib.contextmanager
def _remote(carrier: Any) -> Generator[None, None, None]:
    """Re-enter the dispatching step from ``carrier`` unless a step (or group) is already current."""
    if not carrier or _context.current_step() is not None:
        yield
        return
    from ..ray import remote_step

    with remote_step(carrier, worker_span=False):
        yield


def _call_row(
    handle: _context.SampleHandle, output: Any, values: dict[str, Any], index: int, rollout: int, uid: str, step: int
) -> dict[str, Any]:
    from ._rows import row_tags

    start_ns = getattr(handle.span, "start_time", None) if handle.span is not None else None
    row = row_tags(
        values,
        index=index,
        rollout_n=rollout,
        uid=uid,
        step=step,
        trace_id=handle.trace_id,
        start_ns=start_ns if isinstance(start_ns, int) else None,
    )
    width = int(output.prompt_ids.shape[-1])
    mask = output.attention_mask[0]
    row["prompt_len"], row["response_len"] = int(mask[:width].sum()), int(mask[width:].sum())
    return row


def _record_sample(handle: _context.SampleHandle, output: Any) -> None:
    """Legacy output: lengths as verl's manager computes them (attention mask over the padded prompt /
    response), verl's num_preempted, and the reward."""
    width = int(output.prompt_ids.shape[-1])
    mask = output.attention_mask[0]
    handle.record(
        prompt_length=int(mask[:width].sum()),
        response_length=int(mask[width:].sum()),
        num_preempted=int(output.metrics.num_preempted),
        reward=output.reward_score,
    )


_TOOL_CALLS = PhaseSpec(sc.TOOL_CALLS, sc.TOOL_CALLS_SPAN, {sc.RL_PHASE: sc.TOOL_CALLS})
_GENERATE_TURN = PhaseSpec.build(sc.GENERATE)
_TURN: contextvars.ContextVar[Any] = contextvars.ContextVar("otel_agentloop_turn_span", default=None)


def _traced_timer(original: Callable[..., Any]) -> Callable[..., Any]:
    """verl's ``simple_timer`` with our phase span on verl's own measurement: the span starts just inside verl's
    timer and gets verl's measured duration (what verl adds to ``timing_raw``), so spans and verl's
    AgentLoopMetrics agree exactly, whatever the GIL does between the two clocks. ``tool_calls``: the
    ``rl.tool_calls`` span (around the turn's ``asyncio.gather``); ``generate_sequences``: the turn's generation
    span (the client call names it and fills in its GenAI facts); ``compute_score``: the duration is handed to
    the enclosing ``rl.reward`` span."""

    @contextlib.contextmanager
    def simple_timer(name: str, timing_raw: Any) -> Generator[None, None, None]:
        if not patching.state.active or name not in _TIMED:
            with original(name, timing_raw):
                yield
            return
        before = _timed(timing_raw, name)
        started = token = None
        error: BaseException | None = None
        try:
            with original(name, timing_raw):
                if name != sc.COMPUTE_SCORE:
                    started = start(_TOOL_CALLS if name == sc.TOOL_CALLS else _GENERATE_TURN)
                    if started is not None and name == sc.GENERATE:
                        token = _TURN.set(span_of(started))
                try:
                    yield
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    if token is not None:
                        _TURN.reset(token)
        finally:
            elapsed = _timed(timing_raw, name) - before  # 0 when verl recorded nothing (an exception)
            if name == sc.COMPUTE_SCORE:
                holder = _SCORE_TIMER.get()
                if holder is not None and elapsed > 0:
                    holder.append(elapsed)
            elif started is not None:
                end_span(started, error, elapsed)

    simple_timer.__wrapped__ = original  # type: ignore[attr-defined]
    return simple_timer


_TIMED = (sc.GENERATE, sc.TOOL_CALLS, sc.COMPUTE_SCORE)
_SCORE_TIMER: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar(
    "otel_agentloop_score_timer", default=None
)


def _timed(timing_raw: Any, name: str) -> float:
    try:
        return float(timing_raw.get(name, 0.0))
    except Exception:
        return 0.0


def end_span(started: OpenSpan, error: BaseException | None, elapsed: float) -> None:
    """End ``started`` lasting ``elapsed`` seconds as verl measured it (now, when verl measured nothing)."""
    if elapsed <= 0 or error is not None:
        finish(started, error)
        return
    end_time = None
    try:
        begin = getattr(span_of(started), "start_time", None)
        end_time = begin + int(elapsed * 1e9) if begin else None
    except Exception:
        internal_error("verl.timer.end")
    finish(started, None, end_time)  # through the lifecycle: the in-flight registry forgets the phase


def _spec(cache: dict[str, PhaseSpec], key: str, build: Callable[[], PhaseSpec]) -> PhaseSpec:
    spec = cache.get(key)
    if spec is None:
        spec = cache[key] = build()
    return spec


_generate_specs: dict[str, PhaseSpec] = {}
_tool_specs: dict[str, PhaseSpec] = {}
_REWARD = PhaseSpec.build(sc.COMPUTE_SCORE)


async def _awaited(started: OpenSpan | None, original: Any, args: Any, kwargs: Any) -> Any:
    """Await the original coroutine; if it raises, end ``started`` with the error and re-raise it unchanged."""
    try:
        return await original(*args, **kwargs)
    except BaseException as exc:
        if started is not None:
            finish(started, exc)
        raise


_IN_GENERATE: contextvars.ContextVar[bool] = contextvars.ContextVar("otel_agentloop_in_generate", default=False)


async def _generate(original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """One generation span per turn: ``FullyAsyncLLMServerClient.generate`` (resuming aborted requests) calls
    the base client's, which then adds no span of its own."""
    if _IN_GENERATE.get():
        return await original(*args, **kwargs)
    token = _IN_GENERATE.set(True)
    try:
        return await _generate_span(original, args, kwargs)
    finally:
        _IN_GENERATE.reset(token)


async def _generate_span(original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    config = getattr(args[0], "config", None) if args else None
    try:
        model = str(config.actor_rollout_ref.model.get("path", "")) if config is not None else ""
    except Exception:
        model = ""
    spec = _spec(_generate_specs, model, lambda: PhaseSpec.build(sc.GENERATE, model=model.rsplit("/", 1)[-1] or None))
    try:
        provider = str(config.actor_rollout_ref.rollout.name) if config is not None else None
    except Exception:
        provider = None
    turn = _TURN.get()
    if turn is not None:  # verl's generate_sequences timer opened this turn's span: name it and fill it in
        _TURN.set(None)
        try:
            turn.update_name(spec.name)
            for key, value in spec.attributes.items():
                turn.set_attribute(key, value)
            if provider:
                turn.set_attribute(sc.GEN_AI_PROVIDER_NAME, provider)
        except Exception:
            internal_error("verl.generate.name")
        output = await original(*args, **kwargs)
        _record_generation(turn, output, kwargs)
        return output
    started = start(spec, extra={sc.GEN_AI_PROVIDER_NAME: provider} if provider else None)
    output = await _awaited(started, original, args, kwargs)
    if started is None:
        return output
    _record_generation(span_of(started), output, kwargs)
    finish(started)
    return output


def _record_generation(span: Any, output: Any, kwargs: dict[str, Any]) -> None:
    try:
        prompt_ids = kwargs.get("prompt_ids")
        if prompt_ids is not None:
            span.set_attribute(sc.GEN_AI_USAGE_INPUT_TOKENS, len(prompt_ids))
        span.set_attribute(sc.GEN_AI_USAGE_OUTPUT_TOKENS, len(output.token_ids))
        if output.stop_reason is not None:
            span.set_attribute(sc.GEN_AI_RESPONSE_FINISH_REASONS, (str(output.stop_reason),))
        if output.num_preempted is not None:
            span.set_attribute(sc.RL_NUM_PREEMPTED, int(output.num_preempted))
        version = (output.extra_fields or {}).get("global_steps")
        if version is not None:
            span.set_attribute(sc.RL_POLICY_VERSION, int(version))
    except Exception:
        internal_error("verl.generate.record")


async def _call_tool(original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    tool_call = args[1] if len(args) > 1 else kwargs.get("tool_call")
    name = str(getattr(tool_call, "name", "") or "unknown")
    spec = _spec(_tool_specs, name, lambda: PhaseSpec.build(sc.TOOL_CALLS, tool=name))
    call_id = getattr(tool_call, "id", None)
    started = start(spec, extra={sc.GEN_AI_TOOL_CALL_ID: str(call_id)} if call_id else None)
    result = await _awaited(started, original, args, kwargs)
    if started is not None:
        finish(started)
    return result


async def _compute_score(original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    started = start(_REWARD)
    holder: list[float] = []
    token = _SCORE_TIMER.set(holder)
    try:
        result = await _awaited(started, original, args, kwargs)
    finally:
        _SCORE_TIMER.reset(token)
    if started is None:
        return result
    try:
        outputs = args[1] if len(args) > 1 else kwargs.get("outputs")
        score = outputs[-1].reward_score if outputs else None
        if score is not None:
            span_of(started).set_attribute(sc.RL_REWARD_SCORE, float(score))
            _context.record_sample(reward=score)
    except Exception:
        internal_error("verl._compute_score.record")
    end_span(started, None, sum(holder))  # verl's compute_score timer, when it ran (no reward handles: now)
    return result


def uninstrumented_performance_metrics(metrics: Any, output: Any) -> Any:
    """verl's own ``AgentLoopManager._performance_metrics`` (unpatched): the reference for parity checks."""
    agent_loop = importlib.import_module(AGENT_LOOP)
    method = vars(agent_loop.AgentLoopManager)["_performance_metrics"]
    while patching.is_ours(method):
        method = method.__wrapped__
    return method(None, metrics, output)
