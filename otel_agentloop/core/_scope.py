"""What a wrapper drives: :class:`Scope` (one call's instrumentation) and :class:`OpenSpan` (a started span).

Every span this library starts is an :class:`OpenSpan`: a :class:`~otel_agentloop.core._record.FastSpan` (the
fast path's record) or an :class:`~otel_agentloop.core._lifecycle.SdkScope` (an OpenTelemetry SDK span). Both
are started and ended by :mod:`~otel_agentloop.core._lifecycle` alone, and both carry the fields the in-flight
registry reads (:class:`~otel_agentloop.core._inflight.InflightRegistry`): the registry protocol is written
here, once, as typed slots.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import context as otel_context

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

Begin = Callable[[dict[str, Any]], "Scope | None"]
"""Opens one call's scope, entered, from the call's keyword arguments (it may pop its own); ``None`` when
off."""


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

    token: object

    def leave(self) -> None:
        """Detach the context entering attached (nothing when not entered). Never raises."""
        token, self.token = self.token, None
        if token is not None:
            try:
                otel_context.detach(token)  # type: ignore[arg-type]
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
        self.sample: Any = None
        self.phase: str | None = None
        self.tool: str | None = None
        self.window: Any = None
        self.tracked: Any = None  # the InflightRegistry tracking this span, or None


def span_of(scope: OpenSpan) -> Any:
    """The OpenTelemetry span of ``scope``: the fast path's span is its own scope, an SDK span is held by it."""
    span = getattr(scope, "span", None)
    return scope if span is None else span
