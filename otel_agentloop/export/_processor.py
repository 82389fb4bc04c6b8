"""A bounded, non-blocking export processor (the SDK's batch processor, minus its traps).

``on_end`` appends to a bounded deque and returns: when the queue is full the span is dropped and counted,
with one warning per minute at most (the SDK's ``BatchSpanProcessor`` logs every dropped span, which slows
the caller by 50-75% when the endpoint is down). A single daemon thread exports batches. ``force_flush`` and
``shutdown`` honour their timeouts: they wait for the worker, never for the network. Fork-safe: a forked
child starts with an empty queue and a fresh worker. Every call into the exporter runs under the context's
suppress-instrumentation key (as the SDK's processors do): with urllib/requests/grpc instrumentation on, an
export must not make a span that is exported in turn.

Every wait is bounded, whatever it is given: a timeout that is NaN gets the default, one that is infinite or
huge waits at most ``MAX_SECONDS`` (:func:`timeout_s`), and the exporter's own ``shutdown()`` runs on a helper
thread for the time left (an exporter whose ``shutdown()`` blocks is left behind, and what it held is
counted as dropped). Text no encoder can take (lone surrogates) never costs a batch: our OTLP-JSON exporters
repair it themselves and count a span they cannot encode at all in ``spans_unencodable``; any other exporter
(the SDK's OTLP protobuf ones, the console) gets repaired copies of the spans that need it (U+FFFD, see
``_clean``). Spans that cannot be encoded either way, or adapted into records, are counted as dropped.

It receives records (``core._door.RecordProcessor``) and is the one batch worker for any exporter, as the SDK's
batch processor: it calls one method of one type, ``export_records`` of a ``RecordExporter`` (``_exporter``:
the library's exporters take the records as they are, any other gets SDK spans through
``SpanExporterOfRecords``), with instrumentation suppressed once, here. On an SDK provider (a user's own, the
library's side tracers) ``on_end`` queues the SDK span as it is: the worker adapts its batch into records
(``core._door.records_of``), so the thread that ended the span pays one append, as with the SDK's own batch
processor.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from contextlib import contextmanager

from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, attach, detach, set_value
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ..config._fork import after_fork_in_child
from ..config._settings import MAX_QUEUE, MAX_SECONDS, check_int, check_seconds
from ..core._door import RecordProcessor, records_of
from ..core._guard import internal_error, warn_once
from ..core._record import FastSpan
from ._exporter import record_exporter

logger = logging.getLogger("otel_agentloop")

SpanFilter = Callable[[ReadableSpan], bool]
FAST_EXPORT_S = 0.25
"""An export slower than this makes the path unhealthy for :meth:`ExportProcessor.request_flush`."""


def timeout_s(value: object, default: float, scale: float = 1.0) -> float:
    """``value * scale`` seconds as a wait that cannot raise or run forever: NaN, ``None`` or not a number is
    ``default``; negative is 0; infinite or past ``MAX_SECONDS`` is ``MAX_SECONDS``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    try:
        seconds = float(value) * scale
    except OverflowError:  # an int too large for a float
        return MAX_SECONDS if value > 0 else 0.0
    if math.isnan(seconds):
        return default
    return min(max(seconds, 0.0), MAX_SECONDS)


@contextmanager
def suppressed() -> Generator[None, None, None]:
    """Run the block with instrumentation suppressed in this thread's context (the key every contrib
    instrumentation checks): the network calls of an export make no spans."""
    token = attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
    try:
        yield
    finally:
        detach(token)


