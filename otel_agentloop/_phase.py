"""Phase decorators and spans: the hot path.

Everything that can be decided when a function is decorated is decided then (span name, static attributes,
sync/async/generator wrapper). Per call, with tracing off, the wrapper costs one function call and one
check; with tracing on, it starts one span with ``start_span`` and attaches it explicitly (no generator-based
context managers). The user's exception is recorded on the span and re-raised unchanged; an exception in
our own code is logged once and swallowed.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncGenerator, Callable, Generator, Mapping
from types import TracebackType
from typing import Any, TypeVar, overload

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from . import semconv as sc
from ._context import _SAMPLE, mark_error
from ._guard import internal_error
from ._tracer import current_tracer

F = TypeVar("F", bound=Callable[..., Any])

_PHASE_ALIASES = {
    "generate": sc.GENERATE,
    sc.GENERATE: sc.GENERATE,
    "tool": sc.TOOL_CALLS,
    "tool_call": sc.TOOL_CALLS,
    sc.TOOL_CALLS: sc.TOOL_CALLS,
    "reward": sc.COMPUTE_SCORE,
    sc.COMPUTE_SCORE: sc.COMPUTE_SCORE,
}


class PhaseSpec:
    """What a phase span looks like: name and static attributes. Immutable and picklable (no SDK objects)."""

    __slots__ = ("attributes", "name", "phase")

    def __init__(self, phase: str, name: str, attributes: Mapping[str, AttributeValue]) -> None:
        self.phase = phase
        self.name = name
        self.attributes = dict(attributes)

    def __reduce__(self) -> tuple[Any, ...]:
        return (PhaseSpec, (self.phase, self.name, self.attributes))

    @classmethod
    def build(
        cls,
        phase: str,
        *,
        tool: str | None = None,
        model: str | None = None,
        operation: str | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
        default_tool: str | None = None,
    ) -> PhaseSpec:
        if not isinstance(phase, str):
            raise TypeError(f"phase name must be a str, not {type(phase).__name__}")
        key = _PHASE_ALIASES.get(phase)
        if key is None:
            raise ValueError(f"unknown phase {phase!r}: expected one of {', '.join(sc.PHASES)}")
        attrs: dict[str, AttributeValue] = {sc.RL_PHASE: key}
        if key == sc.GENERATE:
            op = operation or sc.DEFAULT_GENERATE_OPERATION
            attrs[sc.GEN_AI_OPERATION_NAME] = op
            if model:
                attrs[sc.GEN_AI_REQUEST_MODEL] = model
            name = f"{op} {model}" if model else op
        elif key == sc.TOOL_CALLS:
            tool_name = tool or default_tool
            attrs[sc.GEN_AI_OPERATION_NAME] = sc.EXECUTE_TOOL
            if tool_name:
                attrs[sc.GEN_AI_TOOL_NAME] = tool_name
            name = f"{sc.TOOL_SPAN_PREFIX} {tool_name}" if tool_name else sc.TOOL_SPAN_PREFIX
        else:
            name = sc.REWARD_SPAN
        if attributes:
            attrs.update(attributes)
        return cls(key, name, attrs)


def start(spec: PhaseSpec, attach: bool = True, extra: Mapping[str, AttributeValue] | None = None,
          ) -> tuple[Span, object] | None:
    """Start ``spec``'s span below the current context; ``None`` when tracing is off or on internal failure."""
    tracer = current_tracer()
    if tracer is None:
        return None
    try:
        sample = _SAMPLE.get()
        attrs = spec.attributes if sample is None else {**spec.attributes, **sample.phase_attributes}
        if extra:
            attrs = {**attrs, **extra}
        span = tracer.start_span(spec.name, attributes=attrs)
        token = otel_context.attach(trace.set_span_in_context(span)) if attach else None
        return span, token
    except Exception:
        internal_error("phase.start")
        return None


def finish(started: tuple[Span, object], exc: BaseException | None = None) -> None:
    """End a span from :func:`start`, recording ``exc`` if given. Never raises."""
    span, token = started
    try:
        if token is not None:
            otel_context.detach(token)  # type: ignore[arg-type]
    except Exception:
        internal_error("phase.detach")
    try:
        if exc is not None:
            mark_error(span, exc)
        span.end()
    except Exception:
        internal_error("phase.end")


