"""The fast path's export pipeline: ended records leave the training thread here.

:class:`RecordPipeline` drains a :class:`~otel_agentloop.core._recorder.Recorder` on its own thread
(``otel_agentloop.pipeline``), in order: it applies the span limits (:func:`finalize`), then hands each span to
the provider's span processors, in the order they were added. The library's own processors (the metrics, the
keeper, the export processors: ``accepts_records = True``) take the record as it is; any other processor (a
user's) receives a real SDK span built from it (:func:`materialise`): ``on_start`` and ``on_end`` then run on
this thread, after the span ended, not on the thread that ran it. Their ``on_start`` runs first, before any
processor's ``on_end``, in the context the span started in, and what it changes (attributes, events, links,
status, name) is folded back into the record: the library's processors and every exporter see one span, as on
the SDK path. Exporters that are not the library's receive materialised spans too (``ExportProcessor``).

:class:`PipelineProvider` is the SDK provider ``configure()`` builds: a processor added to it (also later,
``handle.provider.add_span_processor(p)``) receives the fast path's spans as well as the SDK's, and its
``force_flush``/``shutdown`` drain the pipeline first. A collect drains it too (the metrics are exact when
``collect()`` returns).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import Link, SpanKind

from ..core._errors import IDENTITY_KEYS
from ..core._guard import after_fork_in_child, internal_error
from ..core._record import UNSET, FastSpan
from ..core._recorder import Recorder
from ..core._values import bound_attributes, frozen_attributes
from ..metrics._hooks import StepHooks

_NO_PROCESSOR = SpanProcessor()


class _Materialised(SdkSpan):
    """The SDK's span class, built here rather than by a tracer (its constructor refuses the base class)."""

    def replay(self, span: FastSpan) -> None:
        """Add ``span``'s events and carry its dropped counts: its values were bounded when written, so the
        SDK's own bounding counts nothing more."""
        for name, attrs, ts, dropped in span.events or ():
            self._add_event(Event(name, frozen_attributes(attrs, dropped), ts))
        events, attributes, links = self._events, self._attributes, self._links
        if isinstance(events, BoundedList):
            events.dropped = span.dropped_events
        if isinstance(attributes, BoundedAttributes):
            attributes.dropped = span.dropped_attributes
        if isinstance(links, BoundedList):
            links.dropped = span.dropped_links
        for link, ours in zip(links, span.links, strict=False):
            bounded = link.attributes
            if isinstance(bounded, BoundedAttributes):
                bounded.dropped = ours.dropped_attributes


def finalize(span: FastSpan) -> None:
    """Apply what is left of the provider's span limits to an ended ``span``: the attributes it started with
    (a sample's shared dict, never written to, so not bounded when written) cleaned, cut to the length limit,
    the oldest over the count limit evicted (counted in ``dropped_attributes``), as the SDK's
    ``BoundedAttributes`` would; the links it started with bounded. What the user wrote through the ``Span`` API
    was bounded as it was written (``core._record``). Costs a type check per attribute when nothing needs
    doing, and not even that for a shared dict found clean for the span before (a sample's phases)."""
    global _clean
    limits = span.recorder.limits
    attrs = span.attributes
    key = (attrs, limits.max_span_attributes, limits.max_span_attribute_length)
    shared = not span.owned
    last = _clean  # one read: another handle's pipeline may replace it meanwhile
    if shared and last[0] is attrs and last[1:] == key[1:]:
        pass
    elif (key[1] is not None and len(attrs) > key[1]) or _too_long(attrs, key[2]):
        span.attributes, dropped = bound_attributes(attrs, key[1], key[2])
        span.owned = True
        span.dropped_attributes += dropped
    elif shared:
        _clean = key  # the dict kept alive (its id is never another dict's); a shared dict is never written to
    if span.links and not span.links_bounded:
        span.bound_links()


_clean: tuple[Any, int | None, int | None] = (None, None, None)
"""The last shared attribute dict :func:`finalize` found clean, with the count and length limits it was checked
against."""


