"""Patches of verl's agent loop shared by every trainer (legacy, V1, fully-async): the legacy manager, the
worker's calls, the sample span (the phase spans: :mod:`._phases`; identity helpers: :mod:`._identity`).

Each ``apply_*`` patches one verl module (called at import or at once); each wrapper has the
``impl(original, args, kwargs)`` shape of :func:`._patching.patch`, with ``self`` in ``args``.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping
from types import ModuleType
from typing import Any, NamedTuple, cast

from ... import semconv as sc
from ...core import _context
from ...core._guard import internal_error
from ...metrics._table import PhaseTable, StepMetrics, compute_metrics
from ...metrics._verdicts import Verdict, apply_verdicts
from ...setup import current_handle, write_step_summary
from .._patching import Args, AsyncOriginal, Kwargs
from . import _engine_path
from . import _patching as patching
from ._identity import arrival_index, as_int, field_of, release_stale, unique_key
from ._objects import DataProto
from ._phases import call_tool, compute_score, generate, traced_timer
from ._rows import OpenSampleRows, identity_int, read_identity

AGENT_LOOP = "verl.experimental.agent_loop.agent_loop"
TOOL_LOOP = "verl.experimental.agent_loop.tool_agent_loop"
SINGLE_TURN_LOOP = "verl.experimental.agent_loop.single_turn_agent_loop"
LLM_SERVER = "verl.workers.rollout.llm_server"
TABLE_KEY = "otel_agentloop_table"
VERDICT_KEY = "otel_agentloop_verdict"
LAST_ATTR = "_otel_agentloop_last"
"""The manager's attribute holding its last step's slowest sample (for the output's ``meta_info``)."""
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
def apply_agent_loop(module: ModuleType) -> None:
    patching.replace(module, "AgentLoopManager", "generate_sequences", _manager_generate_sequences(module))
    patching.patch(module, "AgentLoopManager", "_performance_metrics", _performance_metrics)
    patching.patch(module, "AgentLoopWorker", "generate_sequences", _worker_generate_sequences)
    patching.patch(module, "AgentLoopWorker", "_run_agent_loop", run_agent_loop)
    patching.patch(module, "AgentLoopWorker", "_compute_score", compute_score)
    patching.replace(module, "", "simple_timer", traced_timer(vars(module)["simple_timer"]))


def apply_tool_loop(module: ModuleType) -> None:
    patching.patch(module, "ToolAgentLoop", "_call_tool", call_tool)
    patching.replace(module, "", "simple_timer", traced_timer(vars(module)["simple_timer"]))


def apply_single_turn_loop(module: ModuleType) -> None:
    patching.replace(module, "", "simple_timer", traced_timer(vars(module)["simple_timer"]))


def apply_llm_server(module: ModuleType) -> None:
    for name in ("LLMServerClient", "FullyAsyncLLMServerClient"):
        cls = getattr(module, name, None)
        if cls is not None and "generate" in vars(cls):
            patching.patch(module, name, "generate", generate)
    _engine_path.apply_llm_server(module)  # the turn's context to the engine (issue 28)


# -- the legacy manager (driver) ----------------------------------------------------------------------
def _manager_generate_sequences(agent_loop: Any) -> Any:
    """verl's ``auto_await`` inspects its caller, so it must stay outermost: wrap the function beneath it."""
    original = vars(agent_loop.AgentLoopManager)["generate_sequences"]
    inner = getattr(original, "__wrapped__", original)

    async def generate_sequences(self: object, prompts: DataProto, *args: object, **kwargs: object) -> object:
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
            extra = getattr(self, LAST_ATTR, None)
            if extra is not None:
                output.meta_info[META_KEY] = extra
        except Exception:
            internal_error("verl.generate_sequences.meta")
        return output

    generate_sequences.__wrapped__ = original  # type: ignore[attr-defined]
    return agent_loop.auto_await(generate_sequences)


def _performance_metrics(original: Callable[..., dict[str, float]], args: Args, kwargs: Kwargs) -> object:
    # (self, metrics, output): self may be None when verl's formula is called through the class
    instance = args[0] if args else None
    metrics = kwargs.get("metrics", args[1] if len(args) > 1 else None)
    tables: list[PhaseTable] = _popped(metrics, TABLE_KEY, "tables")
    verdicts: list[Verdict] = _popped(metrics, VERDICT_KEY, "verdicts")
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
                setattr(instance, LAST_ATTR, extra)
            _write_summary(table, ours, timing)
        except Exception:
            internal_error("verl._performance_metrics.ours")
    return timing


def _popped(metrics: object, key: str, what: str) -> list[Any]:
    """Each of verl's per-sample metric rows' ``key`` (a value our worker put there), popped. Any: each key's
    values are of one type, the caller's."""
    found = []
    try:
        for chunk in cast("Iterable[Iterable[object]]", metrics or ()):
            for row in chunk:
                value = row.pop(key, None) if isinstance(row, dict) else None
                if value is not None:
                    found.append(value)
    except Exception:
        internal_error(f"verl._performance_metrics.{what}")
    return found


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
async def _worker_generate_sequences(
    original: Callable[..., Awaitable[DataProto]], args: Args, kwargs: Kwargs
) -> object:
    batch = cast("DataProto | None", args[1] if len(args) > 1 else kwargs.get("batch"))
    meta = getattr(batch, "meta_info", {}) or {}
    carrier = meta.pop(CARRIER_KEY, None)
    step = meta.get("global_steps", -1)
    validate = bool(meta.get("validate", False))
    from ..ray import remote_step

    if meta.pop(FULLY_ASYNC_KEY, False):
        return await _fully_async_call(original, args, kwargs, cast("DataProto", batch))
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


async def _fully_async_call(
    original: Callable[..., Awaitable[DataProto]], args: Args, kwargs: Kwargs, batch: DataProto
) -> object:
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


async def run_agent_loop(original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    """The sample span (identity: :func:`_read_sample`); the carrier and position keywords are removed before
    verl sees them."""
    carrier = kwargs.pop(CARRIER_KEY, None)
    position = kwargs.pop(POSITION_KEY, None)
    try:
        who = _read_sample(args, kwargs, position)
    except Exception:
        internal_error("verl._run_agent_loop.trajectory")
        return await original(*args, **kwargs)
    with _remote(carrier):
        async with _context.sample(
            who.sample_index, who.rollout, step=who.step, validate=who.validate, attributes=who.attrs
        ) as handle:
            step = handle.step  # the enclosing (dispatching) step's when verl's could not be read
            if (who.v1 or who.call_rows is not None) and step is not None:
                release_stale(step, who.validate)
            token = None
            rows = None
            key = (step, who.validate, who.sample_index, who.rollout)
            if (who.v1 or who.call_rows is not None) and handle.span is not None:
                rows = open_rows()
                if rows is not None:
                    rows.open(key)
                if who.v1:
                    token = PENDING.set(Pending(handle, key, who.uid))
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
                    if (
                        who.call_rows is not None
                        and values is not None
                        and who.verl_key is not None
                        and step is not None
                    ):
                        who.call_rows[who.verl_key] = _call_row(
                            handle, output, values, who.sample_index, who.verl_key[1], who.uid, step
                        )
                except Exception:
                    internal_error("verl._run_agent_loop.record")
            return output


class _Sample(NamedTuple):
    """A sample's identity as :func:`_read_sample` reads it from verl's call."""

    sample_index: int
    rollout: int | None
    step: int | None
    validate: bool
    attrs: dict[str, Any]
    uid: str
    v1: bool
    call_rows: dict[tuple[int, int], dict[str, Any]] | None
    verl_key: tuple[int, int] | None


def _read_sample(args: Args, kwargs: Kwargs, position: Any) -> _Sample:
    """Legacy: identity from ``trajectory``. V1 (a ``session_id`` keyword): rollout = the session, index = the
    prompt's ``position`` in its dispatch batch (the dataset index is not unique), uid and dataset index as
    attributes. Fully-async: the arrival order in the step, verl's index as the dataset index. Identity values
    that cannot be read are left out (warned once), never the span (see ``read_identity``)."""
    trajectory = args[2] if len(args) > 2 else kwargs["trajectory"]
    step = read_identity("trajectory step", field_of(trajectory, "step"))
    validate = bool(field_of(trajectory, "validate"))
    attrs: dict[str, Any] = {}
    agent = kwargs.get("agent_name")
    if agent:
        attrs[sc.RL_AGENT_NAME] = str(agent)
    v1 = "session_id" in kwargs
    call_rows = None
    verl_key: tuple[int, int] | None = None
    if v1:
        rollout = read_identity("session_id", kwargs["session_id"])
        dataset_index = read_identity("sample_index", field_of(trajectory, "sample_index"))
        uid = str(kwargs.get("uid", ""))
        index = identity_int(position) if position is not None else None
        if index is None:
            index = arrival_index(-1 if step is None else step, validate, uid)
        attrs[sc.RL_SAMPLE_UID] = uid
        if dataset_index is not None:
            attrs[sc.RL_SAMPLE_DATASET_INDEX] = dataset_index
    else:
        uid = ""
        read = read_identity("sample_index", field_of(trajectory, "sample_index"))
        rollout = read_identity("rollout_n", field_of(trajectory, "rollout_n"))
        index = read if read is not None else arrival_index(-1 if step is None else step, validate, unique_key())
        call_rows = _CALL_ROWS.get()
        if call_rows is not None:  # fully-async: the dataset index is not unique among in-flight prompts
            verl_key = (index, rollout) if rollout is not None else None  # how verl's output rows are keyed
            uid = str(kwargs.get("uid", ""))
            attrs[sc.RL_SAMPLE_UID] = uid
            attrs[sc.RL_SAMPLE_DATASET_INDEX] = index
            index = arrival_index(-1 if step is None else step, validate, uid)
    return _Sample(index, rollout, step, validate, attrs, uid, v1, call_rows, verl_key)


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


def uninstrumented_performance_metrics(metrics: Any, output: Any) -> Any:
    """verl's own ``AgentLoopManager._performance_metrics`` (unpatched): the reference for parity checks."""
    agent_loop = importlib.import_module(AGENT_LOOP)
    method = vars(agent_loop.AgentLoopManager)["_performance_metrics"]
    while patching.is_ours(method):
        method = method.__wrapped__
    return method(None, metrics, output)