def _wrap(fn: F, spec: PhaseSpec) -> F:
    if inspect.isasyncgenfunction(fn):
        @functools.wraps(fn)
        async def agen_wrapper(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
            started = start(spec, attach=False)  # a span attached across yields would leak into the consumer
            if started is None:
                async for item in fn(*args, **kwargs):
                    yield item
                return
            try:
                async for item in fn(*args, **kwargs):
                    yield item
            except BaseException as exc:
                finish(started, exc)
                raise
            finish(started)

        return agen_wrapper  # type: ignore[return-value]

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            started = start(spec)
            if started is None:
                return await fn(*args, **kwargs)
            try:
                result = await fn(*args, **kwargs)
            except BaseException as exc:
                finish(started, exc)
                raise
            finish(started)
            return result

        return async_wrapper  # type: ignore[return-value]

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen_wrapper(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
            started = start(spec, attach=False)
            if started is None:
                return (yield from fn(*args, **kwargs))
            try:
                result = yield from fn(*args, **kwargs)
            except BaseException as exc:
                finish(started, exc)
                raise
            finish(started)
            return result

        return gen_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
        started = start(spec)
        if started is None:
            return fn(*args, **kwargs)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            finish(started, exc)
            raise
        finish(started)
        return result

    return sync_wrapper  # type: ignore[return-value]


def phase(
    name: str,
    *,
    tool: str | None = None,
    model: str | None = None,
    operation: str | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> Callable[[F], F]:
    """Decorate a sync/async function, method or generator so each call is a span of verl phase ``name``.

    ``name`` is ``"generate_sequences"``, ``"tool_calls"`` or ``"compute_score"`` (aliases: ``generate``,
    ``tool``, ``reward``). Generation spans are named ``{operation} {model}`` (GenAI, default operation
    ``text_completion``); tool spans ``execute_tool {tool}`` (default: the function's name); reward spans
    ``rl.reward``. The wrapper keeps ``__wrapped__``, so ``inspect.signature`` and Ray see the original.

    Raises ``ValueError`` for an unknown phase and ``TypeError`` for a non-callable, at decoration time.
    """
    PhaseSpec.build(name, tool=tool, model=model, operation=operation, attributes=attributes)  # validate now

    def decorator(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"@phase({name!r}) must decorate a function or method, not {type(fn).__name__}")
        if isinstance(fn, (staticmethod, classmethod)):
            raise TypeError(f"put @phase({name!r}) below @staticmethod/@classmethod, not above")
        spec = PhaseSpec.build(
            name, tool=tool, model=model, operation=operation, attributes=attributes,
            default_tool=getattr(fn, "__name__", None),
        )
        return _wrap(fn, spec)

    return decorator


@overload
def trace_generate(fn: F, /) -> F: ...
@overload
def trace_generate(*, model: str | None = None, operation: str | None = None) -> Callable[[F], F]: ...
def trace_generate(fn: Any = None, /, *, model: str | None = None, operation: str | None = None) -> Any:
    """``@phase("generate_sequences")``; usable bare (``@trace_generate``) or with ``model=``."""
    deco = phase(sc.GENERATE, model=model, operation=operation)
    return deco if fn is None else deco(fn)


def trace_tool(name: str | None = None) -> Callable[[F], F]:
    """``@phase("tool_calls", tool=name)``: one ``execute_tool {name}`` span per call."""
    if name is not None and not isinstance(name, str):
        raise TypeError("trace_tool(name) takes the tool's name; use @trace_tool() to name it after the function")
    return phase(sc.TOOL_CALLS, tool=name)


@overload
def trace_reward(fn: F, /) -> F: ...
@overload
def trace_reward() -> Callable[[F], F]: ...
def trace_reward(fn: Any = None, /) -> Any:
    """``@phase("compute_score")``; usable bare (``@trace_reward``) or called."""
    deco = phase(sc.COMPUTE_SCORE)
    return deco if fn is None else deco(fn)


class span:  # noqa: N801 - used like a function: ``with otel_agentloop.span("tool_calls"):``
    """A phase span around a block, for call sites that time a block (verl's ``simple_timer``) not a function.

    Create one per use: ``with span("tool_calls"): await asyncio.gather(...)``. Same contract as :func:`phase`.
    """

    __slots__ = ("_extra", "_spec", "_started")

    def __init__(
        self,
        name: str,
        *,
        tool: str | None = None,
        model: str | None = None,
        operation: str | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> None:
        self._spec = PhaseSpec.build(name, tool=tool, model=model, operation=operation, attributes=attributes)
        self._started: tuple[Span, object] | None = None

    def __enter__(self) -> Span:
        self._started = start(self._spec)
        return self._started[0] if self._started is not None else trace.INVALID_SPAN

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        started, self._started = self._started, None
        if started is not None:
            finish(started, exc)

    async def __aenter__(self) -> Span:
        return self.__enter__()

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(et, exc, tb)