def _too_long(attrs: Mapping[str, Any], length: int | None) -> bool:
    """Whether a value of ``attrs`` needs the SDK's cleaning: not a plain ``str``/``int``/``float``/``bool``,
    or a ``str`` over ``length``."""
    for value in attrs.values():
        kind = type(value)
        if kind is str:
            if length is not None and len(value) > length:
                return True
        elif kind is not int and kind is not float and kind is not bool:
            return True
    return False


def materialise(span: FastSpan, processor: SpanProcessor | None = None) -> ReadableSpan:
    """``span`` as the SDK's own span (started and ended again, off the hot path, at its recorded times, with
    its values and dropped counts): what a processor or exporter that is not the library's receives.
    ``processor`` sees its ``on_start`` and ``on_end``. Built once per span and kept."""
    built = span.materialised
    if isinstance(built, ReadableSpan) and processor is None:
        return built
    recorder = span.recorder
    links = [Link(link.context, link.attributes) for link in span.links]  # the SDK rewraps its links' attributes
    sdk = _Materialised(
        span.name,
        span.get_span_context(),
        parent=span.parent,
        resource=recorder.resource,
        attributes=span.attributes,
        links=links,
        kind=SpanKind.INTERNAL,
        span_processor=processor or _NO_PROCESSOR,
        instrumentation_scope=recorder.scope,
        limits=recorder.limits,
    )
    if len(sdk._links) != len(links):  # a link kept for attributes the boundary then dropped all of, as the SDK
        sdk._links = BoundedList.from_seq(recorder.limits.max_links, links)  # keeps it: it tests them as given
    sdk.start(start_time=span.start_ns)
    sdk.replay(span)
    if span.status is not UNSET:
        sdk.set_status(span.status)
    sdk.end(end_time=span.end_ns)
    span.materialised = sdk
    return sdk


class _Foreign(SpanProcessor):
    """The processors that are not the library's, behind one ``on_start``/``on_end``: a span is materialised
    once for all of them.

    :meth:`start` runs their ``on_start`` on the record's materialised span, in the context the record started
    in (``parent_context``, kept by the recorder while foreign processors exist), and folds what they changed
    back into the record (:func:`_fold`): every exporter, ours and the user's, exports one span. Their
    ``on_end`` runs later, at their place among the provider's processors (:meth:`on_end`)."""

    def __init__(self) -> None:
        self.processors: list[SpanProcessor] = []
        self._starting: FastSpan | None = None  # the record being materialised by start()

    def start(self, record: FastSpan) -> ReadableSpan:
        """The processors' ``on_start`` on ``record`` materialised; the edits folded back into ``record``."""
        self._starting = record
        try:
            sdk = materialise(record, self)
        finally:
            self._starting = None
            record.parent_context = None  # set by Recorder.start; freed here
        _fold(record, sdk)
        return sdk

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        record = self._starting
        if parent_context is None and record is not None:
            parent_context = record.parent_context  # the context the record started in
        attrs = span.attributes or {}
        identity = {key: attrs[key] for key in IDENTITY_KEYS if key in attrs}
        for p in self.processors:
            try:
                p.on_start(span, parent_context)
            except Exception:
                internal_error(f"{type(p).__name__}.on_start")
        attrs = span.attributes or {}
        for key, value in identity.items():  # evicted or changed by an edit: written back, as the SDK path does
            if attrs.get(key) != value:
                span.set_attribute(key, value)

    def on_end(self, span: ReadableSpan) -> None:
        if self._starting is not None:
            return  # materialise() ends the span at once: the pipeline calls on_end at the processors' place
        for p in self.processors:
            try:
                p.on_end(span)
            except Exception:
                internal_error(f"{type(p).__name__}.on_end")


