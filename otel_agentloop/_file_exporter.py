"""The embedded default exporter: OTLP-JSON lines in a file."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ._guard import internal_error
from ._otlp_json import encode_spans


class OTLPJsonFileExporter(SpanExporter):
    """Appends one ``{"resourceSpans": [...]}`` line per export to ``path``.

    The layout is the one the Collector's file exporter writes; the Jaeger UI loads such a file, and
    ``otel-agentloop report --file`` reads it. The file is opened lazily and kept open; a failed write
    returns FAILURE (counted by the export processor), never raises.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._file: object | None = None
        self._closed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        try:
            line = encode_spans(spans) + "\n"
            with self._lock:
                if self._file is None:
                    directory = os.path.dirname(self.path)
                    if directory:
                        os.makedirs(directory, exist_ok=True)
                    self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
                f = self._file
                f.write(line)  # type: ignore[attr-defined]
                f.flush()  # type: ignore[attr-defined]
            return SpanExportResult.SUCCESS
        except Exception:
            internal_error("OTLPJsonFileExporter.export")
            return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            if self._file is not None:
                self._file.close()  # type: ignore[attr-defined]
                self._file = None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
