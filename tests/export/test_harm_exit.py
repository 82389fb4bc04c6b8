"""Issue 41 item 11 and issue 38 item 5: a dead Collector costs a process's exit a short bound, not its export
timeout, said in one line; and the first failed try is warned at once.

Real processes against a closed port, on every protocol: a plain exit (the SDK's exit hook), a forked child (a
multiprocessing or DataLoader worker) exiting, and an explicit flush and shutdown with long timeouts (what
``otel-agentloop simulate`` does at its end). The export timeout is a minute, so without the bound each exit
waits for the shutdown timeouts (~5 s per exporter, the library's metrics included) or the flush timeout (30 s).
The time bounds are generous (several times the setting); the one line is checked exactly.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

import otel_agentloop as oal
from tests._support.otlp_receiver import wait_for

PROTOCOLS = ["grpc", "http/protobuf", "http/json"]
WAIT_S = 0.5  # OTEL_AGENTLOOP_FAILED_EXPORT_WAIT in these processes
BOUND_S = 8.0  # generous: the bound is 0.5 s; without it, 10 s (plain exit, child) or 30 s (flush)
SPANS = 30

_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import otel_agentloop as oal

    endpoint, protocol, mode = sys.argv[1:4]
    handle = oal.configure("exit", endpoint=endpoint, protocol=protocol, schedule_delay_s=0.05,
                           export_timeout_s=60)

    def spans(step):
        for i in range({spans}):
            with oal.sample(i, step=step):
                pass

    def failed():  # the endpoint has failed: wait for its first failed try (at most 5 s)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if any(getattr(p, "failing", False) for p in handle.export_processors):
                return
            time.sleep(0.02)

    def exiting():
        print("EXITING", time.monotonic(), flush=True)

    if mode == "fork":
        spans(1)
        failed()
        pid = os.fork()
        if pid == 0:
            spans(2)
            exiting()
            sys.exit(0)  # the child's exit runs the exit hooks, as a worker's interpreter does
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not os.waitpid(pid, os.WNOHANG)[0]:
            time.sleep(0.02)
        print("CHILD_GONE", time.monotonic(), flush=True)
        os._exit(0)  # the parent's own exit is the plain case
    spans(1)
    failed()
    exiting()
    if mode == "flush":
        handle.force_flush(30)
        handle.shutdown(30)
""").format(spans=SPANS)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(protocol: str, mode: str) -> tuple[float, str]:
    """Run the script; (seconds from its "EXITING" mark to its exit, or to the child's exit; its stderr)."""
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    env_wait = {"OTEL_AGENTLOOP_FAILED_EXPORT_WAIT": str(WAIT_S)}
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, endpoint, protocol, mode],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env_wait},
    )
    ended = time.monotonic()
    marks = dict(line.split() for line in out.stdout.splitlines() if line.startswith(("EXITING", "CHILD_GONE")))
    assert "EXITING" in marks, out.stdout + out.stderr
    gone = float(marks["CHILD_GONE"]) if mode == "fork" else ended
    return gone - float(marks["EXITING"]), out.stderr


def _unsent_lines(stderr: str) -> list[re.Match[str]]:
    pattern = (
        r"otel_agentloop: otel_agentloop\.export\[otlp/\S+ \S+\]: (\d+) spans not sent \((\d+) failed, (\d+) dropped"
    )
    return [m for line in stderr.splitlines() if (m := re.match(pattern, line))]