def _fold(record: FastSpan, sdk: ReadableSpan) -> None:
    """Copy into ``record`` what a processor's ``on_start`` changed on ``sdk``, its materialised span: its
    attributes, events, links (already through the SDK's value checks and limits, as on the SDK path), status
    and name. Costs a comparison when nothing changed."""
    attrs = sdk.attributes or {}
    if len(attrs) != len(record.attributes) or list(attrs.items()) != list(record.attributes.items()):
        record.attributes = dict(attrs)
        record.owned = True
        record.dropped_attributes = sdk.dropped_attributes
    events = sdk.events
    if len(events) != len(record.events or ()) or sdk.dropped_events != record.dropped_events:
        record.events = deque(
            ((e.name, dict(e.attributes or {}), e.timestamp, e.dropped_attributes) for e in events),
            maxlen=record.recorder.limits.max_events,
        )
        record.dropped_events = sdk.dropped_events
    if len(sdk.links) != len(record.links):
        record.links = tuple(sdk.links)
    status = sdk.status
    if status.status_code is not record.status.status_code or status.description != record.status.description:
        record.status = status
    if sdk.name != record.name:
        record.name = sdk.name


class RecordPipeline(StepHooks):
    """Drains ``recorder`` into the span processors (see the module docstring). ``interval_s``: the longest a
    record waits when fewer than a batch are queued. As the metrics' hooks (``add_hooks``, first), it drains
    before a step is read."""

    def __init__(self, recorder: Recorder, interval_s: float = 1.0) -> None:
        self.recorder = recorder
        self.interval_s = max(0.01, min(interval_s, 1.0))
        self.foreign = _Foreign()
        self._order: list[SpanProcessor] = []  # in the order added; the foreign ones behind one, at its place
        self._stopping = False
        self._init_state()
        after_fork_in_child(self, "_init_state")

    def _init_state(self) -> None:
        self._wake = threading.Event()
        self.recorder.wake = self._wake.set
        self.recorder.overflow = self.drain
        self._thread = threading.Thread(target=self._run, name="otel_agentloop.pipeline", daemon=True)
        if not self._stopping:
            self._thread.start()

    def add(self, processor: SpanProcessor) -> None:
        """Hand the fast path's spans to ``processor`` too (after those added before it)."""
        if getattr(processor, "accepts_records", False):
            self._order.append(processor)
        else:
            if not self.foreign.processors:
                self._order.append(self.foreign)
            self.foreign.processors.append(processor)
            self.recorder.keep_context = True  # their on_start reads the context a span started in

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            try:
                self.drain()
            except Exception:
                internal_error("RecordPipeline.run")

    def drain(self) -> int:
        """Process everything queued so far, in order, on the calling thread; the number of items."""
        recorder = self.recorder
        with recorder.lock:
            items = recorder.take()
            for item in items:
                try:
                    if type(item) is tuple:
                        self._started(item[1])
                    else:
                        self._ended(item)
                except Exception:
                    internal_error("RecordPipeline.process")
        return len(items)

    def _started(self, span: FastSpan) -> None:
        for p in self._order:
            if p is not self.foreign:
                p.on_start(span)  # type: ignore[arg-type]

    def _ended(self, span: FastSpan) -> None:
        finalize(span)
        foreign = self.foreign
        sdk = None
        if foreign.processors:
            try:
                sdk = foreign.start(span)  # before any on_end: every processor and exporter sees the edits
            except Exception:  # the span still reaches the metrics and the library's exporters
                internal_error("RecordPipeline.foreign")
        for p in self._order:
            if p is foreign:
                if sdk is not None:
                    foreign.on_end(sdk)
            else:
                p.on_end(span)  # type: ignore[arg-type]

    def step_reading(self, step: int | None, validate: bool) -> None:
        self.drain()

    def shutdown(self) -> None:
        """Process what is queued and stop the thread (spans ending later are counted as dropped)."""
        self._stopping = True
        self.recorder.closed = True
        self._wake.set()
        self.drain()


class PipelineProvider(TracerProvider):
    """The SDK ``TracerProvider`` ``configure()`` builds (see the module docstring)."""

    pipeline: RecordPipeline | None = None

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        super().add_span_processor(span_processor)
        if self.pipeline is not None:
            self.pipeline.add(span_processor)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        if self.pipeline is not None:
            self.pipeline.drain()
        return super().force_flush(timeout_millis)

    def shutdown(self) -> None:
        if self.pipeline is not None:
            self.pipeline.shutdown()
        super().shutdown()