class ExportProcessor(RecordProcessor):
    """Queue sampled spans and export them in batches on a background thread.

    Counters (:attr:`stats`): ``queued``, ``exported``, ``dropped`` (queue full, after shutdown, left when a
    shutdown timed out, not adaptable or not encodable), ``failed`` (spans in batches the exporter reported as failed or
    raised on). Every queued span ends in exactly one of ``exported``, ``failed``, ``dropped`` or ``pending``.
    """

    _shutdown: bool
    _closing: bool

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue_size: int = 2048,
        max_export_batch_size: int = 512,
        schedule_delay_s: float = 1.0,
        export_timeout_s: float = 30.0,
        shutdown_timeout_s: float = 5.0,
        failed_wait_s: float = 2.0,
        name: str = "otel_agentloop.export",
    ) -> None:
        self.max_queue_size = check_int("max_queue_size", max_queue_size, 1, MAX_QUEUE)
        self.max_export_batch_size = min(
            check_int("max_export_batch_size", max_export_batch_size, 1, MAX_QUEUE), self.max_queue_size
        )
        self.schedule_delay_s = check_seconds("schedule_delay_s", schedule_delay_s)
        self.export_timeout_s = check_seconds("export_timeout_s", export_timeout_s)
        self.shutdown_timeout_s = check_seconds("shutdown_timeout_s", shutdown_timeout_s, inclusive=True)
        self.failed_wait_s = check_seconds("failed_wait_s", failed_wait_s, inclusive=True)
        self.exporter = exporter
        self._failed_last = False  # the last export failed (kept in a forked child: the endpoint is the same)
        self._give_up_at: float | None = None  # see failed_deadline (kept in a forked child too)
        self._record_exporter = record_exporter(exporter)
        self.name = name
        self._init_state()
        after_fork_in_child(self, "_after_fork")

    def _after_fork(self) -> None:
        """A forked child starts empty, with fresh locks and its own worker (none if shut down here)."""
        closed = self._shutdown or self._closing
        self._init_state(start=not closed)
        self._shutdown = self._closing = closed

    def _init_state(self, start: bool = True) -> None:
        self._queue: collections.deque[FastSpan | ReadableSpan] = collections.deque()
        self._wake = threading.Event()
        self._idle = threading.Condition(threading.Lock())
        self._in_flight = 0
        self._flush_requested = False
        self._stopping = False
        self._shutdown = False
        self._closing = False
        self._queued = self._exported = self._dropped = self._failed = 0
        self._dropped_full = 0  # dropped by enqueue (queue full, or after shutdown): counted there alone
        self._healthy = False  # the last export succeeded quickly and no flush wait timed out since
        self._last_export_s = 0.0
        self._abandoned = False  # shutdown gave up on a stuck export: its batch was counted as dropped
        self._last_drop_log = 0.0
        self._worker = threading.Thread(target=self._run, name=self.name, daemon=True)
        if start:
            self._worker.start()

    # -- hot path ---------------------------------------------------------------------------------
    def record_end(self, span: FastSpan) -> None:
        if span.flags & 1:  # else recorded for metrics only (sampler's RECORD_ONLY)
            self.enqueue(span)

    def on_end(self, span: ReadableSpan) -> None:
        """On an SDK provider: ``span`` queued as it is when sampled, adapted later on the worker (not here, on
        the thread that ended it)."""
        try:
            ctx = span.context  # inline (not ``core._door.sampled``): the ending thread pays one call less
            if ctx is None or not ctx.trace_flags.sampled:
                return
        except Exception:
            internal_error(f"{type(self).__name__}.on_end")
            return
        self.enqueue(span)

    def enqueue(self, span: FastSpan | ReadableSpan) -> None:
        """Queue ``span`` for export whatever its sampled flag (the keeper's path); drop and count when full."""
        queue = self._queue
        if self._shutdown or len(queue) >= self.max_queue_size:
            # as cheap as queueing (a dead or slow backend drops every span, on the thread that drains, a collect
            # on the training thread too): a counter of its own, counted only here (as ``_queued``), no lock,
            # and the clock read for the once-a-minute warning at the first drop and then every 256th
            self._dropped_full += 1
            if self._shutdown or not self._dropped_full & 255 or not self._last_drop_log:
                self._warn_dropped()
            return
        queue.append(span)
        self._queued += 1
        if len(queue) >= self.max_export_batch_size and not self._wake.is_set():
            self._wake.set()

    def _warn_dropped(self) -> None:
        now = time.monotonic()
        if now - self._last_drop_log <= 60.0:
            return
        self._last_drop_log = now
        dropped = self._dropped + self._dropped_full
        if self._shutdown:
            logger.warning("otel_agentloop: span ended after its exporter was shut down; dropped (%d so far)", dropped)
        else:
            logger.warning(
                "otel_agentloop: export queue full (%d spans); dropping spans (%d so far). Is the OTLP endpoint "
                "reachable?",
                self.max_queue_size,
                dropped,
            )

    # -- worker -----------------------------------------------------------------------------------
    def _run(self) -> None:
        delay = min(self.schedule_delay_s, threading.TIMEOUT_MAX)
        while True:
            try:
                self._wake.wait(delay)
                self._wake.clear()
                self._drain(stop_early=True)
            except Exception:  # never let the export thread die silently
                internal_error("ExportProcessor.run")
                time.sleep(delay)
            with self._idle:
                self._flush_requested = False
                self._idle.notify_all()
                if self._stopping and not self._queue:
                    return

    def _drain(self, stop_early: bool) -> None:
        while self._queue:
            batch: list[FastSpan | ReadableSpan] = []
            queue = self._queue
            with self._idle:  # a span moves from the queue to in flight, and later to a counter, in one step
                while queue and len(batch) < self.max_export_batch_size:
                    batch.append(queue.popleft())
                self._in_flight = len(batch)
            t0 = time.monotonic()
            records, unadapted = records_of(batch, f"{type(self).__name__}: adapting a span")
            ok, lost = self._export(records)
            self._last_export_s = took = time.monotonic() - t0
            self._healthy = ok and took < FAST_EXPORT_S
            self._failed_last = not ok
            if ok:
                self._give_up_at = None  # recovered: a later failure opens a new window (failed_deadline)
            with self._idle:
                if self._abandoned:  # shutdown already counted this batch as dropped
                    return
                self._settle(len(batch), ok, min(lost + unadapted, len(batch)))
            if (
                stop_early
                and len(self._queue) < self.max_export_batch_size
                and not (self._flush_requested or self._stopping)
            ):
                return

    def _settle(self, size: int, ok: bool, lost: int) -> None:
        """Count an exported batch of ``size`` spans, ``lost`` of them not adaptable or not encodable (the caller
        holds ``_idle``)."""
        if lost:
            self._dropped += lost
        if ok:
            self._exported += size - lost
        else:
            self._failed += size - lost
        self._in_flight = 0

    def _export(self, batch: Sequence[FastSpan]) -> tuple[bool, int]:
        """Export ``batch`` (``RecordExporter.export_records``, with instrumentation suppressed: the one place an
        export suppresses it): whether it succeeded, and how many of its spans were dropped as not encodable."""
        exporter = self._record_exporter
        before = exporter.spans_unencodable
        try:
            with suppressed():
                result = exporter.export_records(batch) if batch else SpanExportResult.SUCCESS
        except Exception:
            internal_error(f"{type(self.exporter).__name__}.export")
            return False, 0
        return result is SpanExportResult.SUCCESS, max(exporter.spans_unencodable - before, 0)

    # -- control ----------------------------------------------------------------------------------
    @property
    def failing(self) -> bool:
        """The endpoint has failed: the exporter's last try (``SendingExporter.failing``) or the last export
        failed, and none succeeded since."""
        return self._failed_last or bool(getattr(self.exporter, "failing", False))

    def failed_deadline(self) -> float | None:
        """While the endpoint is failing (:attr:`failing`): when flushes and the shutdown stop waiting for it
        (``time.monotonic()``). One window of ``failed_wait_s`` for them all, opened by the first wait that
        finds the endpoint failing; a success closes it (``None``)."""
        if not self.failing:
            self._give_up_at = None
            return None
        if self._give_up_at is None:
            self._give_up_at = time.monotonic() + self.failed_wait_s
        return self._give_up_at

    def _wait_idle(self, timeout_s: float) -> bool:
        """Wait for the queue to be exported, at most ``timeout_s``, and no later than :meth:`failed_deadline`
        once the endpoint is failing (checked as the wait goes)."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        bounded = False
        with self._idle:
            self._flush_requested = True
            self._wake.set()
            while self._queue or self._in_flight:
                if not bounded and (failed := self.failed_deadline()) is not None:
                    bounded = True
                    deadline = min(deadline, failed)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._worker.is_alive():
                    return not (self._queue or self._in_flight)
                self._idle.wait(min(remaining, 0.05))
                self._wake.set()
        return True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Wait up to ``timeout_millis`` (bounded, see :func:`timeout_s`; at most ``failed_wait_s`` once the
        endpoint is failing) for queued spans to be exported; ``False`` if time ran out."""
        if self._shutdown:
            return not self._queue
        done = self._wait_idle(timeout_s(timeout_millis, 30.0, 1e-3))
        if not done:
            self._healthy = False
        return done

    @property
    def healthy(self) -> bool:
        """The last export succeeded within ``FAST_EXPORT_S`` and no flush wait timed out since."""
        return self._healthy

    def request_flush(self, wait_s: float = 0.0) -> bool:
        """Export what is queued now, on the worker. Wait for it only while :attr:`healthy`, and then at most
        ``min(wait_s, 4 x the last export's duration + 100 ms)``: with a backend that is dead, hung, slow or not
        yet heard from, the caller never waits; one that turns bad costs one short wait, then none until an
        export succeeds quickly again. Returns whether the queue is known to be empty."""
        if self._shutdown:
            return not self._queue
        if wait_s > 0 and self._healthy:
            return self.force_flush(int(min(wait_s, 4 * self._last_export_s + 0.1) * 1000))
        with self._idle:
            self._flush_requested = True
        self._wake.set()
        return not (self._queue or self._in_flight)

    def shutdown(self, timeout_millis: float | None = None) -> None:
        """Export what is queued within ``timeout_millis`` (default ``shutdown_timeout_s``: the SDK's exit hook
        passes none, and a stuck endpoint must not hold the process at exit; bounded, see :func:`timeout_s`),
        and within ``failed_wait_s`` once the endpoint is failing (a dead Collector costs the exit that, not
        the export timeout), then stop, shutting the exporter down in the time left; what is left is counted
        as dropped. Returns within the timeout (plus ~0.1 s), whatever the exporter does. When spans were not
        sent, says so in one line (:meth:`_say_unsent`), unless the exporter already says its own failures
        (``says_own_failures``: the trace file and folder, whose one warning names the path and the fix)."""
        if self._shutdown or self._closing:
            return
        self._closing = True
        started = time.monotonic()
        wait_s = timeout_s(timeout_millis, self.shutdown_timeout_s, 1e-3)
        deadline = started + wait_s
        self._wait_idle(wait_s)
        failed = self.failed_deadline()
        if failed is not None:
            deadline = min(deadline, failed)
        self._shutdown = True
        with self._idle:
            self._stopping = True
        self._wake.set()
        self._shutdown_exporter(max(deadline - time.monotonic(), 0.0) + 0.05)  # also aborts a retry back-off
        self._worker.join(max(deadline - time.monotonic(), 0.0) + 0.05)
        with self._idle:
            left = len(self._queue)
            self._queue.clear()
            if self._worker.is_alive() and self._in_flight:  # stuck in export past the timeout
                self._abandoned = True
                left += self._in_flight
                self._in_flight = 0
            self._dropped += left
            failed, dropped, exported = self._failed, self._dropped + self._dropped_full, self._exported
        if (self.failing or left) and failed + dropped and not getattr(self.exporter, "says_own_failures", False):
            self._say_unsent(time.monotonic() - started, failed, dropped, exported)

    def _say_unsent(self, waited_s: float, failed: int, dropped: int, exported: int) -> None:
        """The one line at shutdown: what this exporter could not send, and why."""
        why = getattr(self.exporter, "failure", "") or ("the last export failed" if self._failed_last else "")
        logger.warning(
            "otel_agentloop: %s: %d spans not sent (%d failed, %d dropped; %d exported)%s; shutdown waited %.1f s "
            "(once the endpoint failed, flushes and shutdown wait OTEL_AGENTLOOP_FAILED_EXPORT_WAIT=%g s in all)",
            self.name,
            failed + dropped,
            failed,
            dropped,
            exported,
            f", the endpoint failed ({why})" if self.failing and why else "",
            waited_s,
            self.failed_wait_s,
        )

    def _shutdown_exporter(self, wait_s: float) -> None:
        """``exporter.shutdown()`` on a helper thread, waited for at most ``wait_s``: an exporter may block
        (the SDK's OTLP exporters wait for an export in flight, up to their own timeout)."""
        exporter = self.exporter

        def run() -> None:
            try:
                with suppressed():
                    exporter.shutdown()
            except Exception:
                internal_error(f"{type(exporter).__name__}.shutdown")

        helper = threading.Thread(target=run, name=f"{self.name}.shutdown", daemon=True)
        try:
            helper.start()
        except RuntimeError:  # no new thread at interpreter shutdown (3.12+): run it here, unbounded
            run()
            return
        helper.join(wait_s)
        if helper.is_alive():
            warn_once(
                "exporter-shutdown-timeout:" + type(exporter).__name__,
                "otel_agentloop: %s.shutdown() did not return within the shutdown timeout; left running in "
                "the background (spans it still held are counted as dropped)",
                type(exporter).__name__,
            )

    @property
    def stats(self) -> dict[str, int]:
        """The counters, read in one step: a span the worker takes from the queue is in flight at once, and
        counted exported, failed or dropped as it leaves flight (both under the same lock)."""
        with self._idle:
            return {
                "queued": self._queued,
                "exported": self._exported,
                "dropped": self._dropped + self._dropped_full,
                "failed": self._failed,
                "pending": len(self._queue) + self._in_flight,
            }


def failed_wait(processors: Iterable[object], wait_s: float) -> float:
    """``wait_s``, or less: until the earliest :meth:`ExportProcessor.failed_deadline` of the export processors
    among ``processors`` whose endpoint is failing. How long a flush or shutdown of what shares their endpoint
    (the handle's, the library's metrics) may wait: all of them together wait one ``failed_wait_s``."""
    now = time.monotonic()
    for p in processors:
        failed = p.failed_deadline() if isinstance(p, ExportProcessor) else None
        if failed is not None:
            wait_s = min(wait_s, max(failed - now, 0.0))
    return wait_s
