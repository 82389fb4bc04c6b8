"""The one exporter type the export worker calls (:class:`RecordExporter`: records in, bytes out), and the two
ways in: the library's exporters take records as they are, and still take SDK spans as the SDK's
``SpanExporter`` (:class:`RecordSpanExporter`); any other ``SpanExporter`` (a user's, the console) gets SDK spans
(:class:`SpanExporterOfRecords`). :func:`record_exporter` picks one, by type, once.

As the SDK's exporters, none of them suppresses instrumentation itself: the processor that calls them does
(``ExportProcessor``, once per export; the SDK's processors do the same).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ..core._door import materialise, records_of
from ..core._record import FastSpan
from ._clean import repaired

__all__ = ["RecordExporter", "RecordSpanExporter", "SpanExporterOfRecords", "record_exporter"]


@runtime_checkable
class RecordExporter(Protocol):
    """What the export worker calls. :meth:`export_records` takes a batch of records and sends or writes them;
    it repairs what it can, and leaves out and counts in :attr:`spans_unencodable` what it cannot encode (the
    worker counts those as dropped). :meth:`shutdown` stops it (an export in flight ends)."""

    spans_unencodable: int

    def export_records(self, spans: Sequence[FastSpan]) -> SpanExportResult: ...

    def shutdown(self) -> None: ...


class RecordSpanExporter(SpanExporter):
    """A :class:`RecordExporter` of the library that is also the SDK's ``SpanExporter``: :meth:`export` adapts
    the SDK spans at the door (``core._door.records_of``: a record among them as it is; a span that cannot be
    adapted is left out and logged once) and exports the records."""

    spans_unencodable: int = 0

    def export_records(self, spans: Sequence[FastSpan]) -> SpanExportResult:
        raise NotImplementedError

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        records, _ = records_of(spans, f"{type(self).__name__}.export: adapting a span")
        return self.export_records(records)

    def encoded(
        self, spans: Sequence[FastSpan], encode: Callable[[Sequence[FastSpan]], tuple[bytes, int]]
    ) -> bytes | None:
        """What ``encode`` (an encoder's ``encode_request``) makes of ``spans``; the spans it left out are counted
        in :attr:`spans_unencodable`. ``None`` when it left out every one: nothing to send."""
        data, skipped = encode(spans)
        if skipped:
            self.spans_unencodable += skipped
            if skipped == len(spans):
                return None
        return data


class SpanExporterOfRecords:
    """A ``SpanExporter`` that is not the library's, as a :class:`RecordExporter`: each record materialised (the
    SDK span it came from, or one built from it: ``core._door.materialise``), text repaired where no encoder
    could take it (``_clean``); a span that cannot be repaired is left out and counted in
    :attr:`spans_unencodable`."""

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter
        self.spans_unencodable = 0

    def export_records(self, spans: Sequence[FastSpan]) -> SpanExportResult:
        sdk_spans, lost = repaired([materialise(record) for record in spans])
        self.spans_unencodable += lost
        return self.exporter.export(sdk_spans) if sdk_spans else SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.exporter.shutdown()


def record_exporter(exporter: SpanExporter) -> RecordExporter:
    """``exporter`` as the worker calls it: as it is when it is a :class:`RecordExporter` (the library's),
    else behind :class:`SpanExporterOfRecords`."""
    return exporter if isinstance(exporter, RecordExporter) else SpanExporterOfRecords(exporter)
