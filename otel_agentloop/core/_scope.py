"""What a wrapper drives: :class:`Scope` (one call's instrumentation) and :class:`OpenSpan` (a started span).

Every span this library starts is an :class:`OpenSpan`: a :class:`~otel_agentloop.core._record.FastSpan` (the
fast path's record) or an :class:`~otel_agentloop.core._lifecycle.SdkScope` (an OpenTelemetry SDK span). Both
are started and ended by :mod:`~otel_agentloop.core._lifecycle` alone, and both carry the fields the in-flight
registry reads (:class:`~otel_agentloop.core._inflight.InflightRegistry`): the registry protocol is written
here, once, below both: typed slots, the registry's record of a sample (:class:`TrackedSample`) and the calls a
tracked span makes on its registry (:class:`PhaseRegistry`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from contextvars import Token
from operator import attrgetter
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context

from .. import semconv as sc
from ._guard import internal_error


class Scope:
    """One call's instrumentation, driven by :func:`~otel_agentloop.core._instrument.instrument`: ``enter``/``leave``
    make it current (around the whole call, or around each resume of a generator), ``close(exc)`` ends it once.
    Implementations never raise from these methods (internal errors are logged once and swallowed)."""

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


NOOP = Scope()
"""The scope of a call made while tracing is off."""

Begin = Callable[[dict[str, object]], "Scope | None"]
"""Opens one call's scope, entered, from the call's keyword arguments (it may pop its own); ``None`` when
off."""

B = TypeVar("B")


class AsyncWith(Generic[B]):
    """A ``with`` block that is an ``async with`` block too, the same block (its enter and exit never await):
    ``span``, ``trainer_phase``, ``step`` and ``sample`` define ``__enter__`` and ``__exit__``, once."""

    __slots__ = ()

    def __enter__(self) -> B:
        raise NotImplementedError

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> B:
        return self.__enter__()

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.__exit__(et, exc, tb)


class OpenSpan(Scope):
    """A started span and what ending it needs. Written once at start by ``_lifecycle``; read by the in-flight
    registry while the span is open.

    ``token``: the context token while entered. ``offset``: the span ends at ``monotonic_ns() + offset``
    (:mod:`~otel_agentloop.core._clock`), ``None``: on the SDK's clock. ``started``: the attributes it started
    with (its identity is restored from them if a count limit evicted it).

    The in-flight registry protocol: ``sample`` (the registry's record of the span's sample, ``None`` when not
    tracked), ``phase`` and ``tool`` (decided at decoration time), ``start_mono`` (``time.monotonic_ns`` at the
    start), ``window`` (the registry's duration window of (phase, tool), ``None`` when not learning). The
    registry sets ``tracked`` (``phase_started``) and clears it (``phase_ended``).
    """

    __slots__ = ("offset", "phase", "sample", "start_mono", "started", "token", "tool", "tracked", "window")

    token: Token[Context] | None

    def leave(self) -> None:
        """Detach the context entering attached (nothing when not entered). Never raises."""
        token, self.token = self.token, None
        if token is not None:
            try:
                otel_context.detach(token)
            except Exception:
                internal_error("span.detach")

    def close(self, exc: BaseException | None, end_time: int | None = None) -> None:
        """End the span at ``end_time`` (ns since the epoch; ``None``: now on its monotonic timeline), recording
        ``exc``; tell the in-flight registry. Never raises."""

    def init(self, offset: int | None, started: Mapping[str, object] | None, start_mono: int) -> None:
        self.offset = offset
        self.started = started
        self.start_mono = start_mono
        self.token = None
        self.sample: TrackedSample | None = None
        self.phase: str | None = None
        self.tool: str | None = None
        self.window: deque[int] | None = None
        self.tracked: PhaseRegistry | None = None  # the InflightRegistry tracking this span, or None

    def duration_ns(self) -> int:
        """How long the ended span lasted (its end minus its start, ns)."""
        raise NotImplementedError


class PhaseRegistry(Protocol):
    """The in-flight registry (:class:`~otel_agentloop.core._inflight.InflightRegistry`) as the span lifecycle
    calls it once a sample is tracked: declared here, below both."""

    def phase_started(self, span: OpenSpan, sample: TrackedSample, phase: str, tool: str | None) -> None: ...

    def phase_ended(self, span: OpenSpan) -> None: ...

    def sample_ended(self, sample: TrackedSample, span: trace.Span) -> None: ...


class TrackedSample:
    """The in-flight registry's record of a running sample (fields written once at start, ``tripped``/``ended``/
    ``tracked`` flags later). ``tracked``: still in its registry (not ended, evicted, or inherited across a
    ``fork``)."""

    __slots__ = (
        "ended",
        "index",
        "name",
        "registry",
        "rollout",
        "span_id",
        "start_mono_ns",
        "start_ns",
        "step",
        "trace_flags",
        "trace_id",
        "tracked",
        "tripped",
        "validate",
        "worker",
    )

    def __init__(
        self,
        registry: PhaseRegistry,
        attrs: Mapping[str, Any],  # attribute values: the sample's identity, as the library wrote it
        name: str,
        trace_id: int,
        span_id: int,
        trace_flags: int,
        start_ns: int,
        start_mono_ns: int,
    ) -> None:
        self.registry = registry
        get = attrs.get
        self.step, self.validate = sc.step_key(attrs)
        self.index: int | None = get(sc.RL_SAMPLE_INDEX)
        self.rollout: int | None = get(sc.RL_ROLLOUT_N)
        self.worker: str | None = get(sc.RL_WORKER)
        self.name = name
        self.trace_id = trace_id
        self.span_id = span_id
        self.trace_flags = trace_flags
        self.start_ns = start_ns  # the root span's start: wall clock, ns since the epoch
        self.start_mono_ns = start_mono_ns  # the same instant on the monotonic clock: ages are measured from it
        self.tripped = False
        self.ended = False
        self.tracked = True


span_of: Callable[[OpenSpan], trace.Span] = attrgetter("span")
"""The OpenTelemetry span of a scope: an SDK span is held by its scope (``SdkScope.span``), the fast path's span
is its own scope (``FastSpan.span`` is itself). An ``attrgetter``: as cheap as one attribute read, and typed."""
