"""Step and sample context.

Two :class:`contextvars.ContextVar` carry the RL identity (step, validate, sample index, rollout n) to every
phase span started below them. asyncio copies the context into each task (``create_task``, ``gather``) and
``asyncio.to_thread`` copies it into the thread, so the identity survives both; ``loop.run_in_executor`` and
hand-made threads do not copy it: wrap the callable with :func:`bind`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import socket
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Literal, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from . import _content as content
from . import semconv as sc
from ._guard import internal_error, warn_once
from ._tracer import current_tracer

TracePer = Literal["sample", "step"]
T = TypeVar("T")


class _Defaults:
    """Process-wide defaults set by :func:`otel_agentloop.configure`."""

    trace_per: TracePer = "sample"
    worker: str = f"{socket.gethostname()}:{os.getpid()}"


defaults = _Defaults()


class StepState:
    """The active step (immutable once entered)."""

    __slots__ = ("span", "step", "trace_per", "validate")

    def __init__(self, step: int, validate: bool, trace_per: TracePer, span: Span | None) -> None:
        self.step = step
        self.validate = validate
        self.trace_per = trace_per
        self.span = span


class SampleHandle:
    """The active sample: its identity, root span, and the attributes every phase span below it carries."""

    __slots__ = ("index", "phase_attributes", "rollout_n", "span", "step", "validate")

    def __init__(self, index: int, rollout_n: int | None, step: int | None, validate: bool, span: Span | None):
        self.index = index
        self.rollout_n = rollout_n
        self.step = step
        self.validate = validate
        self.span = span
        attrs: dict[str, AttributeValue] = {sc.RL_SAMPLE_INDEX: index, sc.RL_VALIDATE: validate}
        if step is not None:
            attrs[sc.RL_STEP] = step
        if rollout_n is not None:
            attrs[sc.RL_ROLLOUT_N] = rollout_n
        self.phase_attributes: Mapping[str, AttributeValue] = attrs

    @property
    def trace_id(self) -> str | None:
        """Hex trace id of the sample's root span, or ``None`` when not traced."""
        if self.span is None:
            return None
        return format(self.span.get_span_context().trace_id, "032x")

    def record(
        self,
        *,
        num_preempted: int | None = None,
        prompt_length: int | None = None,
        response_length: int | None = None,
        reward: float | None = None,
        turns: int | None = None,
    ) -> None:
        """Record per-sample facts on the root span (read by the metrics processor when the sample ends).

        ``num_preempted`` set here replaces the value accumulated from generation spans. Values that are not
        numbers are dropped with a one-time warning.
        """
        span = self.span
        if span is None:
            return
        for key, value, kind in (
            (sc.RL_NUM_PREEMPTED, num_preempted, int),
            (sc.RL_PROMPT_LENGTH, prompt_length, int),
            (sc.RL_RESPONSE_LENGTH, response_length, int),
            (sc.RL_REWARD_SCORE, reward, float),
            (sc.RL_NUM_TURNS, turns, int),
        ):
            if value is not None:
                coerced = coerce_number(value, kind, key)
                if coerced is not None:
                    span.set_attribute(key, coerced)


    def record_content(self, *, prompt: object = None, response: object = None) -> None:
        """Attach prompt/response text to the root span, only when content capture is on
        (``configure(capture_content=True)``); redacted, then truncated to ``max_content_chars``."""
        span = self.span
        if span is None or not content.policy.enabled:
            return
        for key, value in ((sc.RL_PROMPT_CONTENT, prompt), (sc.RL_RESPONSE_CONTENT, response)):
            if value is not None:
                cleaned = content.policy.clean(value)
                if cleaned is not None:
                    span.set_attribute(key, cleaned)


_STEP: contextvars.ContextVar[StepState | None] = contextvars.ContextVar("otel_agentloop_step", default=None)
_SAMPLE: contextvars.ContextVar[SampleHandle | None] = contextvars.ContextVar("otel_agentloop_sample", default=None)


def current_step() -> StepState | None:
    """The step entered in this context, if any."""
    return _STEP.get()


def current_sample() -> SampleHandle | None:
    """The sample entered in this context, if any."""
    return _SAMPLE.get()


