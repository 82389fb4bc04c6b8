"""The phases of a GRPOTrainer batch as spans under each row's sample: generation calls, tool calls, rewards.

Contracts: every TRL call goes through with the very same arguments and result, TRL's and the user's exceptions
come out unchanged (a reward function's or tool's own type), and our failures are logged once and swallowed.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Protocol, cast

from opentelemetry.trace import Link
from opentelemetry.util.types import AttributeValue

from ... import semconv as sc
from ...core._guard import internal_error
from ...core._lifecycle import finish, open_span
from ...core._phase import PhaseSpec, start
from ...core._scope import OpenSpan, span_of
from ...core._tracer import current_tracer
from ._rows import Batch, Ending, Row, end_phase, generation_spec, open_phase, reward_spec, tool_spec
from ._state import RewardRun, TrainerState


class Tensor(Protocol):
    """What we use of a torch tensor."""

    def tolist(self) -> Any:  # Any: nested lists of Python numbers, as deep as the tensor
        ...


# -- generation -----------------------------------------------------------------------------------------------


def generation_rows(st: TrainerState, prompt_ids: Sequence[Sequence[int]]) -> list[int] | None:
    """Which rows a ``_generate_single_turn`` call generates for: all of them on the first call of a batch, else
    (TRL's tool loop) the rows whose tools just ran, matched on their first prompt. ``None``: not known."""
    batch = st.batch
    if batch is None:
        return None
    n = len(prompt_ids)
    if st.first_prompt_ids is None:
        if n != len(batch.rows):
            return None
        st.first_prompt_ids = [list(p) for p in prompt_ids]
        return list(range(n))
    firsts = st.first_prompt_ids
    candidates = sorted(st.tool_rows) or list(range(len(firsts)))
    st.tool_rows.clear()
    rows: list[int] = []
    at = 0
    for ids in prompt_ids:  # TRL keeps the rows in order; each new prompt starts with the row's first prompt
        while at < len(candidates) and list(ids[: len(firsts[candidates[at]])]) != firsts[candidates[at]]:
            at += 1
        if at == len(candidates):
            return None
        rows.append(candidates[at])
        at += 1
    return rows


class GenerationCall:
    """One batched generation call: a ``rl.generate.batch`` span in the trainer's context, and one generation
    span per sample in it, over the same interval, linked to the batch span."""

    __slots__ = ("batch_scope", "rows", "scopes")

    def __init__(self, batch: Batch, rows: list[int], model: str | None) -> None:
        self.rows = rows
        self.batch_scope: OpenSpan | None = None
        self.scopes: list[OpenSpan | None] = []
        tracer = current_tracer()
        if tracer is None:
            return
        size: dict[str, AttributeValue] = {sc.RL_BATCH_SIZE: len(rows)}
        self.batch_scope = open_span(tracer, sc.GENERATE_BATCH_SPAN, dict(size), enter=False)
        links = [Link(span_of(self.batch_scope).get_span_context())] if self.batch_scope is not None else None
        spec = generation_spec(model)
        self.scopes = [open_phase(batch.rows[r], spec, dict(size), links) for r in rows]

    def end(
        self,
        exc: BaseException | None,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]] | None,
    ) -> None:
        """End the sample spans and the batch span at one moment: each sample's own token counts and its share
        of the batch's time (:data:`~otel_agentloop.semconv.RL_BATCH_ATTRIBUTED_S`). Never raises."""
        ending = Ending()
        try:
            outs = [len(c) for c in completion_ids] if completion_ids is not None else None
            longest = max(outs) if outs else 0
            for k, scope in enumerate(self.scopes):
                attrs: dict[str, AttributeValue] = {sc.GEN_AI_USAGE_INPUT_TOKENS: len(prompt_ids[k])}
                if outs is not None and k < len(outs):
                    attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = outs[k]
                    if scope is not None and longest > 0:
                        wall = (ending.at(scope) - _start_ns(scope)) / 1e9
                        attrs[sc.RL_BATCH_ATTRIBUTED_S] = max(wall, 0.0) * outs[k] / longest
                end_phase(scope, exc, ending, attrs)
        except Exception:
            internal_error("trl.generate.end")
        if self.batch_scope is not None:
            finish(self.batch_scope, exc, ending.at(self.batch_scope))


def _start_ns(scope: OpenSpan) -> int:
    offset = scope.offset
    return scope.start_mono + offset if offset is not None else 0


# -- rewards --------------------------------------------------------------------------------------------------


def open_reward(st: TrainerState, name: str) -> RewardRun | None:
    """Open ``name``'s reward span on every row (not entered: TRL may run it on its async loop). Never raises."""
    batch = st.batch
    if batch is None or current_tracer() is None:
        return None
    try:
        spec = reward_spec(name)
        run = RewardRun([open_phase(row, spec) for row in batch.rows])
        st.rewards[name] = run
        return run
    except Exception:
        internal_error("trl.reward.open")
        return None


