"""Phase decorators and blocks: the hot path.

Everything that can be decided when a function is decorated is decided then (span name, static attributes,
the wrapper's kind: :func:`~otel_agentloop.core._instrument.instrument`). Per call, with tracing off, the
wrapper costs one function call and one check; with tracing on, :class:`PhaseBegin` opens one span through
the library's one lifecycle (:func:`~otel_agentloop.core._lifecycle.open_span`: a fast-path record, or an SDK
span) with the sample's identity, and hands it to the in-flight registry with the phase and tool decided at
decoration time. The user's exception is recorded on the span and re-raised unchanged; an exception in our
own code is logged once and swallowed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TypeVar, overload

from opentelemetry import trace
from opentelemetry.trace import Link, Span, Tracer
from opentelemetry.util.types import AttributeValue

from .. import semconv as sc
from ._current import _SAMPLE
from ._guard import internal_error
from ._instrument import instrument
from ._lifecycle import finish, open_span, track_phase
from ._scope import AsyncWith, OpenSpan, Scope, span_of
from ._tracer import current_tracer
from ._values import clean_attributes

F = TypeVar("F", bound=Callable[..., object])

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

    def __reduce__(self) -> tuple[object, ...]:
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


class PhaseBegin:
    """``begin`` of :func:`instrument` for ``phase``/``trace_*``: opens one call's phase span of ``spec``.

    The per-decoration state lives in this slotted object of an importable class, not in a closure: Ray's
    cloudpickle pickles a function decorated in the user's ``__main__`` by value, with its closure and the
    globals its code names, and a ContextVar, lock or SDK object there cannot be pickled. This pickles as
    the class (by reference) and the spec; everything per process (tracer, current sample) is looked up
    per call.
    """

    __slots__ = ("attrs", "name", "phase", "spec", "tool")

    def __init__(self, spec: PhaseSpec) -> None:
        self.spec = spec
        self.name, self.attrs, self.phase, self.tool = spec.name, spec.attributes, spec.phase, spec.tool

    def __reduce__(self) -> tuple[object, ...]:
        return (PhaseBegin, (self.spec,))

    def begin(self, kwargs: dict[str, object]) -> Scope | None:
        """The hot path: one span, entered; ``None`` when tracing is off (the whole cost then: this call and
        ``current_tracer``'s)."""
        tracer = current_tracer()
        if tracer is None:
            return None
        return self.open(tracer, None, True)

    def open(
        self,
        tracer: Tracer,
        extra: Mapping[str, AttributeValue] | None,
        enter: bool,
        links: Sequence[Link] | None = None,
    ) -> OpenSpan | None:
        """Open this phase's span below the current context, with the current sample's identity (last: an
        attribute count limit evicts the oldest), ``extra`` attributes (first) and ``links``. Never raises."""
        try:
            sample = _SAMPLE.get()
            if sample is None:
                attrs = self.attrs if not extra else {**clean_attributes(extra), **self.attrs}
                return open_span(tracer, self.name, attrs, None, links=links, enter=enter)
            spec = self.spec
            merged = sample.merged.get(spec)  # built once per sample and spec, shared by its spans (by reference)
            if merged is None:
                merged = sample.merged[spec] = {**self.attrs, **sample.phase_attributes}
            attrs = merged
            if extra:
                attrs = {**clean_attributes(extra), **attrs}
            scope = open_span(tracer, self.name, attrs, sample.clock_offset, links=links, enter=enter)
            tracked = sample.tracked_sample
            if scope is not None and tracked is not None and tracked.tracked:
                track_phase(scope, tracked, self.phase, self.tool)
            return scope
        except Exception:
            internal_error("phase.start")
            return None


def start(
    spec: PhaseSpec,
    attach: bool = True,
    extra: Mapping[str, AttributeValue] | None = None,
    links: Sequence[Link] | None = None,
) -> OpenSpan | None:
    """Start ``spec``'s span below the current context (entered when ``attach``): for call sites that time a
    block (``span``, the verl integration); end it with :func:`~otel_agentloop.core._lifecycle.finish`.
    ``None`` when tracing is off or on internal failure."""
    tracer = current_tracer()
    if tracer is None:
        return None
    return PhaseBegin(spec).open(tracer, extra, attach, links)


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
def trace_generate(
    fn: F | None = None, /, *, model: str | None = None, operation: str | None = None
) -> F | Callable[[F], F]:
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
def trace_reward(fn: F | None = None, /) -> F | Callable[[F], F]:
    """``@phase("compute_score")``; usable bare (``@trace_reward``) or called."""
    deco = phase(sc.COMPUTE_SCORE)
    return deco if fn is None else deco(fn)


class span(AsyncWith[Span]):  # noqa: N801 - used like a function: ``with otel_agentloop.span("tool_calls"):``
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
        self._started: OpenSpan | None = None

    def __enter__(self) -> Span:
        self._started = start(self._spec)
        return span_of(self._started) if self._started is not None else trace.INVALID_SPAN

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        started, self._started = self._started, None
        if started is not None:
            finish(started, exc)