def coerce_number(value: object, kind: type[int] | type[float], key: str) -> int | float | None:
    """``value`` as ``kind`` (numpy scalars and numeric strings included), or ``None`` with a one-time warning."""
    try:
        if isinstance(value, bool):
            raise TypeError
        number = kind(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        warn_once("bad-value:" + key, "otel_agentloop: dropping non-numeric value for %s: %r", key, value)
        return None
    return number


def record_sample(**facts: Any) -> None:
    """:meth:`SampleHandle.record` on the current sample; a no-op outside a sample or when tracing is off."""
    handle = _SAMPLE.get()
    if handle is not None:
        try:
            handle.record(**facts)
        except TypeError:
            raise
        except Exception:
            internal_error("record_sample")


def record_generation(
    *,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    finish_reason: str | None = None,
    num_preempted: int | None = None,
) -> None:
    """Record GenAI usage on the current (generation) span. ``num_preempted`` is summed over turns like verl."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    try:
        for key, value in (
            (sc.GEN_AI_USAGE_INPUT_TOKENS, input_tokens),
            (sc.GEN_AI_USAGE_OUTPUT_TOKENS, output_tokens),
            (sc.RL_NUM_PREEMPTED, num_preempted),
        ):
            if value is not None:
                coerced = coerce_number(value, int, key)
                if coerced is not None:
                    span.set_attribute(key, coerced)
        if finish_reason is not None:
            span.set_attribute(sc.GEN_AI_RESPONSE_FINISH_REASONS, (str(finish_reason),))
    except Exception:
        internal_error("record_generation")


def error_type(exc: BaseException) -> str:
    """``error.type`` for an exception: the class name, module-qualified unless it is a builtin."""
    cls = type(exc)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def mark_error(span: Span, exc: BaseException) -> None:
    """Record ``exc`` on ``span``: ERROR status and ``error.type``; cancellation is noted, not an error."""
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        span.set_attribute(sc.RL_CANCELLED, True)
        return
    span.set_attribute(sc.ERROR_TYPE, error_type(exc))
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:256]))
    span.record_exception(exc, escaped=True)


class _Scope:
    """Shared enter/exit for :class:`step` and :class:`sample`: sync and async ``with``."""

    _span: Span | None = None
    _otel_token: object = None

    def _start(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _reset(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _enter_span(self, span: Span) -> None:
        self._span = span
        self._otel_token = otel_context.attach(trace.set_span_in_context(span))

    def _exit(self, exc: BaseException | None) -> None:
        span, self._span = self._span, None
        token, self._otel_token = self._otel_token, None
        try:
            if token is not None:
                otel_context.detach(token)  # type: ignore[arg-type]
            self._reset()
        except Exception:
            internal_error(type(self).__name__ + ".exit")
        if span is not None:
            try:
                if exc is not None:
                    mark_error(span, exc)
                span.end()
            except Exception:
                internal_error(type(self).__name__ + ".end")

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._exit(exc)

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._exit(exc)


class step(_Scope):  # noqa: N801 - used like a function: ``with otel_agentloop.step(3):``
    """Context of one training (or validation) step: a ``rl.step`` span and the step number for samples.

    ``trace_per="sample"`` (default, see :func:`otel_agentloop.configure`) gives each sample its own trace,
    linked to the step span; ``"step"`` makes samples children of the step span (one trace per step).
    """

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
        self.step = int(step)
        self.validate = bool(validate)
        self.trace_per: TracePer = trace_per or defaults.trace_per
        self.attributes = dict(attributes or {})
        self._token: contextvars.Token[StepState | None] | None = None

    def __enter__(self) -> StepState:
        span = None
        try:
            tracer = current_tracer()
            if tracer is not None:
                attrs: dict[str, AttributeValue] = {sc.RL_STEP: self.step, sc.RL_VALIDATE: self.validate}
                attrs.update(self.attributes)
                span = tracer.start_span(sc.STEP_SPAN, attributes=attrs)
                self._enter_span(span)
        except Exception:
            internal_error("step.enter")
        state = StepState(self.step, self.validate, self.trace_per, span)
        self._token = _STEP.set(state)
        return state

    async def __aenter__(self) -> StepState:
        return self.__enter__()

    def _reset(self) -> None:
        if self._token is not None:
            _STEP.reset(self._token)
            self._token = None


class sample(_Scope):  # noqa: N801 - used like a function: ``async with otel_agentloop.sample(i):``
    """Context of one sample: a ``rl.sample`` root span whose identity every phase span below it carries.

    ``step``/``validate`` default to the enclosing :class:`step`. An exception leaving the block marks the root
    span ERROR (cancellation does not) and propagates unchanged.
    """

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
        self.index = int(index)
        self.rollout_n = None if rollout_n is None else int(rollout_n)
        self._step = None if step is None else int(step)
        self._validate = validate
        self.worker = worker
        self.attributes = attributes
        self._token: contextvars.Token[SampleHandle | None] | None = None

    def __enter__(self) -> SampleHandle:
        outer = _STEP.get()
        step_no = self._step if self._step is not None else (outer.step if outer is not None else None)
        validate = bool(self._validate) if self._validate is not None else (outer.validate if outer else False)
        handle = SampleHandle(self.index, self.rollout_n, step_no, validate, None)
        try:
            tracer = current_tracer()
            if tracer is not None:
                attrs = dict(handle.phase_attributes)
                attrs[sc.RL_WORKER] = self.worker or defaults.worker
                if self.attributes:
                    attrs.update(self.attributes)
                per_sample = (outer.trace_per if outer is not None else defaults.trace_per) == "sample"
                links = None
                parent: Context | None = None
                if per_sample:
                    parent = Context()  # a new trace for this sample ...
                    step_span = outer.span if outer is not None else trace.get_current_span()
                    ctx = step_span.get_span_context() if step_span is not None else None
                    if ctx is not None and ctx.is_valid:
                        links = [Link(ctx)]  # ... linked to the step
                span = tracer.start_span(sc.SAMPLE_SPAN, context=parent, attributes=attrs, links=links)
                handle.span = span
                self._enter_span(span)
        except Exception:
            internal_error("sample.enter")
        self._token = _SAMPLE.set(handle)
        return handle

    async def __aenter__(self) -> SampleHandle:
        return self.__enter__()

    def _reset(self) -> None:
        if self._token is not None:
            _SAMPLE.reset(self._token)
            self._token = None


def bind(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` bound to a copy of the current context: pass it to ``run_in_executor`` or a ``Thread``.

    One copy per call of :func:`bind`: bind once per submitted call, not once for many.
    """
    return functools.partial(contextvars.copy_context().run, fn)
