"""The one span lifecycle: :func:`open_span` starts every span this library makes, :func:`finish` ends it.

Every wrapper (``phase``/``trace_*``, ``span``, ``trainer_phase``, ``integrations.ray.traced_remote``), the
``step``/``sample`` scopes and both integrations start their spans here. With a fast-path recorder on the
provider (``configure(fast_path=True)``, the default) the span is a :class:`~.core._record.FastSpan`, ended by
:meth:`Recorder.finish <otel_agentloop.core._recorder.Recorder.finish>`; otherwise (``fast_path=False``, a
provider the library did not build, or a span the sampler drops) it is an SDK span in an :class:`SdkScope`,
ended by :meth:`SdkScope.close`. Both end on the span's monotonic timeline (:mod:`~.core._clock`), record the
user's exception (:func:`~.core._errors.mark_error`), keep the span's identity under a count limit and tell the
in-flight registry (:func:`track_phase`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from operator import attrgetter

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, Tracer
from opentelemetry.util.types import AttributeValue

from ._clock import monotonic_ns
from ._errors import mark_error, restore_identity
from ._guard import internal_error
from ._record import FastSpan
from ._recorder import START, Recorder
from ._scope import OpenSpan, TrackedSample
from ._tracer import current_recorder

_TIMES = attrgetter("_end_time", "_start_time")


class SdkScope(OpenSpan):
    """An OpenTelemetry SDK span started by :func:`open_span`: current while entered, ended by ``close``."""

    __slots__ = ("span",)

    def __init__(self, span: Span, offset: int | None, started: Mapping[str, object] | None, start_mono: int) -> None:
        self.span = span
        self.init(offset, started, start_mono)

    def enter(self) -> None:
        try:
            self.token = otel_context.attach(trace.set_span_in_context(self.span))
        except Exception:
            internal_error("span.attach")

    def close(self, exc: BaseException | None, end_time: int | None = None) -> None:
        span = self.span
        try:
            if exc is not None:
                mark_error(span, exc)
            if self.started is not None:
                restore_identity(span, self.started)
            if end_time is None and self.offset is not None:
                end_time = monotonic_ns() + self.offset
            span.end(end_time)
        except Exception:
            internal_error("span.end")
        registry = self.tracked
        if registry is not None:
            registry.phase_ended(self)

    def duration_ns(self) -> int:
        end, start = _TIMES(self.span)  # the SDK span's own ints (its public times are optional)
        return int(end - start)


def open_span(
    tracer: Tracer,
    name: str,
    attributes: dict[str, AttributeValue],
    offset: int | None = None,
    *,
    context: Context | None = None,
    links: Sequence[Link] | None = None,
    enter: bool = True,
) -> OpenSpan | None:
    """Start span ``name`` with ``attributes`` (by reference: the caller never changes them afterwards) below
    ``context`` (``None``: the current one; ``Context()``: a new trace), entered when ``enter``. ``offset``: the
    timeline to start on (a sample's, see :mod:`~.core._clock`); ``None``: anchored on its own wall-clock start.
    ``tracer`` is :func:`~.core._tracer.current_tracer`'s (not ``None``). ``None`` on internal failure; never
    raises."""
    try:
        mono = monotonic_ns()
        recorder = current_recorder()
        scope: OpenSpan | None = None
        if recorder is not None:
            scope = _open_fast(recorder, name, attributes, offset, mono, context, links)
        if scope is None:
            if offset is None:  # the wall clock read now, not inside start_span (after a slow sampler)
                offset = time.time_ns() - mono
            span = tracer.start_span(
                name, context=context, attributes=attributes, links=links, start_time=mono + offset
            )
            scope = SdkScope(span, offset, attributes, mono)
        if enter:
            scope.enter()
        return scope
    except Exception:
        internal_error("span.start")
        return None


def _open_fast(
    recorder: Recorder,
    name: str,
    attributes: dict[str, AttributeValue],
    offset: int | None,
    mono: int,
    context: Context | None,
    links: Sequence[Link] | None,
) -> OpenSpan | None:
    if offset is None:
        start = time.time_ns()
        offset = start - mono
    else:
        start = mono + offset
    span = recorder.start(
        name, attributes, start, None if context is None else trace.get_current_span(context), context, links
    )
    if span is not None:
        span.init(offset, attributes, mono)
    return span


def finish(scope: OpenSpan, exc: BaseException | None = None, end_time: int | None = None) -> None:
    """Leave ``scope`` and end its span at ``end_time`` (ns since the epoch; ``None``: now on its timeline, the
    usual case; a time for a duration measured elsewhere, verl's timers), recording ``exc``. Never raises."""
    scope.leave()
    scope.close(exc, end_time)


def announce(scope: OpenSpan) -> None:
    """Tell the export pipeline that ``scope``, a sample's root span, has started (the metrics count running
    samples). The hot path's own choice of span type, not a consumer's: a record is announced here; an SDK
    span announces itself as it starts, through the provider's door (``export._pipeline``)."""
    if isinstance(scope, FastSpan):
        scope.recorder.put((START, scope))


def track_phase(scope: OpenSpan, sample: TrackedSample, phase: str, tool: str | None) -> None:
    """Hand ``scope``, a phase span of the tracked ``sample`` (``SampleHandle.tracked_sample``), to its in-flight
    registry. Never raises."""
    try:
        sample.registry.phase_started(scope, sample, phase, tool)
    except Exception:
        internal_error("phase.live")