def end_rewards(
    st: TrainerState, names: Sequence[str], values: Tensor | None, error: BaseException | None
) -> list[list[float]] | None:
    """End the open reward spans with each row's value (``values``: TRL's rewards per function, rows by
    functions, maybe gathered from every process). Returns the rows' values as lists (``None``: not this
    batch's rows). Never raises."""
    runs, st.rewards = st.rewards, {}
    batch = st.batch
    if batch is None:
        return None
    table: list[list[float]] | None = None
    try:
        if values is not None and error is None:
            rows: list[list[float]] = values.tolist()  # one copy to Python floats (TRL's tensor has no grad)
            if len(rows) == len(batch.rows):  # gathered from several processes: per-row values left out
                table = rows
    except Exception:
        internal_error("trl.reward.values")
    for name, run in runs.items():
        column = list(names).index(name) if name in names else -1
        for r, scope in enumerate(run.scopes):
            attrs: dict[str, AttributeValue] = {}
            if table is not None and column >= 0:
                value = table[r][column]
                if not math.isnan(value):
                    attrs[sc.RL_REWARD_SCORE] = value
            end_phase(scope, run.error or error, run.ending, attrs)
    return table


def record_totals(batch: Batch, table: list[list[float]] | None, weights: Tensor | None) -> None:
    """Each sample's reward as TRL combines it (weighted sum over the functions, NaN ignored), from
    :func:`end_rewards`' table. Never raises."""
    if table is None or len(table) != len(batch.rows):
        return
    try:
        if weights is None:
            raise TypeError("the trainer has no reward_weights")
        w = [float(x) for x in weights.tolist()]
        for row, values in zip(batch.rows, table, strict=True):
            row.handle.record(reward=sum(v * k for v, k in zip(values, w, strict=True) if not math.isnan(v)))
    except Exception:
        internal_error("trl.reward.total")


class RewardBlock:
    """``profiling_context(trainer, <reward function name>)``: TRL's block first entered, last left, with the
    function's reward span open on every row around it. ``__exit__``'s result is TRL's."""

    __slots__ = ("inner", "name", "st")

    def __init__(self, inner: AbstractContextManager[object], st: TrainerState, name: str) -> None:
        self.inner = inner
        self.st = st
        self.name = name

    def __enter__(self) -> object:
        open_reward(self.st, self.name)
        return self.inner.__enter__()

    def __exit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        try:
            return self.inner.__exit__(et, exc, tb)
        finally:
            run = self.st.rewards.get(self.name)
            if run is not None:
                run.ending = Ending()
                run.error = exc if isinstance(exc, BaseException) else None


# -- tools ----------------------------------------------------------------------------------------------------


Tools = dict[str, Callable[..., object]]
"""TRL's tools of one row, by name."""


def wrap_tools(
    st: TrainerState, dicts: Sequence[Tools], asynchronous: bool
) -> list[tuple[Tools, str, Callable[..., object]]]:
    """Put each row's tools in ``dicts`` (TRL's per-row ``{name: callable}``) behind a traced call; returns what
    to put back."""
    batch = st.batch
    undo: list[tuple[Tools, str, Callable[..., object]]] = []
    if batch is None or len(dicts) != len(batch.rows):
        return undo
    for r, tools in enumerate(dicts):
        for name, fn in list(tools.items()):
            wrapper = _async_tool if asynchronous else _sync_tool
            tools[name] = wrapper(st, r, batch.rows[r], name, fn)
            undo.append((tools, name, fn))
    return undo


def _sync_tool(st: TrainerState, r: int, row: Row, name: str, fn: Callable[..., object]) -> Callable[..., object]:
    spec = tool_spec(name)

    def call(*args: object, **kwargs: object) -> object:
        st.tool_rows.add(r)
        return row.run(_traced_call, spec, fn, args, kwargs)

    functools.update_wrapper(call, fn, assigned=("__name__", "__qualname__", "__doc__"), updated=())
    return call


def _traced_call(
    spec: PhaseSpec, fn: Callable[..., object], args: tuple[object, ...], kwargs: dict[str, object]
) -> object:
    scope = start(spec)  # entered in the row's context: the user's own spans nest under it
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        if scope is not None:
            finish(scope, exc)
        raise
    if scope is not None:
        finish(scope)
    return result


def _async_tool(st: TrainerState, r: int, row: Row, name: str, fn: Callable[..., object]) -> Callable[..., object]:
    spec = tool_spec(name)

    async def call(*args: object, **kwargs: object) -> object:
        st.tool_rows.add(r)
        scope = open_phase(row, spec)  # TRL awaits it on its own loop: the span is opened in the row's context
        try:
            result = await cast(Awaitable[object], fn(*args, **kwargs))
        except BaseException as exc:
            end_phase(scope, exc)
            raise
        end_phase(scope, None)
        return result

    functools.update_wrapper(call, fn, assigned=("__name__", "__qualname__", "__doc__"), updated=())
    return call


def is_async(fn: object) -> bool:
    return inspect.iscoroutinefunction(fn)
