"""The fast path's span: a compact record that is also the OpenTelemetry span in the context, and the one span
type the library's processors and encoders receive (an SDK span is adapted into one at ``core._door``).

A :class:`FastSpan` is what the hot path makes instead of an SDK span: ids, wall-clock start and end (on the
monotonic clock, see :mod:`~otel_agentloop.core._clock`), and the attributes *by reference* (a sample's phase
spans share one dict until one of them is written to: copy on write). It implements the OpenTelemetry
``Span`` API, so user code that reads ``trace.get_current_span()`` (``record_generation``, ``set_attribute``,
``add_event``) and the user's own SDK spans opened inside it (its children, through the context) work as with
an SDK span.

Every value written through the ``Span`` API is checked, converted and bounded the moment it is written, with
the provider's limits and the SDK's rules (:mod:`~otel_agentloop.core._values`): invalid keys dropped and
counted, values converted (nested strings cut), the oldest attribute evicted over ``max_span_attributes``, the
newest ``max_events`` events and ``max_links`` links kept (the others counted), event and link attributes
limited, timestamps made ints. An open span's memory is bounded by the limits whatever the user writes; a bad
value never costs the span. Off the hot path (``core._recorder.finalize``, when the pipeline admits it): the
attributes it started with (shared, never written) are bounded, and a plain ``str`` attribute over the length
limit is cut (same result).

Read surface (for the pipeline, the encoders and every consumer of ended spans): ``name``, ``trace_id``,
``span_id``, ``parent_id`` (0: a root), ``parent_remote``, ``flags`` (W3C trace flags: bit 0 = sampled),
``trace_state``, ``kind_value`` (a ``SpanKind`` value), ``start_ns``, ``end_ns`` (0 while open),
``attributes``, ``status`` (a ``Status``), ``events`` (``None`` or a sequence of ``(name, attributes,
time_ns, dropped_attributes)``), ``links`` (a tuple of ``trace.Link``), ``dropped_attributes``,
``dropped_events``, ``dropped_links``, ``recorder`` (resource, instrumentation scope, limits); and the
``ReadableSpan``-style properties ``context``, ``parent``, ``start_time``, ``end_time``, ``kind``,
``resource``, ``instrumentation_scope``.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from itertools import islice
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, final

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
from opentelemetry.util import types

from ._errors import IDENTITY_KEYS, exception_event
from ._guard import internal_error, safe_str, warn_once
from ._scope import OpenSpan
from ._values import bound_attributes, clean_value, frozen_attributes, safe_repr, timestamp_ns

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan, SpanLimits
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope


class Sink(Protocol):
    """What a :class:`FastSpan` needs of the recorder that made it (``_recorder.Recorder``)."""

    resource: Resource
    scope: InstrumentationScope
    limits: SpanLimits

    def finish(self, span: FastSpan, exc: BaseException | None, end_time: int | None) -> None: ...

    def put(self, item: Queued, /) -> None: ...


Queued: TypeAlias = "FastSpan | ReadableSpan | tuple[object, FastSpan | ReadableSpan]"
"""What the record queue holds (``export._pipeline.RecordPipeline``): an ended span (a record, or an SDK span the
library's provider made), or ``(START, span)`` before a sample's root span (``core._recorder.START``)."""


_logger = logging.getLogger("otel_agentloop")
_SCALARS = frozenset((str, bool, int, float))
_DEFAULT_STATE = TraceState()
Event = tuple[str, Mapping[str, types.AnyValue], int, int]
"""A record's event: ``(name, attributes, time_ns, dropped_attributes)``."""
UNSET = Status(StatusCode.UNSET)
"""A span's status until one is set (shared: a Status is immutable)."""


@final
class FastSpan(OpenSpan, trace.Span):
    """One span on the fast path (see the module docstring). Created and ended by ``_lifecycle`` only; the
    user may set attributes, events and status on it, and end it, through the ``Span`` API."""

    __slots__ = ("attributes", "flags", "name", "parent_id", "recorder", "span_id", "start_ns", "trace_id")

    # Written later, or rarely: class-level defaults until then (one store less per span each; the instance
    # dict the OpenTelemetry ``Span`` base class gives every subclass holds them once written).
    end_ns: int = 0  # 0 while open
    parent_remote: bool = False
    trace_state: TraceState | None = None
    owned: bool = False  # False: ``attributes`` is shared (a sample's phase spans): copied before a write
    status: Status = UNSET
    events: deque[Event] | None = None  # at most ``max_events``: the newest
    links: tuple[Link, ...] = ()
    links_bounded: bool = False  # the links it started with bounded (``bound_links``)
    dropped_attributes: int = 0
    dropped_events: int = 0
    dropped_links: int = 0
    materialised: object = None  # the SDK span it was adapted from, or built from it (``core._door``)
    adapted: bool = False  # made from an SDK span (``core._door.to_record``)
    kind_value: int = 0  # its ``SpanKind``'s value: INTERNAL, unless adapted from an SDK span of another kind
    parent_context: Context | None = None  # the context it started in, kept only while a user's processor exists
    _context: SpanContext | None = None

    def __init__(
        self,
        recorder: Sink,
        name: str,
        trace_id: int,
        span_id: int,
        parent_id: int,
        flags: int,
        start_ns: int,
        attributes: dict[str, Any],
    ) -> None:
        self.recorder = recorder
        self.name = name
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id
        self.flags = flags
        self.start_ns = start_ns
        self.attributes = attributes

    # -- the scope a wrapper drives (see _scope.Scope) ---------------------------------------------------
    def enter(self) -> None:
        try:
            self.token = otel_context.attach(trace.set_span_in_context(self))
        except Exception:
            internal_error("span.attach")

    def close(self, exc: BaseException | None, end_time: int | None = None) -> None:
        self.recorder.finish(self, exc, end_time)

    def exit(self, exc: BaseException | None) -> None:
        self.leave()
        self.recorder.finish(self, exc, None)

    # -- the OpenTelemetry Span API: every value checked, converted and bounded here, as it is written --------
    def get_span_context(self) -> SpanContext:
        ctx = self._context
        if ctx is None:
            ctx = self._context = SpanContext(
                self.trace_id,
                self.span_id,
                is_remote=False,
                trace_flags=TraceFlags(self.flags),
                trace_state=self.trace_state or _DEFAULT_STATE,
            )
        return ctx

    def is_recording(self) -> bool:
        return self.end_ns == 0

    def set_attribute(self, key: str, value: types.AttributeValue) -> None:
        if self.end_ns:
            _logger.warning("Setting attribute on ended span.")
            return
        kind = type(value)
        if type(key) is not str or not key or kind not in _SCALARS:
            self._set_other(key, value)
            return
        # the common case inline: a key set again, or room left (a plain str over the length limit is cut off the
        # hot path, by ``core._recorder.finalize``: the same result, the reference the user's anyway)
        attrs = self.attributes
        if self.owned:
            if key in attrs:
                del attrs[key]  # re-setting a key makes it the newest, as the SDK's BoundedAttributes does
                attrs[key] = value
                return
            count = self.recorder.limits.max_span_attributes
            if count is None or len(attrs) < count:
                attrs[key] = value
                return
        try:
            self._put(key, value, self.recorder.limits.max_span_attributes)
        except Exception:  # another thread writing the same span while this one evicts
            internal_error("span.set_attribute")

    def _set_other(self, key: object, value: object) -> None:
        """``set_attribute`` past the common case: an invalid key dropped and counted (as the SDK's
        ``BoundedAttributes`` counts it), any other value converted as the SDK converts it. Never raises."""
        try:
            limits = self.recorder.limits
            count = limits.max_span_attributes
            if count == 0 or not isinstance(key, str) or not key:
                if count != 0:
                    warn_once("invalid-key", "otel_agentloop: invalid attribute key %s: dropped", safe_repr(key))
                self.dropped_attributes += 1
                return
            self._put(key, clean_value(value, limits.max_span_attribute_length), count)
        except Exception:
            internal_error("span.set_attribute")

    def _put(self, key: str, value: object, count: int | None) -> None:
        """Store one clean attribute as the SDK's ``BoundedAttributes`` does: re-setting a key makes it the newest;
        over ``count`` the oldest is evicted (counted). The shared dict is copied first (copy on write), bounded
        as the SDK's constructor would have bounded it."""
        attrs = self.attributes
        if not self.owned:
            attrs = self.attributes = dict(attrs)
            self.owned = True
            if count is not None and len(attrs) > count:
                self._evict(attrs, len(attrs) - count)
        if key in attrs:
            del attrs[key]
        elif count is not None and len(attrs) >= count:
            if count == 0:
                self.dropped_attributes += 1
                return
            self._evict(attrs, len(attrs) - count + 1)
        attrs[key] = value

    def _evict(self, attrs: dict[str, Any], n: int) -> None:
        for key in list(islice(attrs, n)):
            del attrs[key]
        self.dropped_attributes += n

    def set_attributes(self, attributes: Mapping[str, types.AttributeValue]) -> None:
        if self.end_ns:
            _logger.warning("Setting attribute on ended span.")
            return
        try:
            limits = self.recorder.limits
            count = limits.max_span_attributes
            cleaned, dropped = bound_attributes(attributes, 0 if count == 0 else None, limits.max_span_attribute_length)
            self.dropped_attributes += dropped
            for key, value in cleaned.items():
                self._put(key, value, count)
        except Exception:
            internal_error("span.set_attributes")

    def restore_identity(self, started: Mapping[str, object]) -> None:
        """Before the span ends, when its count limit evicted anything: write back each identity attribute it
        started with that is gone or changed (it becomes the newest), as ``_errors.restore_identity`` does for
        an SDK span. Never raises."""
        try:
            count = self.recorder.limits.max_span_attributes
            if count is None or (not self.dropped_attributes and len(self.attributes) <= count):
                return
            for key in IDENTITY_KEYS:
                if key in started and self.attributes.get(key) != started[key]:
                    self._put(key, started[key], count)
        except Exception:
            internal_error("span.restore_identity")

    def add_event(self, name: str, attributes: types.Attributes = None, timestamp: int | None = None) -> None:
        if self.end_ns:
            return
        try:
            limits = self.recorder.limits
            attrs, dropped = bound_attributes(attributes, limits.max_event_attributes, limits.max_attribute_length)
            events = self.events
            if events is None:
                events = self.events = deque(maxlen=limits.max_events)
            if len(events) == events.maxlen:
                self.dropped_events += 1  # the oldest goes, as the SDK's BoundedList drops it
            events.append((_text(name), attrs, timestamp_ns(timestamp), dropped))
        except Exception:
            internal_error("span.add_event")

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        if self.end_ns:
            return
        try:
            if not _valid_link(context, attributes):
                return
            limits = self.recorder.limits
            links = self.bound_links()
            attrs, dropped = bound_attributes(attributes, limits.max_link_attributes, limits.max_attribute_length)
            self.links = _newest((*links, Link(context, frozen_attributes(attrs, dropped))), limits.max_links, self)
        except Exception:
            internal_error("span.add_link")

    def bound_links(self) -> tuple[Link, ...]:
        """The links the span started with, bounded once as the SDK's span bounds them (invalid ones left out,
        attributes cleaned and limited, the newest ``max_links`` kept, the others counted)."""
        if self.links_bounded:
            return self.links
        self.links_bounded = True
        if self.links:
            limits = self.recorder.limits
            kept = []
            for link in self.links:
                if _valid_link(link.context, link.attributes):
                    attrs, dropped = bound_attributes(
                        link.attributes, limits.max_link_attributes, limits.max_attribute_length
                    )
                    kept.append(Link(link.context, frozen_attributes(attrs, dropped)))
            self.links = _newest(tuple(kept), limits.max_links, self)
        return self.links

    def update_name(self, name: str) -> None:
        if not self.end_ns:
            self.name = _text(name)

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self.end_ns:
            return
        if self.status.status_code is StatusCode.OK:
            return
        if isinstance(status, Status):
            if status.status_code is not StatusCode.UNSET:
                self.status = status
        elif isinstance(status, StatusCode) and status is not StatusCode.UNSET:
            self.status = Status(status, description)

    def record_exception(
        self,
        exception: BaseException,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        """As the SDK's ``Span.record_exception``: an ``exception`` event (``_errors.exception_event``). Never
        raises."""
        try:
            self.add_event("exception", exception_event(exception, attributes, escaped), timestamp)
        except Exception:
            internal_error("span.record_exception")

    def end(self, end_time: int | None = None) -> None:
        self.recorder.finish(self, None, None if end_time is None else timestamp_ns(end_time))

    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def span(self) -> FastSpan:
        """Itself: the fast path's span is its own scope (``core._scope.span_of``; an ``SdkScope`` holds its SDK
        span as ``span``)."""
        return self

    # -- the ReadableSpan-style read surface ------------------------------------------------------------------
    @property
    def context(self) -> SpanContext:
        return self.get_span_context()

    @property
    def parent(self) -> SpanContext | None:
        if not self.parent_id:
            return None
        return SpanContext(
            self.trace_id,
            self.parent_id,
            is_remote=self.parent_remote,
            trace_flags=TraceFlags(self.flags),
            trace_state=self.trace_state or _DEFAULT_STATE,
        )

    @property
    def start_time(self) -> int:
        return self.start_ns

    @property
    def end_time(self) -> int | None:
        return self.end_ns or None

    @property
    def kind(self) -> SpanKind:
        return SpanKind(self.kind_value)

    @property
    def resource(self) -> Resource:
        return self.recorder.resource

    @property
    def instrumentation_scope(self) -> InstrumentationScope:
        return self.recorder.scope

    def __repr__(self) -> str:
        return f"FastSpan({self.name!r}, trace_id={self.trace_id:032x}, span_id={self.span_id:016x})"


def _text(name: object) -> str:
    """A span or event name: the text of anything that is not a ``str`` (an encoder would fail on it)."""
    return name if type(name) is str else safe_str(name, 1 << 20)


def _valid_link(context: object, attributes: object) -> bool:
    """The SDK's ``_is_valid_link``: a valid context, or any context with attributes or a trace state."""
    return isinstance(context, SpanContext) and bool(context.is_valid or attributes or context.trace_state)


def _newest(links: tuple[Link, ...], limit: int | None, span: FastSpan) -> tuple[Link, ...]:
    """The newest ``limit`` of ``links``; the others counted in ``span.dropped_links`` (the SDK's BoundedList)."""
    if limit is None or len(links) <= limit:
        return links
    span.dropped_links += len(links) - limit
    return links[len(links) - limit :]


def span_ids(span: trace.Span) -> tuple[int, int, int, TraceState | None] | None:
    """``(trace_id, span_id, trace_flags, trace_state)`` of any API span; ``None`` for an invalid one. A
    record's from its fields: no ``SpanContext`` built for it on the hot path (~2 us)."""
    if type(span) is FastSpan:
        return span.trace_id, span.span_id, span.flags, span.trace_state
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return ctx.trace_id, ctx.span_id, int(ctx.trace_flags), ctx.trace_state
