"""The one door between the two span types: the library's record and the OpenTelemetry SDK's span.

The library's processors (:class:`RecordProcessor`: the metrics, the keeper, the export processors) and its
exporters (``export._exporter.RecordExporter``: the OTLP and file exporters, with their encoders) receive one
type, the record (:class:`~otel_agentloop.core._record.FastSpan`). Everything that crosses between the two types
crosses here:

- SDK span → record (:func:`to_record`): a span an SDK tracer made (``fast_path=False``, a user's tracer on the
  library's provider, the library's side tracers, a user's own ``TracerProvider``)
  becomes a record with the span's values, kind, resource and scope; the SDK span is kept on it
  (``materialised``), so a processor or exporter that is not the library's receives the original, as given.
  A :class:`RecordProcessor` added to an SDK provider the library did not build adapts each span itself, here.
- A batch of ended spans → records (:func:`records_of`, the one loop that adapts a batch): on an export thread
  (``export._processor``), and when one of the library's exporters is handed SDK spans (``export._exporter``).
- record → SDK span (:func:`materialise`): for a processor (:class:`Foreign`) or exporter
  (``export._exporter.SpanExporterOfRecords``) that is not the library's; a user's processor's ``on_start``
  edits are folded back into the record (:func:`_fold`).

Capabilities are declared by type, never sniffed: a processor is the library's when it is a
:class:`RecordProcessor`, an exporter when it is an ``export._exporter.RecordExporter``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any, cast

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, SpanProcessor
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status

from ._errors import IDENTITY_KEYS
from ._guard import internal_error
from ._record import UNSET, FastSpan, Queued
from ._recorder import finalize
from ._values import frozen_attributes, plain_attributes, timestamp_ns

_NO_PROCESSOR = SpanProcessor()


class RecordProcessor(SpanProcessor):
    """A span processor of the library: :meth:`record_start` and :meth:`record_end` receive records only.
    Added to the library's provider, it gets them from the export pipeline, on its thread, in the order added.
    As a ``SpanProcessor`` it also works on any SDK provider: each span is adapted here (:meth:`on_start`,
    :meth:`on_end`), on the thread that started or ended it."""

    reads_starts = False
    """Whether :meth:`record_start` does anything (a started SDK span is adapted only for those that do)."""

    def record_start(self, span: FastSpan) -> None:
        return None

    def record_end(self, span: FastSpan) -> None:
        return None

    def on_start(self, span: SdkSpan, parent_context: Context | None = None) -> None:
        if self.reads_starts:
            try:
                record = to_record(span)
            except Exception:
                internal_error(f"{type(self).__name__}.on_start")
                return
            self.record_start(record)

    def on_end(self, span: ReadableSpan) -> None:
        try:
            record = to_record(span)
        except Exception:
            internal_error(f"{type(self).__name__}.on_end")
            return
        self.record_end(record)


# -- SDK span -> record ------------------------------------------------------------------------------------------
class _Origin:
    """The resource, scope and limits of records adapted from SDK spans (a record's ``recorder``)."""

    __slots__ = ("limits", "resource", "scope")
    resource: Resource
    scope: InstrumentationScope
    limits: SpanLimits

    def __init__(
        self, resource: Resource | None, scope: InstrumentationScope | None, limits: SpanLimits | None
    ) -> None:
        # As the span gave them (a ``ReadableSpan``-like object may lack any); an adapted record has ended, so
        # nothing bounds it again with these limits, and the encoders take a missing resource or scope as empty.
        self.resource, self.scope, self.limits = (
            cast(Resource, resource),
            cast(InstrumentationScope, scope),
            cast(SpanLimits, limits),
        )

    def finish(self, span: FastSpan, exc: BaseException | None, end_time: int | None) -> None:
        return None  # an adapted record has ended already

    def put(self, item: Queued) -> None:
        return None


_origin = _Origin(None, None, None)


def _origin_of(resource: Resource | None, scope: InstrumentationScope | None, limits: SpanLimits | None) -> _Origin:
    global _origin
    last = _origin  # one read: another thread may replace it meanwhile
    if last.resource is resource and last.scope is scope and last.limits is limits:
        return last
    _origin = last = _Origin(resource, scope, limits)
    return last


def to_record(span: ReadableSpan) -> FastSpan:
    """``span`` (an SDK span, ended or not, or any ``ReadableSpan``-like object) as a record, for the library's
    processors and encoders: its values by reference (an SDK span bounded them), an event time that is not an
    int read as the encoders read it (nanoseconds; the span's end when it cannot be a time), its kind, resource
    and scope. Read from the SDK's own fields (each public property costs a call), or from the public API where
    they are missing or moved: the same record. Raises ``ValueError`` for a span without a context (no encoder
    can write it)."""
    try:
        return _record(span, _private(span))
    except ValueError:
        raise
    except Exception:
        return _record(span, _public(span))


_Fields = tuple[
    SpanContext | None,
    SpanContext | None,
    str,
    SpanKind,
    int | None,
    int | None,
    Mapping[str, object] | None,
    Status,
    Sequence[Event],
    Sequence[Link],
    Resource | None,
    InstrumentationScope | None,
]
_NAMES = "context parent name kind start_time end_time attributes status events links resource instrumentation_scope"
"""The fields of :data:`_Fields`, in order, as ``ReadableSpan`` names its properties (the SDK span: ``_`` + each)."""
_public: Callable[[ReadableSpan], _Fields] = attrgetter(*_NAMES.split())
"""A span's fields through ``ReadableSpan``'s public properties (any SDK version's span)."""
_private: Callable[[ReadableSpan], _Fields] = attrgetter(*("_" + name for name in _NAMES.split()))
"""The same, from the SDK span's own fields (one attribute read each; each public property is a call)."""


def _record(span: ReadableSpan, fields: _Fields) -> FastSpan:
    ctx, parent, name, kind, start, end, attrs, status, events, links, resource, scope = fields
    if ctx is None:
        raise ValueError("a span without a context")
    limits = getattr(span, "_limits", None)
    record = FastSpan(
        _origin_of(resource, scope or None, limits if isinstance(limits, SpanLimits) else None),
        name,
        ctx.trace_id,
        ctx.span_id,
        parent.span_id if parent is not None else 0,
        int(ctx.trace_flags),
        start or 0,
        cast("dict[str, Any]", plain_attributes(attrs) or {}),  # read only: the record has ended (or is at its start)
    )
    record.end_ns = end or 0
    record.materialised = span
    record.adapted = True
    if kind is not SpanKind.INTERNAL:
        record.kind_value = kind.value
    if parent is not None and parent.is_remote:
        record.parent_remote = True
    if ctx.trace_state:
        record.trace_state = ctx.trace_state
    if status.status_code is not UNSET.status_code or status.description:
        record.status = status
    if events:
        record.events = deque(
            (e.name, plain_attributes(e.attributes) or {}, _time(e.timestamp, end), e.dropped_attributes)
            for e in tuple(events)
        )  # tuple(): one C-level copy (a span read at its start may still be written to)
    if links:
        record.links = tuple(links)
        record.links_bounded = True
    record.dropped_attributes = span.dropped_attributes
    record.dropped_events = span.dropped_events
    record.dropped_links = span.dropped_links
    return record


def _time(ts: object, end: int | None) -> int:
    """An SDK span's event time as OTLP carries it: a user's float read as nanoseconds, anything that cannot be
    a time replaced by the span's end (:func:`~otel_agentloop.core._values.timestamp_ns`): the event is kept."""
    return ts if type(ts) is int else timestamp_ns(ts, end or 0)


def admit(item: FastSpan | ReadableSpan) -> FastSpan:
    """A queued span (a record, or an SDK span the library's provider made) as a record; a record that ended
    gets what is left of its limits applied (:func:`finalize`)."""
    if type(item) is FastSpan:
        if item.end_ns:
            finalize(item)
        return item
    return to_record(item)


def sampled(item: FastSpan | ReadableSpan) -> bool:
    """Whether a queued span (a record or an SDK span) is sampled for export."""
    if type(item) is FastSpan:
        return bool(item.flags & 1)
    ctx = item.context
    return ctx is not None and ctx.trace_flags.sampled


def records_of(batch: Sequence[FastSpan | ReadableSpan], where: str) -> tuple[list[FastSpan], int]:
    """A batch of ended spans (records as they are; SDK spans an export processor on an SDK provider queued
    unadapted, or an SDK processor handed to one of the library's exporters) as records, adapted here off the
    thread that ended them (:func:`to_record`); and how many could not be adapted: those are left out, logged
    once per ``where`` (``internal_error``). Never raises."""
    records: list[FastSpan] = []
    failed = 0
    for span in batch:
        if type(span) is FastSpan:
            records.append(span)
            continue
        try:
            records.append(to_record(span))
        except Exception:
            failed += 1
            internal_error(where)
    return records, failed


# -- record -> SDK span --------------------------------------------------------------------------------------------
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


def materialise(span: FastSpan, processor: SpanProcessor | None = None) -> ReadableSpan:
    """``span`` as the SDK's own span: the one it was adapted from, or one started and ended again (off the hot
    path, at its recorded times, with its values and dropped counts): what a processor or exporter that is not
    the library's receives. ``processor`` sees its ``on_start`` and ``on_end``. Built once per span and kept."""
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
        kind=span.kind,
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


class Foreign(RecordProcessor):
    """The processors that are not the library's (a user's ``SpanProcessor``), behind one place in the
    pipeline's list: a record is materialised once for all of them.

    :meth:`start` (before any processor's ``on_end``) runs their ``on_start`` on the record's materialised span,
    in the context the record started in (``parent_context``, kept by the recorder while foreign processors
    exist), and folds what they changed back into the record (:func:`_fold`): every exporter, ours and the
    user's, exports one span. Their ``on_end`` runs at their place in the list (:meth:`on_end`). An SDK span the
    provider made reaches them as it is (:meth:`sdk_start`, :meth:`sdk_end`), on the thread that made it."""

    def __init__(self) -> None:
        self.processors: list[SpanProcessor] = []
        self._starter = _Starter(self)

    def start(self, record: FastSpan) -> None:
        """The processors' ``on_start`` on ``record`` materialised; the edits folded back into ``record``."""
        self._starter.record = record
        try:
            sdk = materialise(record, self._starter)
        finally:
            self._starter.record = None
            record.parent_context = None  # set by Recorder.start; freed here
        _fold(record, sdk)

    def record_end(self, span: FastSpan) -> None:
        sdk = span.materialised
        if not span.adapted and isinstance(sdk, ReadableSpan):  # an adapted span reached them as it ended
            self.sdk_end(sdk)

    def sdk_start(self, span: SdkSpan, parent_context: Context | None) -> None:
        for p in self.processors:
            try:
                p.on_start(span, parent_context)
            except Exception:
                internal_error(f"{type(p).__name__}.on_start")

    def sdk_end(self, span: ReadableSpan) -> None:
        for p in self.processors:
            try:
                p.on_end(span)
            except Exception:
                internal_error(f"{type(p).__name__}.on_end")

    def shutdown(self) -> None:
        for p in self.processors:
            p.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return all([p.force_flush(timeout_millis) for p in self.processors])


class _Starter(SpanProcessor):
    """What a materialised span calls at its start: the foreign processors' ``on_start``, a sample's identity
    written back where an edit evicted or changed it (as the SDK path does at the end)."""

    def __init__(self, foreign: Foreign) -> None:
        self.foreign = foreign
        self.record: FastSpan | None = None

    def on_start(self, span: SdkSpan, parent_context: Context | None = None) -> None:
        record = self.record
        if parent_context is None and record is not None:
            parent_context = record.parent_context  # the context the record started in
        attrs = span.attributes or {}
        identity = {key: attrs[key] for key in IDENTITY_KEYS if key in attrs}
        self.foreign.sdk_start(span, parent_context)
        attrs = span.attributes or {}
        for key, value in identity.items():
            if attrs.get(key) != value:
                span.set_attribute(key, value)


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
