"""The ``step`` and ``sample`` blocks: each entry sets the current step or sample (``_current``, re-exported
here with what reads it) and opens its span, ``rl.step`` or the sample's ``rl.sample`` root; leaving undoes
both, in the context it runs in.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from types import TracebackType
from typing import Generic, TypeVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Tracer
from opentelemetry.util.types import AttributeValue

from .. import semconv as sc
from ._bind import bind
from ._current import _SAMPLE as _SAMPLE  # the current sample's variable, for the integrations that set it
from ._current import _STEP, SampleHandle, StepState
from ._current import current_sample as current_sample
from ._current import current_step as current_step
from ._current import enter_step_state as enter_step_state
from ._current import leave_step_state as leave_step_state
from ._current import record_generation as record_generation
from ._current import record_sample as record_sample
from ._guard import internal_error
from ._lifecycle import announce, open_span
from ._scope import AsyncWith, OpenSpan, span_of
from ._state import TracePer, state
from ._tracer import current_registry, current_tracer
from ._values import clean_attributes

__all__ = [
    "SampleHandle",
    "StepState",
    "bind",
    "current_sample",
    "current_step",
    "enter_step_state",
    "leave_step_state",
    "record_generation",
    "record_sample",
    "sample",
    "step",
]


defaults = state.defaults


def root_context(outer: StepState | None) -> tuple[Context | None, list[Link] | None]:
    """Where a sample's root span (or verl's group span) starts: with ``trace_per="sample"`` a new trace linked
    to the step span (the current span outside a step); else the current context, no link (the span is the
    step's child, and a link to its own parent would say nothing more)."""
    if (outer.trace_per if outer is not None else defaults.trace_per) != "sample":
        return None, None
    step_span = outer.span if outer is not None else trace.get_current_span()
    ctx = step_span.get_span_context() if step_span is not None else None
    return Context(), [Link(ctx)] if ctx is not None and ctx.is_valid else None


V = TypeVar("V", StepState, SampleHandle)
"""What a block puts in its context variable: a :class:`StepState` (``step``) or a :class:`SampleHandle`."""


class _Entry(Generic[V]):
    """One entry of a :class:`step` or :class:`sample` block: what leaving it undoes. Kept per entry, never on
    the block object, which two threads or tasks may enter at once."""

    __slots__ = ("scope", "value", "var_token")

    def __init__(self, value: V, scope: OpenSpan | None) -> None:
        self.value: V = value  # what entering set the context variable to
        self.scope = scope  # its span, entered (None when tracing is off)
        self.var_token: contextvars.Token[V | None] | None = None


class _Scope(AsyncWith[V]):
    """Shared enter/exit for :class:`step` and :class:`sample`: sync and async ``with``.

    Each entry sets :attr:`_var` to a new value (a :class:`StepState` or :class:`SampleHandle`) and keeps its
    :class:`_Entry` under that value, so leaving finds the entry of the context it runs in: the one whose
    value is current there (the innermost block). One object may be entered by several threads or tasks at
    once, each seeing only its own entry."""

    _var: contextvars.ContextVar[V | None]

    def __init__(self) -> None:
        self._entries: dict[object, _Entry[V]] = {}

    def _enter(self, value: V, scope: OpenSpan | None) -> None:
        entry = _Entry(value, scope)
        entry.var_token = self._var.set(value)
        self._entries[value] = entry  # one dict operation: atomic under the GIL

    def _leave(self) -> _Entry[V] | None:
        """Pop this context's entry and undo what entering did; ``None`` when there is none (never entered)."""
        entry = self._entries.pop(self._var.get(), None)
        if entry is None:  # a block left out of order (an inner one never left): the latest entry, as before
            try:
                entry = self._entries.popitem()[1]
            except KeyError:
                return None
        if entry.scope is not None:
            entry.scope.leave()
        try:
            if entry.var_token is not None:
                self._var.reset(entry.var_token)
        except Exception:
            internal_error(type(self).__name__ + ".exit")
        return entry

    def _exit(self, exc: BaseException | None) -> None:
        entry = self._leave()
        if entry is not None and entry.scope is not None:
            entry.scope.close(exc)

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._exit(exc)


class step(_Scope[StepState]):  # noqa: N801 - used like a function: ``with otel_agentloop.step(3):``
    """Context of one training (or validation) step: a ``rl.step`` span and the step number for samples.

    ``trace_per="sample"`` (default, see :func:`otel_agentloop.configure`) gives each sample its own trace,
    linked to the step span; ``"step"`` makes samples children of the step span (one trace per step).
    """

    _var = _STEP

    def __init__(
        self,
        step: int,
        validate: bool = False,
        *,
        trace_per: TracePer | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> None:
        if trace_per not in (None, "sample", "step"):
            raise ValueError(f"trace_per must be 'sample' or 'step', not {trace_per!r}")
        super().__init__()
        self.step = int(step)
        self.validate = bool(validate)
        self.trace_per: TracePer = trace_per or defaults.trace_per
        self.attributes = dict(attributes or {})

    def __enter__(self) -> StepState:
        scope = None
        tracer = current_tracer()
        if tracer is not None:
            try:
                attrs = clean_attributes(self.attributes)  # identity last: a count limit evicts the oldest
                attrs[sc.RL_STEP] = self.step
                attrs[sc.RL_VALIDATE] = self.validate
                scope = open_span(tracer, sc.STEP_SPAN, attrs)
            except Exception:
                internal_error("step.enter")
        state = StepState(self.step, self.validate, self.trace_per, span_of(scope) if scope is not None else None)
        self._enter(state, scope)
        return state


_IDENTITY_KEYS = (sc.RL_SAMPLE_INDEX, sc.RL_ROLLOUT_N, sc.RL_STEP, sc.RL_VALIDATE)
"""A sample's identity, set from ``sample()``'s arguments (and the enclosing step) on its root and every phase
span; the same keys in ``attributes=`` are ignored (on the root only, they made it a sample of its own)."""


class sample(_Scope[SampleHandle]):  # noqa: N801 - used like a function: ``async with otel_agentloop.sample(i):``
    """Context of one sample: a ``rl.sample`` root span whose identity every phase span below it carries.

    ``step``/``validate`` default to the enclosing :class:`step`. An exception leaving the block marks the root
    span ERROR (cancellation does not) and propagates unchanged. One object may be entered several times, at
    once too (threads, tasks): each entry is its own sample span, seen only inside that entry.
    """

    _var = _SAMPLE

    def __init__(
        self,
        index: int,
        rollout_n: int | None = None,
        *,
        step: int | None = None,
        validate: bool | None = None,
        worker: str | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> None:
        super().__init__()
        self.index = int(index)
        self.rollout_n = None if rollout_n is None else int(rollout_n)
        self._step = None if step is None else int(step)
        self._validate = validate
        self.worker = worker
        self.attributes = attributes

    def __enter__(self) -> SampleHandle:
        outer = _STEP.get()
        step_no = self._step if self._step is not None else (outer.step if outer is not None else None)
        validate = bool(self._validate) if self._validate is not None else (outer.validate if outer else False)
        handle = SampleHandle(self.index, self.rollout_n, step_no, validate, None)
        scope = None
        tracer = current_tracer()
        if tracer is not None:
            try:
                scope = self._open(tracer, handle, outer)
            except Exception:
                internal_error("sample.enter")
        self._enter(handle, scope)
        return handle

    def _open(self, tracer: Tracer, handle: SampleHandle, outer: StepState | None) -> OpenSpan | None:
        """The sample's root span: a new trace linked to the step (``trace_per="sample"``) or the step's child."""
        attrs = clean_attributes(self.attributes)  # identity last: a count limit evicts the oldest
        for key in _IDENTITY_KEYS:  # identity comes from the arguments alone: root and phases agree
            attrs.pop(key, None)
        attrs[sc.RL_WORKER] = self.worker or defaults.worker
        attrs.update(handle.phase_attributes)
        parent, links = root_context(outer)
        scope = open_span(tracer, sc.SAMPLE_SPAN, attrs, context=parent, links=links)
        if scope is None:
            return None
        handle.span = span = span_of(scope)
        handle.clock_offset = scope.offset
        announce(scope)
        registry = current_registry()
        if registry is not None:
            handle.tracked_sample = registry.sample_started(span, attrs, scope.start_mono)
        return scope

    def _exit(self, exc: BaseException | None) -> None:
        entry = self._leave()
        if entry is None or entry.scope is None:
            return
        entry.scope.close(exc)
        handle = entry.value
        tracked = handle.tracked_sample
        if tracked is not None and handle.span is not None:
            tracked.registry.sample_ended(tracked, handle.span)  # after end: the registry queues the ended span
