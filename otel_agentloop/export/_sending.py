"""What the library's network exporters (gRPC, http/json, http/protobuf) share: built from one resolved
target (``config._otlp.OtlpTarget``: the URL, headers, TLS, compression and timeout rules are its own), an
``export_records()`` that never raises, and the endpoint's health (:attr:`SendingExporter.failing`), warned once
at the first failed try."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from opentelemetry.sdk.trace.export import SpanExportResult

from ..config._fork import after_fork_in_child
from ..config._otlp import OtlpTarget
from ..core._guard import internal_error, warn_once
from ..core._record import FastSpan
from ._exporter import RecordSpanExporter


class SendingExporter(RecordSpanExporter):
    """A span exporter that sends batches to ``target`` over the network. :meth:`export_records` runs the
    subclass's ``_export`` and never raises: an internal error is logged once and the batch reported FAILURE
    (counted by the export processor); after ``shutdown`` an export fails at once, and an error from a
    connection that shutdown closed is not reported. Instrumentation is suppressed by the processor that calls
    it (``ExportProcessor``, the SDK's), not here: its own network calls make no spans."""

    protocol = "otlp"
    """The protocol's name, in warnings."""
    failing = False
    """The last try failed (refused, timed out, answered an error; the free reconnect of a dropped pooled
    connection aside) and none succeeded since: a flush or a shutdown then waits for this endpoint only a short
    bound (``ExportProcessor.failed_wait_s``)."""
    failure = ""
    """Why the last failed try failed (for the one line said at shutdown)."""

    def __init__(self, target: OtlpTarget) -> None:
        self.target = target
        self.timeout_s = target.timeout_for(self.protocol)
        self.spans_unencodable = 0
        self._shutdown = False
        self._fresh_state()
        after_fork_in_child(self, "_fresh_state")

    def _fresh_state(self) -> None:
        """A new lock and stop event (set when shut down) and no connection: at construction, and in a forked
        child (the parent's connection is not the child's to use or close: it opens its own on its first
        export)."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if self._shutdown:
            self._stop.set()
        self._forget_connection()

    def _forget_connection(self) -> None:
        """Drop the connection object without closing it (a subclass's channel or session)."""

    def _close(self) -> None:
        """Close the connection, if one is open (the next export opens a fresh one). Never raises."""

    def shutdown(self) -> None:
        """Stop: abort a back-off wait and close the connection (an export in flight ends); never blocks on the
        network."""
        self._shutdown = True
        self._stop.set()
        self._close()

    @property
    def destination(self) -> str:
        """Where the spans go, in warnings."""
        return ""

    def _failed(self, reason: str) -> None:
        """A try failed: the endpoint is failing; the first failure of this protocol in the process is warned
        at once (one line), whether or not a retry succeeds later."""
        if self._shutdown:
            return  # shutdown closed the connection under an export in flight: not the endpoint's failure
        self.failing = True
        self.failure = reason
        warn_once(
            f"{self.protocol}-export",
            "otel_agentloop: OTLP %s export to %s failed (%s); retrying within the export timeout, then "
            "counting the spans as failed (handle.stats, agent_loop/telemetry/spans_failed)",
            self.protocol,
            self.destination,
            reason,
        )

    def _succeeded(self) -> None:
        self.failing = False

    def export_records(self, spans: Sequence[FastSpan]) -> SpanExportResult:
        if self._shutdown:
            return SpanExportResult.FAILURE
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
