"""What the library's network exporters (gRPC, http/json, http/protobuf) share: an ``export()`` that never
raises."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.trace.export import SpanExportResult

from ..core._door import RecordExporter
from ..core._guard import internal_error
from ..core._record import FastSpan
from ._processor import suppressed


class SendingExporter(RecordExporter):
    """A span exporter that sends batches over the network. :meth:`export` runs the subclass's ``_export``
    with instrumentation suppressed (its own network calls make no spans) and never raises: an internal error
    is logged once and the batch reported FAILURE (counted by the export processor); after ``shutdown`` an
    export fails at once, and an error from a connection that shutdown closed is not reported."""

    _shutdown = False

    def export_records(self, spans: Sequence[FastSpan]) -> SpanExportResult:
        if self._shutdown:
            return SpanExportResult.FAILURE
        with suppressed():
            try:
                return self._export(spans)
            except Exception:
                if not self._shutdown:  # shutdown closed the connection under an export in flight: not a bug
                    internal_error(f"{type(self).__name__}.export")
                return SpanExportResult.FAILURE

    def _export(self, spans: Sequence[FastSpan]) -> SpanExportResult:
        raise NotImplementedError

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # nothing is buffered here: the export processor in front of it holds the queue
