"""Phase decorators and spans: the hot path, and the one span lifecycle every wrapper uses.

Everything that can be decided when a function is decorated is decided then (span name, static attributes,
sync/async/generator/async-generator wrapper: :func:`instrument`). Per call, with tracing off, the wrapper
costs one function call and one check; with tracing on, it starts one span with ``start_span`` and attaches it
explicitly (no generator-based context managers). The user's exception is recorded on the span and re-raised
unchanged; an exception in our own code is logged once and swallowed. ``trainer_phase`` and
``integrations.ray.traced_remote`` plug their own :class:`Scope` into the same :func:`instrument`.
A phase span started below a sample the in-flight registry tracks is handed to it here, with the phase and
tool decided at decoration time (``InflightRegistry.phase_started``/``phase_ended``): no span processor
reads its attributes back.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncGenerator, Callable, Generator, Mapping
from types import TracebackType
from typing import Any, TypeVar, overload

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, Tracer
from opentelemetry.util.types import AttributeValue

from .. import semconv as sc
from ._clock import clock_offset, monotonic_ns, start_anchored
from ._context import _SAMPLE, clean_attributes, mark_error, restore_identity
from ._guard import internal_error
from ._kinds import is_async_callable, is_asyncgen_callable, is_gen_callable
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
    """What a phase span looks like: name and static attributes (``tool``: its ``gen_ai.tool.name``, for the
    in-flight registry). Immutable and picklable (no SDK objects)."""

    __slots__ = ("attributes", "name", "phase", "tool")

    def __init__(self, phase: str, name: str, attributes: Mapping[str, AttributeValue]) -> None:
        self.phase = phase
        self.name = name
        self.attributes = dict(attributes)
        tool = self.attributes.get(sc.GEN_AI_TOOL_NAME)
        self.tool = tool if isinstance(tool, str) else None

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
        attrs: dict[str, AttributeValue] = {sc.RL_PHASE: key}  # ours go after the user's (see below)
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
        if attributes:  # the user's first: a count limit evicts the oldest, never the identity
            attrs = {**clean_attributes(attributes), **attrs}
        return cls(key, name, attrs)


class Scope:
    """One call's instrumentation, driven by :func:`instrument`: ``enter``/``leave`` make it current (around
    the whole call, or around each resume of a generator), ``close(exc)`` ends it once. Implementations never
    raise from these methods (internal errors are logged once and swallowed)."""

    __slots__ = ()

    def enter(self) -> None:
        return None

    def leave(self) -> None:
        return None

    def close(self, exc: BaseException | None) -> None:
        return None

    def exit(self, exc: BaseException | None) -> None:
        """``leave()`` then ``close(exc)``: the end of a plain call."""
        self.leave()
        self.close(exc)


Begin = Callable[[dict[str, Any]], "Scope | None"]
"""Opens one call's scope, entered, from the call's keyword arguments (it may pop its own); ``None`` when
off."""

_NOOP = Scope()


class SpanScope(Scope):
    """A started span: current while entered, ended by ``close`` with the user's exception recorded.

    ``offset``: the span's clock offset (:func:`~otel_agentloop.core._clock.clock_offset`): it ends at
    ``monotonic_ns() + offset``, so its duration is monotonic; ``None``: it ends on the SDK's wall clock.
    ``live``: the in-flight registry tracking this span under this scope (told once the span has ended)."""

    __slots__ = ("identity", "live", "offset", "span", "token")

    def __init__(
        self,
        span: Span,
        identity: Mapping[str, object] | None = None,
        enter: bool = False,
        offset: int | None = None,
    ) -> None:
        self.span = span
        self.identity = identity  # the attributes it started with: identity is restored from them at the end
        self.offset = offset
        self.token: object = None
        self.live: Any = None
        if enter:
            try:
                self.token = otel_context.attach(trace.set_span_in_context(span))
            except Exception:
                internal_error("span.attach")

    def enter(self) -> None:
        try:
            self.token = otel_context.attach(trace.set_span_in_context(self.span))
        except Exception:
            internal_error("span.attach")

    def leave(self) -> None:
        token, self.token = self.token, None
        if token is not None:
            try:
                otel_context.detach(token)  # type: ignore[arg-type]
            except Exception:
                internal_error("span.detach")

    def close(self, exc: BaseException | None) -> None:
        offset = self.offset
        end_span(self.span, exc, self.identity, None if offset is None else monotonic_ns() + offset)
        if self.live is not None:
            self.live.phase_ended(self, self.span)

    def exit(self, exc: BaseException | None) -> None:  # leave() + close(), inlined: the hot path
        token, self.token = self.token, None
        if token is not None:
            try:
                otel_context.detach(token)  # type: ignore[arg-type]
            except Exception:
                internal_error("span.detach")
        span = self.span
        offset = self.offset
        now = monotonic_ns()
        try:
            if exc is not None:
                mark_error(span, exc)
            if self.identity is not None:
                try:
                    dropped = span._attributes.dropped  # type: ignore[attr-defined]
                except AttributeError:  # not the SDK's span
                    dropped = 0
                if dropped:
                    restore_identity(span, self.identity)
            span.end(None if offset is None else now + offset)
        except Exception:
            internal_error("span.end")
        live = self.live
        if live is not None:  # InflightRegistry.phase_ended, inlined (see InflightRegistry)
            try:
                rec = live._phases.pop(self, None)  # atomic under the GIL: no lock
                if rec is not None:
                    if rec[4] is not None:
                        rec[4].append(now - rec[3])  # monotonic: the span's end - start when anchored
                    if live.keep_ended:
                        live.queue_ended(rec, span)
            except Exception:
                internal_error("span.live")

    def end_at(self, end_time: int | None) -> None:
        """Leave, then end the span at ``end_time`` (ns since the epoch; now when ``None``): for a duration
        measured elsewhere (verl's timers). The in-flight registry is told, as by ``exit``. Never raises."""
        self.leave()
        try:
            if end_time is None and self.offset is not None:
                end_time = monotonic_ns() + self.offset
            self.span.end(end_time=end_time)
        except Exception:
            internal_error("span.end")
        if self.live is not None:
            self.live.phase_ended(self, self.span)

    def __getitem__(self, i: int) -> Any:
        """``(span, token)[i]``: the tuple :func:`start` used to return."""
        return (self.span, self.token)[i]


def end_span(
    span: Span,
    exc: BaseException | None = None,
    identity: Mapping[str, object] | None = None,
    end_time: int | None = None,
) -> None:
    """End ``span`` at ``end_time`` (ns since the epoch; the SDK's clock when ``None``), recording ``exc`` if
    given and restoring the ``identity`` attributes it started with if a count limit evicted them. Never
    raises."""
    try:
        if exc is not None:
            mark_error(span, exc)
        if identity is not None:
            restore_identity(span, identity)
        span.end(end_time)
    except Exception:
        internal_error("span.end")


def start(
    spec: PhaseSpec,
    attach: bool = True,
    extra: Mapping[str, AttributeValue] | None = None,
) -> SpanScope | None:
    """Start ``spec``'s span below the current context (entered when ``attach``); ``None`` when tracing is off
    or on internal failure. The sample's identity goes last: an attribute count limit evicts the oldest."""
    tracer = current_tracer()
    if tracer is None:
        return None
    scope = _start(tracer, spec, extra)
    if attach and scope is not None:
        scope.enter()
    return scope


def _start(tracer: Tracer, spec: PhaseSpec, extra: Mapping[str, AttributeValue] | None = None) -> SpanScope | None:
    try:
        sample = _SAMPLE.get()
        attrs = spec.attributes if sample is None else {**spec.attributes, **sample.phase_attributes}
        if extra:
            attrs = {**clean_attributes(extra), **attrs}
        mono = monotonic_ns()
        offset = sample.clock_offset if sample is not None else None
        span, offset = start_anchored(tracer, spec.name, attrs, offset, mono)
        scope = SpanScope(span, attrs, False, offset)
        live = sample.live if sample is not None else None
        if live is not None:
            scope.live = live.registry.phase_started(scope, live, spec.phase, spec.tool, span, mono)
        return scope
    except Exception:
        internal_error("phase.start")
        return None


def finish(started: Scope, exc: BaseException | None = None) -> None:
    """End a scope from :func:`start` (leaving it first), recording ``exc`` if given. Never raises."""
    started.exit(exc)


# -- one lifecycle for every wrapper ------------------------------------------------------------------
_awaitable_types: dict[type, bool] = {}


def _is_awaitable(value: object) -> bool:
    t = type(value)
    known = _awaitable_types.get(t)
    if known is None:
        known = hasattr(t, "__await__")
        if len(_awaitable_types) < 1024:
            _awaitable_types[t] = known
    return known


async def _finish_after(awaitable: Any, scope: Scope) -> Any:
    scope.enter()
    try:
        result = await awaitable
    except BaseException as exc:
        scope.exit(exc)
        raise
    scope.exit(None)
    return result


def _future_done(scope: Scope) -> Callable[[Any], None]:
    def done(future: Any) -> None:
        try:
            exc = asyncio.CancelledError() if future.cancelled() else future.exception()
        except BaseException as err:
            exc = err
        scope.close(exc)

    return done


def _timed_result(result: Any, scope: Scope) -> Any:
    """``result`` of a sync call that returned an awaitable: the scope ends when it completes. A coroutine is
    wrapped in a coroutine; a future (asyncio's or ``concurrent.futures``', a Ray ``ObjectRef``) keeps its
    identity and a done callback ends the scope. Any other awaitable is returned as is and timed until
    returned (wrapping it would change what the caller holds)."""
    try:
        if inspect.iscoroutine(result):
            return _finish_after(result, scope)
        add_done = getattr(result, "add_done_callback", None)
        if add_done is None and type(result).__name__ == "ObjectRef" and hasattr(result, "future"):
            add_done = result.future().add_done_callback  # Ray: completion through its concurrent future
        if add_done is not None:
            add_done(_future_done(scope))
            return result
    except Exception:
        internal_error("instrument.awaitable")
    scope.close(None)
    return result


def _wraps(fn: Any) -> Callable[[F], F]:
    def apply(wrapper: F) -> F:
        try:
            functools.update_wrapper(wrapper, fn)
        except Exception:  # callables without __name__ & co.
            wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper

    return apply


def instrument(fn: F, begin: Begin) -> F:
    """Wrap ``fn`` so each call runs in a :class:`Scope` from ``begin(kwargs)``; the one lifecycle of every
    wrapper (``phase``/``trace_*``, ``trainer_phase``, ``traced_remote``).

    The kind is decided here, once: async functions (and objects with ``async def __call__``) are timed until
    they return; generators and async generators from the first step to exhaustion, close or error, driven
    by hand so ``send``/``throw``/``close`` and ``asend``/``athrow``/``aclose`` behave exactly as without the
    wrapper, with the scope current only while the generator runs (never in the consumer). A sync callable
    that returns an awaitable is timed until the awaitable completes. The user's exception is recorded and
    re-raised unchanged; cancellation and ``GeneratorExit`` are not errors.

    The wrapper holds ``fn`` and ``begin`` in its closure, so it pickles by value (what Ray's cloudpickle
    does with a function of the user's ``__main__``) exactly when ``begin`` does: make it a bound method of
    an importable class (:class:`PhaseBegin`) or a closure over plain values, never over a ContextVar, lock
    or SDK object.
    """
    if is_asyncgen_callable(fn):

        @_wraps(fn)
        async def agen_wrapper(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
            scope = begin(kwargs) or _NOOP  # entered
            try:
                agen = fn(*args, **kwargs)
                value = await agen.__anext__()
            except StopAsyncIteration:
                scope.exit(None)
                return
            except BaseException as exc:
                scope.exit(exc)
                raise
            scope.leave()
            while True:
                sent: Any = None
                thrown: BaseException | None = None
                try:
                    sent = yield value
                except GeneratorExit as stop:
                    scope.enter()
                    try:
                        await agen.aclose()
                    except BaseException as exc:
                        scope.exit(exc)
                        raise
                    scope.exit(stop)
                    raise
                except BaseException as exc:
                    thrown = exc
                scope.enter()
                try:
                    value = await (agen.asend(sent) if thrown is None else agen.athrow(thrown))
                except StopAsyncIteration:
                    scope.exit(None)
                    return
                except BaseException as exc:
                    scope.exit(exc)
                    raise
                scope.leave()

        return agen_wrapper  # type: ignore[return-value]

    if is_async_callable(fn):

        @_wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            scope = begin(kwargs)  # entered
            if scope is None:
                return await fn(*args, **kwargs)
            try:
                result = await fn(*args, **kwargs)
            except BaseException as exc:
                scope.exit(exc)
                raise
            scope.exit(None)
            return result

        return async_wrapper  # type: ignore[return-value]

    if is_gen_callable(fn):

        @_wraps(fn)
        def gen_wrapper(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
            scope = begin(kwargs)  # entered
            if scope is None:
                return (yield from fn(*args, **kwargs))
            try:
                gen = fn(*args, **kwargs)
                value = next(gen)
            except StopIteration as done:
                scope.exit(None)
                return done.value
            except BaseException as exc:
                scope.exit(exc)
                raise
            scope.leave()
            while True:
                sent: Any = None
                thrown: BaseException | None = None
                try:
                    sent = yield value
                except GeneratorExit as stop:
                    scope.enter()
                    try:
                        gen.close()
                    except BaseException as exc:
                        scope.exit(exc)
                        raise
                    scope.exit(stop)
                    raise
                except BaseException as exc:
                    thrown = exc
                scope.enter()
                try:
                    value = gen.send(sent) if thrown is None else gen.throw(thrown)
                except StopIteration as done:
                    scope.exit(None)
                    return done.value
                except BaseException as exc:
                    scope.exit(exc)
                    raise
                scope.leave()

        return gen_wrapper  # type: ignore[return-value]

    @_wraps(fn)
    def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
        scope = begin(kwargs)  # entered
        if scope is None:
            return fn(*args, **kwargs)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            scope.exit(exc)
            raise
        if result is not None and _is_awaitable(result):
            scope.leave()
            return _timed_result(result, scope)
        scope.exit(None)
        return result

    return sync_wrapper  # type: ignore[return-value]


class PhaseBegin:
    """``begin`` of :func:`instrument` for ``phase``/``trace_*``: opens one call's phase span of ``spec``.

    The per-decoration state lives in this slotted object of an importable class, not in a closure: Ray's
    cloudpickle pickles a function decorated in the user's ``__main__`` by value, with its closure and the
    globals its code names, and a ContextVar, lock or SDK object there cannot be pickled. This pickles as
    the class (by reference) and the spec; everything per process (tracer, current sample) is looked up
    per call.
    """

    __slots__ = ("attrs", "key", "name", "phase", "spec", "tool")

    def __init__(self, spec: PhaseSpec) -> None:
        self.spec = spec
        self.name, self.attrs, self.phase, self.tool = spec.name, spec.attributes, spec.phase, spec.tool
        self.key = (spec.phase, spec.tool)  # the in-flight registry's duration window

    def __reduce__(self) -> tuple[Any, ...]:
        return (PhaseBegin, (self.spec,))

    def begin(self, kwargs: dict[str, Any]) -> Scope | None:  # _start() inlined: this is the hot path
        tracer = current_tracer()
        if tracer is None:  # the whole cost when tracing is off: this call and begin's
            return None
        started: dict[str, AttributeValue] | None  # an annotation only: no runtime work
        try:
            sample = _SAMPLE.get()
            mono = monotonic_ns()
            if sample is None:
                span = tracer.start_span(self.name, attributes=self.attrs)
                return SpanScope(span, self.attrs, True, clock_offset(span, mono))
            spec = self.spec
            started = sample.merged.get(spec)
            if started is None:
                started = sample.merged[spec] = {**self.attrs, **sample.phase_attributes}
            offset = sample.clock_offset
            if offset is None:  # a sample entered while tracing was off: this span's own anchor
                span = tracer.start_span(self.name, attributes=started)
                offset = clock_offset(span, mono)
            else:  # on the sample's timeline (_clock.start_anchored, inlined): one monotonic reading, no wall one
                span = tracer.start_span(self.name, attributes=started, start_time=mono + offset)
            scope = SpanScope(span, started, True, offset)
            live = sample.live  # the in-flight registry's record of the sample: fed here, not by a processor
            if live is not None and live.tracked:  # InflightRegistry.phase_started, inlined (see InflightRegistry)
                try:
                    registry = live.registry
                    phases = registry._phases
                    if len(phases) < registry.max_phases:
                        key = self.key
                        window = registry.durations.get(key) if registry.learn else None
                        if window is None and registry.learn:
                            window = registry.window_for(key)
                        span._start_time  # type: ignore[attr-defined]  # noqa: B018 - the SDK's span, or not tracked
                        phases[scope] = (live, self.phase, self.tool, mono, window)
                        scope.live = registry
                    else:
                        registry.phases_untracked += 1
                except AttributeError:  # not the SDK's span (no start time): not tracked
                    pass
                except Exception:
                    internal_error("phase.live")
            return scope
        except Exception:
            internal_error("phase.start")
            return None


def _wrap(fn: F, spec: PhaseSpec) -> F:
    return instrument(fn, PhaseBegin(spec).begin)  # a bound method: pickles as (PhaseBegin, spec), never a closure


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
            name,
            tool=tool,
            model=model,
            operation=operation,
            attributes=attributes,
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
        self._started: SpanScope | None = None

    def __enter__(self) -> Span:
        self._started = start(self._spec)
        return self._started.span if self._started is not None else trace.INVALID_SPAN

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        started, self._started = self._started, None
        if started is not None:
            started.exit(exc)

    async def __aenter__(self) -> Span:
        return self.__enter__()

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(et, exc, tb)