@pytest.mark.e2e  # a subprocess
@pytest.mark.parametrize("mode", ["exit", "fork", "flush"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_dead_endpoint_costs_exit_a_short_bound_said_in_one_line(protocol: str, mode: str) -> None:
    took, stderr = _run(protocol, mode)
    assert took < BOUND_S, (took, stderr)
    lines = _unsent_lines(stderr)
    assert len(lines) == 1, stderr  # one line, in the process that exited (the fork's parent leaves by os._exit)
    total, failed, dropped = (int(g) for g in lines[0].groups())
    assert total == failed + dropped == SPANS, stderr  # every span of that process, none counted twice
    assert "the endpoint failed (" in stderr and "OTEL_AGENTLOOP_FAILED_EXPORT_WAIT=0.5 s" in stderr, stderr


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_first_failed_try_is_warned_at_once_and_once(protocol: str, caplog) -> None:
    """The warning comes with the first refused try, while the export still retries (a minute's timeout), not
    when the export gives up; later failures add no line."""
    caplog.set_level(logging.WARNING, logger="otel_agentloop")
    handle = oal.configure(
        "first-failure",
        endpoint=f"http://127.0.0.1:{_closed_port()}",
        protocol=protocol,
        set_global=False,
        schedule_delay_s=0.05,
        export_timeout_s=60,
    )
    try:

        def warned() -> list[str]:
            return [
                r.getMessage() for r in caplog.records if re.search(r"OTLP \S+ export to .* failed", r.getMessage())
            ]

        for step in range(3):
            for i in range(10):
                with oal.sample(i, step=step):
                    pass
            assert wait_for(lambda: bool(warned()), 20, 0.02), caplog.text
        assert handle.stats["failed"] == 0  # still retrying: the warning did not wait for the export to give up
        assert len(warned()) == 1, warned()
        assert protocol in warned()[0] and "retrying" in warned()[0]
    finally:
        handle.shutdown(0.5)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_collect_and_stats_give_one_dropped_count_against_a_dead_backend(protocol: str) -> None:
    """Issue 41 item 13: read one after the other with no span ending between, ``handle.stats`` and ``collect()``
    give the same dropped and failed counts: the spans still in the fast path's queue, which a full export
    queue will drop, are not ``pending`` on one surface and ``dropped`` on the other."""
    handle = oal.configure(
        "one-count",
        endpoint=f"http://127.0.0.1:{_closed_port()}",
        protocol=protocol,
        set_global=False,
        max_queue_size=64,
        max_export_batch_size=16,
        export_timeout_s=60,
    )
    try:
        for step in range(4):
            for i in range(200):  # under the fast path's wake-up batch (4 x 64): they wait in its queue
                with oal.sample(i, step=step):
                    pass
            stats = handle.stats
            metrics = handle.metrics.collect(step)
            assert metrics["agent_loop/telemetry/spans_dropped"] == stats["dropped"], (step, stats)
            assert metrics["agent_loop/telemetry/spans_failed"] == stats["failed"], (step, stats)
            assert stats["dropped"] > 0 and stats["pending"] <= 64 + 16, stats  # the export queue and a batch
    finally:
        handle.shutdown(0.5)


def test_a_full_queue_drops_a_span_as_cheaply_as_it_queues_one(monkeypatch, caplog) -> None:
    """Issue 41 item 12: a dead, slow or hung backend keeps the export queue full, so every span is dropped, on
    the thread that drains (a ``collect()`` on the training thread too). Dropping must cost what queueing does:
    no lock (the processor's condition, which its worker holds while it takes a batch), and no clock read per
    span (the once-a-minute warning reads it at the first drop, then every 256th). The count stays exact."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from otel_agentloop.export import _processor

    class Never(SpanExporter):
        def export(self, spans: object) -> SpanExportResult:
            return SpanExportResult.FAILURE

    class Span:
        flags = 1

    proc = _processor.ExportProcessor(Never(), max_queue_size=4, max_export_batch_size=4, schedule_delay_s=3600)
    try:
        proc._queue.extend(Span() for _ in range(4))  # full, the worker left asleep (a 1 h schedule delay)
        reads = [0]
        clock = time.monotonic

        def counted() -> float:
            reads[0] += 1
            return clock()

        class CountingCondition:
            acquired = 0

            def __init__(self, inner: object) -> None:
                self.inner = inner

            def __enter__(self) -> object:
                CountingCondition.acquired += threading.current_thread() is threading.main_thread()
                return self.inner.__enter__()  # type: ignore[attr-defined]

            def __exit__(self, *exc: object) -> object:
                return self.inner.__exit__(*exc)  # type: ignore[attr-defined]

            def __getattr__(self, name: str) -> object:
                return getattr(self.inner, name)

        monkeypatch.setattr(_processor.time, "monotonic", counted)
        monkeypatch.setattr(proc, "_idle", CountingCondition(proc._idle))
        caplog.set_level(logging.WARNING, logger="otel_agentloop")
        for _ in range(10_000):
            proc.record_end(Span())  # type: ignore[arg-type]
        monkeypatch.undo()
        assert CountingCondition.acquired == 0
        assert reads[0] <= 10_000 // 256 + 2, reads[0]
        assert proc.stats["dropped"] == 10_000 and proc.stats["pending"] == 4
        assert sum("export queue full" in r.getMessage() for r in caplog.records) == 1
    finally:
        proc.shutdown(0)


def test_the_failed_wait_is_one_window_that_a_success_closes() -> None:
    """Flushes while the endpoint fails share one ``failed_wait_s`` window; once an export succeeds, a later
    failure opens a new one (not a stale window that would make every later flush give up at once)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from otel_agentloop.export._processor import ExportProcessor

    tracer = TracerProvider(shutdown_on_exit=False).get_tracer("t")

    def finished_span() -> Any:
        span = tracer.start_span("x")
        span.end()
        return span

    class Switch(SpanExporter):
        ok = False

        def export(self, spans: object) -> SpanExportResult:
            return SpanExportResult.SUCCESS if self.ok else SpanExportResult.FAILURE

    exporter = Switch()
    proc = ExportProcessor(exporter, schedule_delay_s=0.01, failed_wait_s=0.3)
    try:
        proc.on_end(finished_span())
        assert wait_for(lambda: proc.failing, 10, 0.01)
        proc.on_end(finished_span())
        t0 = time.monotonic()
        proc.force_flush(60_000)  # the queue empties (failed) or the window ends it: never the 60 s
        first = proc.failed_deadline()
        assert first is not None and first <= t0 + 0.3 + 0.05
        exporter.ok = True
        proc.on_end(finished_span())
        assert wait_for(lambda: not proc.failing, 10, 0.01)  # recovered (no flush looked at the window meanwhile)
        time.sleep(0.35)  # the first window is over
        exporter.ok = False
        proc.on_end(finished_span())
        assert wait_for(lambda: proc.failing, 10, 0.01)
        second = proc.failed_deadline()
        assert second is not None and second > time.monotonic() + 0.1  # a new window, not the stale one
    finally:
        proc.shutdown(0)


def test_a_shutdown_after_the_window_is_spent_still_shuts_the_metrics_down(caplog) -> None:
    """Once a flush has spent the failed-export window, the shutdown waits nothing, yet it still shuts the
    library's metrics down without an internal error (the SDK's MeterProvider given 0 s raises and leaves its
    readers running)."""
    caplog.set_level(logging.WARNING, logger="otel_agentloop")
    handle = oal.configure(
        "spent",
        endpoint=f"http://127.0.0.1:{_closed_port()}",
        protocol="http/protobuf",
        set_global=False,
        schedule_delay_s=0.05,
        failed_export_wait_s=0.2,
    )
    for i in range(10):
        with oal.sample(i, step=1):
            pass
    assert wait_for(lambda: any(p.failing for p in handle.export_processors), 10, 0.02)
    handle.force_flush(5)  # opens the window
    time.sleep(0.4)  # and it is over
    handle.shutdown(5)
    assert not [r for r in caplog.records if "internal error" in r.getMessage()], caplog.text
    assert handle.live is not None and handle.live.metrics is not None
    assert handle.live.metrics.provider._shutdown  # the readers were shut down
