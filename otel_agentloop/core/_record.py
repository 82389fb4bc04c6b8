"""The fast path's span: a compact record that is also the OpenTelemetry span in the context.

A :class:`FastSpan` is what the hot path makes instead of an SDK span: ids, wall-clock start and end (on the
monotonic clock, see :mod:`~otel_agentloop.core._clock`), and the attributes *by reference* (a sample's phase
spans share one dict until one of them is written to: copy on write). It implements the OpenTelemetry
``Span`` API, so user code that reads ``trace.get_current_span()`` (``record_generation``, ``set_attribute``,
``add_event``) and the user's own SDK spans opened inside it (its children, through the context) work as with
an SDK span. Limits, cleaning and encoding happen off the hot path (:meth:`Recorder.finish
<otel_agentloop.core._recorder.Recorder.finish>`, the export pipeline).

Read surface (for the pipeline, the encoders and every consumer of ended spans): ``name``, ``trace_id``,
``span_id``, ``parent_id`` (0: a root), ``parent_remote``, ``flags`` (W3C trace flags: bit 0 = sampled),
``trace_state``, ``start_ns``, ``end_ns`` (0 while open), ``attributes``, ``status`` (a ``Status``),
``events`` (``None`` or a list of ``(name, attributes, time_ns, dropped_attributes)``), ``links`` (a tuple of
``trace.Link``), ``recorder`` (resource, instrumentation scope, limits); and the ``ReadableSpan``-style properties
``context``, ``parent``, ``start_time``, ``end_time``, ``kind``, ``resource``, ``instrumentation_scope``.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Mapping
from typing import Any, Protocol, Union

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
from opentelemetry.util import types

from ._guard import internal_error
from ._scope import OpenSpan


class Sink(Protocol):
    """What a :class:`FastSpan` needs of the recorder that made it (``_recorder.Recorder``)."""

    resource: Any
    scope: Any
    limits: Any

    def finish(self, span: FastSpan, exc: BaseException | None, end_time: int | None) -> None: ...

    def put(self, item: Any) -> None: ...


_logger = logging.getLogger("otel_agentloop")
_SCALARS = (str, bool, int, float)
_DEFAULT_STATE = TraceState()
Event = tuple[str, Mapping[str, Any], int, int]
"""A record's event: ``(name, attributes, time_ns, dropped_attributes)``."""
UNSET = Status(StatusCode.UNSET)
"""A span's status until one is set (shared: a Status is immutable)."""


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
    dirty: bool = False  # a value written through the Span API: cleaned off the hot path
    status: Status = UNSET
    events: list[Event] | None = None
    links: tuple[Link, ...] = ()
    dropped_attributes: int = 0  # set when the limits are applied (off the hot path)
    dropped_events: int = 0
    materialised: object = None  # the SDK span built from this one, for processors and exporters not ours
    recorded: tuple[dict[str, Any], list[Event] | None] | None = None
    """(attributes, events) as recorded, kept when applying the limits changed them."""
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

    # -- the OpenTelemetry Span API ------------------------------------------------------------------------
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
        attrs = self.attributes
        if not self.owned:
            attrs = self.attributes = dict(attrs)
            self.owned = True
        if type(value) not in _SCALARS:
            self.dirty = True
        attrs.pop(key, None)  # re-setting a key makes it the newest, as the SDK's BoundedAttributes does
        attrs[key] = value

    def set_attributes(self, attributes: Mapping[str, types.AttributeValue]) -> None:
        for key, value in attributes.items():
            self.set_attribute(key, value)

    def add_event(self, name: str, attributes: types.Attributes = None, timestamp: int | None = None) -> None:
        if self.end_ns:
            return
        if self.events is None:
            self.events = []
        self.events.append(
            (name, dict(attributes) if attributes else {}, time.time_ns() if timestamp is None else timestamp, 0)
        )

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        if self.end_ns or not context.is_valid:
            return
        self.links = (*self.links, Link(context, attributes))

    def update_name(self, name: str) -> None:
        if not self.end_ns:
            self.name = name

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
        """As the SDK's ``Span.record_exception``: an ``exception`` event."""
        cls = type(exception)
        module, qualname = cls.__module__, cls.__qualname__
        event: dict[str, Any] = {
            "exception.type": f"{module}.{qualname}" if module and module != "builtins" else qualname,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        if attributes:
            event.update(attributes)
        self.add_event("exception", event, timestamp)

    def end(self, end_time: int | None = None) -> None:
        self.recorder.finish(self, None, end_time)

    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

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
        return SpanKind.INTERNAL

    @property
    def resource(self) -> Any:
        return self.recorder.resource

    @property
    def instrumentation_scope(self) -> Any:
        return self.recorder.scope

    def __repr__(self) -> str:
        return f"FastSpan({self.name!r}, trace_id={self.trace_id:032x}, span_id={self.span_id:016x})"


EndedSpan = Union[ReadableSpan, "FastSpan"]
"""What span processors of this library receive: an SDK span, or the fast path's record."""
