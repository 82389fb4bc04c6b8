"""Step and sample context.

Two :class:`contextvars.ContextVar` carry the RL identity (step, validate, sample index, rollout n) to every
phase span started below them. asyncio copies the context into each task (``create_task``, ``gather``) and
``asyncio.to_thread`` copies it into the thread, so the identity survives both; ``loop.run_in_executor`` and
hand-made threads do not copy it: wrap the callable with :func:`bind`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import traceback
import types
from collections.abc import AsyncGenerator, Callable, Generator, Mapping
from types import TracebackType
from typing import Any, TypeVar, cast

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from .. import semconv as sc
from ._clock import clock_offset, monotonic_ns
from ._guard import internal_error, safe_str, warn_once
from ._kinds import is_async_callable, is_asyncgen_callable, is_gen_callable
from ._state import TracePer, state
from ._tracer import current_live, current_tracer

T = TypeVar("T")


defaults = state.defaults
content_policy = state.content


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

    __slots__ = ("clock_offset", "index", "live", "merged", "phase_attributes", "rollout_n", "span", "step", "validate")

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
        self.merged: dict[object, dict[str, AttributeValue]] = {}
        """Per phase spec: its attributes + this sample's identity (built once per sample, not per span)."""
        self.live: Any = None
        """The in-flight registry's record of this sample (``_inflight``), ``None`` when not tracked."""
        self.clock_offset: int | None = None
        """The root span's wall-clock start minus its monotonic start (``_clock``): the timeline its phase
        spans share; ``None`` when the sample is not traced."""

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

        ``num_preempted`` set here replaces the value accumulated from generation spans. A value that cannot
        be converted (whatever its conversion raises), or an int outside int64, is dropped with a one-time
        warning; the other fields are kept. Never raises.
        """
        span = self.span
        if span is None:
            return
        try:
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
        except Exception:
            internal_error("SampleHandle.record")

    def record_content(self, *, prompt: object = None, response: object = None) -> None:
        """Attach prompt/response text to the root span, only when content capture is on
        (``configure(capture_content=True)``); redacted, then truncated to ``max_content_chars``."""
        span = self.span
        if span is None or not content_policy.enabled:
            return
        try:
            for key, value in ((sc.RL_PROMPT_CONTENT, prompt), (sc.RL_RESPONSE_CONTENT, response)):
                if value is not None:
                    cleaned = content_policy.clean(value)
                    if cleaned is not None:
                        span.set_attribute(key, cleaned)
        except Exception:
            internal_error("SampleHandle.record_content")


_STEP: contextvars.ContextVar[StepState | None] = contextvars.ContextVar("otel_agentloop_step", default=None)
_SAMPLE: contextvars.ContextVar[SampleHandle | None] = contextvars.ContextVar("otel_agentloop_sample", default=None)


def current_step() -> StepState | None:
    """The step entered in this context, if any."""
    return _STEP.get()


def current_sample() -> SampleHandle | None:
    """The sample entered in this context, if any."""
    return _SAMPLE.get()


def enter_step_state(state: StepState | None) -> contextvars.Token[StepState | None]:
    """Make ``state`` this context's step (an integration that rebuilds a step elsewhere); returns the token
    for :func:`leave_step_state`."""
    return _STEP.set(state)


def leave_step_state(token: contextvars.Token[StepState | None]) -> None:
    """Undo :func:`enter_step_state` (the step entered before it is this context's step again)."""
    _STEP.reset(token)


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def safe_repr(value: object, limit: int = 200) -> str:
    """``repr(value)``, bounded; never raises."""
    try:
        return safe_str(repr(value), limit)
    except BaseException:
        return safe_str(value, limit)


def coerce_number(value: object, kind: type[int] | type[float], key: str) -> int | float | None:
    """``value`` as ``kind`` (numpy scalars and numeric strings included), or ``None`` with a one-time warning.

    Whatever the conversion raises (a multi-element tensor, ``np.ma.masked``, a failing ``__int__``) and ints
    outside int64 (what OTLP can carry) give ``None``. Never raises an ``Exception``."""
    try:
        if isinstance(value, bool):
            raise TypeError("bool")
        number = kind(value)  # type: ignore[call-overload,arg-type]  # any value: what kind() raises is caught
        if kind is int and not INT64_MIN <= number <= INT64_MAX:
            raise OverflowError("outside int64")
        return number
    except Exception:
        warn_once("bad-value:" + key, "otel_agentloop: dropping non-numeric value for %s: %s", key, safe_repr(value))
        return None


_SCALARS = (str, bool, int, float)


def _clean_value(value: object, depth: int = 0) -> object:
    if value is None or type(value) in _SCALARS:
        return value
    if isinstance(value, _SCALARS):  # subclasses (np.float64, str enums) as the SDK accepts them
        return value
    if isinstance(value, (list, tuple)) and depth == 0:
        return tuple(_clean_value(v, 1) for v in value)
    if isinstance(value, Mapping) and depth < 4:
        return {safe_str(k): _clean_value(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    text = safe_str(value, 4096)
    return text


def clean_attributes(attributes: Mapping[str, object] | None) -> dict[str, AttributeValue]:
    """User-supplied attributes made safe for the SDK: values it would stringify are stringified here, with
    every failure guarded (the SDK calls ``__str__`` unguarded, and one failure would drop the whole span)."""
    out: dict[str, AttributeValue] = {}
    if not attributes:
        return out
    try:
        for key, value in attributes.items():
            if isinstance(key, str):
                out[key] = _clean_value(value)  # type: ignore[assignment]
    except Exception:
        internal_error("clean_attributes")
    return out


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
            span.set_attribute(sc.GEN_AI_RESPONSE_FINISH_REASONS, (safe_str(finish_reason, 256),))
    except Exception:
        internal_error("record_generation")


IDENTITY_KEYS = (sc.RL_PHASE, sc.RL_SAMPLE_INDEX, sc.RL_ROLLOUT_N, sc.RL_STEP, sc.RL_VALIDATE)
"""What the metrics processor, the keeper and the sampler read: never lost to an attribute count limit."""


def restore_identity(span: Span, started_with: Mapping[str, object]) -> None:
    """Before ``span`` ends: if its attribute count limit evicted anything (the SDK evicts the oldest), write
    back the identity it started with, which makes it the newest. Costs one check when nothing was dropped."""
    try:
        attrs = span._attributes  # type: ignore[attr-defined]
        if not attrs.dropped:
            return
        for key in IDENTITY_KEYS:
            if key in started_with and attrs.get(key) != started_with[key]:
                span.set_attribute(key, started_with[key])  # type: ignore[arg-type]
    except Exception:
        return


MAX_STACK_FRAMES = 32
MAX_STACKTRACE_CHARS = 8192
_RECORDED = "_otel_agentloop_recorded"


def _first_record(exc: BaseException) -> bool:
    """True the first time ``exc`` is recorded: its traceback is formatted once, at the innermost span."""
    try:
        state = object.__getattribute__(exc, "__dict__")
        if state.get(_RECORDED):
            return False
        state[_RECORDED] = True
    except Exception:
        pass
    return True


def _stacktrace(exc: BaseException, message: str) -> str:
    frames = traceback.extract_tb(exc.__traceback__, limit=-MAX_STACK_FRAMES)
    text = "".join(traceback.format_list(frames))
    if len(text) > MAX_STACKTRACE_CHARS:
        text = "…" + text[-MAX_STACKTRACE_CHARS:]
    return f"Traceback (innermost {MAX_STACK_FRAMES} frames at most):\n{text}{error_type(exc)}: {message}"


def error_type(exc: BaseException) -> str:
    """``error.type`` for an exception: the class name, module-qualified unless it is a builtin."""
    cls = type(exc)
    try:
        module, name = str(cls.__module__), str(cls.__qualname__)
    except Exception:
        return "Exception"
    return name if module == "builtins" else f"{module}.{name}"


def mark_error(span: Span, exc: BaseException) -> None:
    """Record ``exc`` on ``span``: ERROR status, ``error.type`` and an ``exception`` event; cancellation is
    noted, not an error. Bounded: the message is cut at 1 KiB and the stack trace (innermost frames, at most
    8 KiB) is formatted once per exception object, at the innermost span it unwinds through, not at every
    level. Never raises, whatever ``exc.__str__`` raises."""
    try:
        if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
            span.set_attribute(sc.RL_CANCELLED, True)
            return
        etype = error_type(exc)
        message = safe_str(exc)
        span.set_attribute(sc.ERROR_TYPE, etype)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {message}"[:256]))
        event: dict[str, AttributeValue] = {
            "exception.type": etype,
            "exception.message": message,
            "exception.escaped": True,
        }
        if _first_record(exc):
            event["exception.stacktrace"] = _stacktrace(exc, message)
        span.add_event("exception", event)
    except Exception:
        internal_error("mark_error")


class _Entry:
    """One entry of a :class:`step` or :class:`sample` block: what leaving it undoes. Kept per entry, never on
    the block object, which two threads or tasks may enter at once."""

    __slots__ = ("identity", "offset", "otel_token", "span", "value", "var_token")

    def __init__(
        self, value: Any, span: Span | None, identity: Mapping[str, object], offset: int | None = None
    ) -> None:
        self.value = value  # what entering set the context variable to
        self.span = span
        self.identity = identity  # the attributes the span started with: restored at the end if evicted
        self.offset = offset  # the span ends at monotonic_ns() + offset (see _clock); None: on the SDK's clock
        self.otel_token: object = None
        self.var_token: contextvars.Token[Any] | None = None


class _Scope:
    """Shared enter/exit for :class:`step` and :class:`sample`: sync and async ``with``.

    Each entry sets :attr:`_var` to a new value (a :class:`StepState` or :class:`SampleHandle`) and keeps its
    :class:`_Entry` under that value, so leaving finds the entry of the context it runs in: the one whose
    value is current there (the innermost block). One object may be entered by several threads or tasks at
    once, each seeing only its own entry."""

    _var: contextvars.ContextVar[Any]

    def __init__(self) -> None:
        self._entries: dict[object, _Entry] = {}

    def _enter(
        self, value: object, span: Span | None, identity: Mapping[str, object], offset: int | None = None
    ) -> None:
        entry = _Entry(value, span, identity, offset)
        if span is not None:
            try:
                entry.otel_token = otel_context.attach(trace.set_span_in_context(span))
            except Exception:
                internal_error(type(self).__name__ + ".attach")
        entry.var_token = self._var.set(value)
        self._entries[value] = entry  # one dict operation: atomic under the GIL

    def _leave(self) -> _Entry | None:
        """Pop this context's entry and undo what entering did; ``None`` when there is none (never entered)."""
        entry = self._entries.pop(self._var.get(), None)
        if entry is None:  # a block left out of order (an inner one never left): the latest entry, as before
            try:
                entry = self._entries.popitem()[1]
            except KeyError:
                return None
        try:
            if entry.otel_token is not None:
                otel_context.detach(entry.otel_token)  # type: ignore[arg-type]
            if entry.var_token is not None:
                self._var.reset(entry.var_token)
        except Exception:
            internal_error(type(self).__name__ + ".exit")
        return entry

    def _end(self, entry: _Entry, exc: BaseException | None) -> None:
        """End the entry's span, recording ``exc``. Never raises."""
        span = entry.span
        if span is not None:
            try:
                if exc is not None:
                    mark_error(span, exc)
                restore_identity(span, entry.identity)
                span.end(None if entry.offset is None else monotonic_ns() + entry.offset)
            except Exception:
                internal_error(type(self).__name__ + ".end")

    def _exit(self, exc: BaseException | None) -> None:
        entry = self._leave()
        if entry is not None:
            self._end(entry, exc)

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
        span = offset = None
        attrs: dict[str, AttributeValue] = {}
        try:
            tracer = current_tracer()
            if tracer is not None:
                attrs = clean_attributes(self.attributes)  # identity last: a count limit evicts the oldest
                attrs[sc.RL_STEP] = self.step
                attrs[sc.RL_VALIDATE] = self.validate
                mono = monotonic_ns()
                span = tracer.start_span(sc.STEP_SPAN, attributes=attrs)
                offset = clock_offset(span, mono)
        except Exception:
            internal_error("step.enter")
        state = StepState(self.step, self.validate, self.trace_per, span)
        self._enter(state, span, attrs, offset)
        return state

    async def __aenter__(self) -> StepState:
        return self.__enter__()


_IDENTITY_KEYS = (sc.RL_SAMPLE_INDEX, sc.RL_ROLLOUT_N, sc.RL_STEP, sc.RL_VALIDATE)
"""A sample's identity, set from ``sample()``'s arguments (and the enclosing step) on its root and every phase
span; the same keys in ``attributes=`` are ignored (on the root only, they made it a sample of its own)."""


class sample(_Scope):  # noqa: N801 - used like a function: ``async with otel_agentloop.sample(i):``
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
        attrs: dict[str, AttributeValue] = {}
        try:
            tracer = current_tracer()
            if tracer is not None:
                attrs = clean_attributes(self.attributes)  # identity last: a count limit evicts the oldest
                for key in _IDENTITY_KEYS:  # identity comes from the arguments alone: root and phases agree
                    attrs.pop(key, None)
                attrs[sc.RL_WORKER] = self.worker or defaults.worker
                attrs.update(handle.phase_attributes)
                per_sample = (outer.trace_per if outer is not None else defaults.trace_per) == "sample"
                links = None
                parent: Context | None = None
                if per_sample:
                    parent = Context()  # a new trace for this sample ...
                    step_span = outer.span if outer is not None else trace.get_current_span()
                    ctx = step_span.get_span_context() if step_span is not None else None
                    if ctx is not None and ctx.is_valid:
                        links = [Link(ctx)]  # ... linked to the step
                mono = monotonic_ns()
                span = tracer.start_span(sc.SAMPLE_SPAN, context=parent, attributes=attrs, links=links)
                handle.span = span
                handle.clock_offset = clock_offset(span, mono)
                registry = current_live()
                if registry is not None:
                    handle.live = registry.sample_started(span, attrs, mono)
        except Exception:
            internal_error("sample.enter")
        self._enter(handle, handle.span, attrs, handle.clock_offset)
        return handle

    async def __aenter__(self) -> SampleHandle:
        return self.__enter__()

    def _exit(self, exc: BaseException | None) -> None:
        entry = self._leave()
        if entry is None:
            return
        self._end(entry, exc)
        handle: SampleHandle = entry.value
        live = handle.live
        if live is not None and handle.span is not None:
            live.registry.sample_ended(live, handle.span)  # after end: the registry queues the ended span


def bind(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` bound to the current context: pass it to ``run_in_executor``, ``executor.map`` or a ``Thread``.

    The context is captured once, here; each call runs in its own copy of it, so one bound callable may run
    in many threads at once (``executor.map(bind(fn), items)``) and calls never see each other's changes.
    The whole body runs in that copy, whatever ``fn`` is: an ``async def`` (each step of the coroutine), a
    generator or an async generator (each resume, ``send``/``throw``/``close`` passed through unchanged), or a
    sync callable that returns a coroutine (which then runs in the copy too).
    """
    ctx = contextvars.copy_context()
    bound: Callable[..., Any]
    if is_asyncgen_callable(fn):

        async def bound_agen(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
            run = ctx.copy()
            agen: Any = run.run(fn, *args, **kwargs)
            step = agen.__anext__()
            while True:
                try:
                    value = await _run_in(run, step)
                except StopAsyncIteration:
                    return
                try:
                    sent = yield value
                except GeneratorExit:
                    await _run_in(run, agen.aclose())
                    raise
                except BaseException as exc:
                    step = agen.athrow(exc)
                else:
                    step = agen.asend(sent)

        bound = bound_agen
    elif is_async_callable(fn):

        async def bound_async(*args: Any, **kwargs: Any) -> Any:
            run = ctx.copy()
            return await _run_in(run, run.run(fn, *args, **kwargs))

        bound = bound_async
    elif is_gen_callable(fn):

        def bound_gen(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
            run = ctx.copy()
            driven = cast(Generator[Any, Any, Any], _run_in(run, run.run(fn, *args, **kwargs)))
            return (yield from driven)

        bound = bound_gen
    else:

        def bound_sync(*args: Any, **kwargs: Any) -> Any:
            run = ctx.copy()
            result = run.run(fn, *args, **kwargs)
            if inspect.iscoroutine(result):  # e.g. a lambda around an ``async def``: its body runs later
                return _finish_in(run, result)
            return result

        bound = bound_sync
    with contextlib.suppress(Exception):  # a callable without __name__ & co. (a partial, an instance)
        functools.update_wrapper(bound, fn)
    return bound  # type: ignore[return-value]  # the same kind of callable as fn, with the same result


@types.coroutine
def _run_in(ctx: contextvars.Context, it: Any) -> Generator[Any, Any, Any]:
    """Drive ``it`` (a coroutine, a generator, an async generator's ``asend``/``athrow`` awaitable) to its end,
    every step of it inside ``ctx``; what is sent, thrown or closed into this frame reaches ``it`` unchanged.
    Awaitable (``await _run_in(...)``) and delegable (``yield from _run_in(...)``)."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            yielded = ctx.run(it.send, value) if error is None else ctx.run(it.throw, error)
        except StopIteration as stop:
            return stop.value
        value = error = None
        try:
            value = yield yielded
        except GeneratorExit:
            ctx.run(it.close)
            raise
        except BaseException as exc:
            error = exc


async def _finish_in(ctx: contextvars.Context, coro: Any) -> Any:
    return await _run_in(ctx, coro)
