"""The embedded default exporter: OTLP-JSON lines in a file."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

from opentelemetry.sdk.trace.export import SpanExportResult

from ..config._fork import after_fork_in_child
from ..core._guard import internal_error, warn_once
from ..core._record import FastSpan
from ._exporter import RecordSpanExporter
from ._otlp_json import encode_line


def open_append(path: str) -> int:
    """A descriptor that appends to ``path`` (created, with its folder, when missing)."""
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def write_all(fd: int, data: bytes) -> None:
    """``data`` to ``fd`` in one ``write`` (a regular file takes it whole; the loop only covers a short write)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def say_unwritable(path: str, exc: OSError, *, folder: bool) -> None:
    """One warning line, once per path and reason, for traces that cannot be written at ``path`` (the file or
    folder ``file=`` names): the path, why, and what to do. No traceback: the cause is the user's setting (a
    read-only folder, a path that is one of their files, a full disk), not our bug."""
    target = os.path.abspath(exc.filename) if isinstance(exc.filename, str) else path
    reason = exc.strerror or type(exc).__name__
    if folder and os.path.lexists(path) and not os.path.isdir(path):
        target, reason = path, "it is a file, not a folder"
    what = "a folder" if folder else "a file"
    warn_once(
        f"unwritable:{path}:{exc.errno}",
        "otel_agentloop: cannot write traces to %s: %s; spans are not saved (counted as failed): point file= or "
        "OTEL_AGENTLOOP_FILE at %s you can write (training continues)",
        target,
        reason,
        what,
    )


class FileWriter(RecordSpanExporter):
    """What the file exporters (:class:`OTLPJsonFileExporter`, ``_rolled.RolledDirectoryExporter``) share: an
    absolute ``path``, one lock around writing, an :meth:`export_records` that never raises (a failed write
    returns FAILURE for the batch, counted by the export processor) and closing at :meth:`shutdown`."""

    says_own_failures = True
    """A path it cannot write is warned once, in one line with the fix: no second line at shutdown."""
    folder = False
    """Whether ``path`` names a folder (in that warning)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self._lock = threading.Lock()
        self._closed = False
        self.spans_unencodable = 0
        after_fork_in_child(self, "_after_fork")

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def _write_batch(self, spans: Sequence[FastSpan]) -> None:
        """Encode and write ``spans`` (under the lock); ``OSError`` when ``path`` cannot be written."""
        raise NotImplementedError

    def _close_files(self) -> None:
        """Close what is open (under the lock)."""

    def export_records(self, spans: Sequence[FastSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        try:
            with self._lock:
                self._write_batch(spans)
            return SpanExportResult.SUCCESS
        except OSError as exc:
            say_unwritable(self.path, exc, folder=self.folder)
            return SpanExportResult.FAILURE
        except Exception:
            internal_error(f"{type(self).__name__}.export")
            return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            self._close_files()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class OTLPJsonFileExporter(FileWriter):
    """Appends one ``{"resourceSpans": [...]}`` line per export to ``path``.

    The layout is the one the Collector's file exporter writes; the Jaeger UI loads such a file, and
    ``otel-agentloop report --file`` reads it. Each line goes out in one ``write`` on an ``O_APPEND``
    descriptor, so several processes (Ray workers) can share one file without interleaving lines (a forked
    child shares the descriptor). A failed write returns FAILURE (counted by the export processor), never
    raises. Text that UTF-8 cannot encode (lone surrogates) is written as U+FFFD; a span that cannot be encoded
    at all is left out and counted in ``spans_unencodable`` (the export processor reports it as dropped).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self._fd: int | None = None

    def _write_batch(self, spans: Sequence[FastSpan]) -> None:
        data = self.encoded(spans, encode_line)
        if data is None:
            return  # nothing left to write
        if self._fd is None:
            self._fd = open_append(self.path)
        write_all(self._fd, data)

    def _close_files(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
