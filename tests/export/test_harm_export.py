"""Export never harms the user's program (issue 21): hostile text, hostile endpoints, unbounded timeouts.

Every endpoint is a real HTTP (or gRPC) server on 127.0.0.1, port 0: it redirects, streams huge or endless
answers, answers ``Retry-After: nan``, and so on. Each test bounds its own time (and, for answers, memory) so
that it fails, rather than hangs, on a regression.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import otel_agentloop as oal
from otel_agentloop.analysis import read_jsonl
from otel_agentloop.export import OTLPJsonFileExporter, OTLPJsonHttpExporter
from tests._support.otlp_receiver import Receiver, start_grpc, start_http, wait_for

BAD = os.fsdecode(b"caf\xe9")  # 'caf\udce9': a lone surrogate, as a non-UTF-8 file name decodes
REPAIRED = "caf\ufffd"


# -- a loopback server whose answers each test writes ------------------------------------------------------
class Loopback:
    """``ThreadingHTTPServer`` on 127.0.0.1:0. ``answer(handler)`` writes the answer to each request; every
    request is recorded as (method, path, lowercased headers); ``sent`` counts answer bytes written."""

    def __init__(self, answer: Callable[[BaseHTTPRequestHandler], None]) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.sent = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        loopback = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                with loopback.lock:
                    loopback.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a capped reader hangs up
                    answer(self)

            def do_POST(self) -> None:
                self._any()

            def do_GET(self) -> None:
                self._any()

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def write(self, handler: BaseHTTPRequestHandler, data: bytes) -> None:
        handler.wfile.write(data)
        with self.lock:
            self.sent += len(data)

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()

    def posts(self) -> int:
        with self.lock:
            return sum(1 for method, _, _ in self.requests if method == "POST")


@pytest.fixture
def loopbacks() -> Iterator[list[Loopback]]:
    servers: list[Loopback] = []
    yield servers
    for server in servers:
        server.close()


def _serve(loopbacks: list[Loopback], answer: Callable[[BaseHTTPRequestHandler], None]) -> Loopback:
    server = Loopback(answer)
    loopbacks.append(server)
    return server


def _ok(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Length", "0")
    handler.end_headers()


def _spans(n: int) -> list[ReadableSpan]:
    tracer = TracerProvider().get_tracer("harm")
    out = []
    for i in range(n):
        span = tracer.start_span(f"span-{i}")
        span.end()
        out.append(span)  # type: ignore[arg-type]
    return out


def _export_bounded(exporter: SpanExporter, spans: list[ReadableSpan], limit_s: float) -> tuple[Any, float]:
    """``exporter.export(spans)`` on a thread, waited for at most ``limit_s``: (result or None, seconds)."""
    result: list[Any] = []
    t0 = time.monotonic()
    worker = threading.Thread(target=lambda: result.append(exporter.export(spans)), daemon=True)
    worker.start()
    worker.join(limit_s)
    took = time.monotonic() - t0
    exporter.shutdown()  # ends an export that is still looping (the original code's NaN retry loop)
    worker.join(5)
    return (result[0] if result else None), took


# -- 1. hostile text: one lone surrogate never costs the batch --------------------------------------------
def _hostile_step(n_good: int) -> None:
    """``n_good`` plain samples and one sample whose text holds lone surrogates everywhere a user string goes:
    span name, attribute key and value (also inside a sequence), an event's name and attribute, an exception
    message (the exception event and the status message)."""
    for i in range(n_good):
        with oal.sample(i, step=1):
            pass

    @oal.trace_tool(BAD)
    def tool() -> None:
        from opentelemetry import trace

        span = trace.get_current_span()
        span.set_attribute(BAD, BAD)
        span.set_attribute("harm.seq", [BAD, "ok"])
        span.add_event(BAD, {"harm.msg": BAD})
        raise ValueError(BAD)

    with oal.sample(n_good, step=1), pytest.raises(ValueError):
        tool()


def _check_repaired(tool_attrs: dict[str, Any], tool_name: str) -> None:
    assert tool_name == f"execute_tool {REPAIRED}"
    assert tool_attrs[REPAIRED] == REPAIRED
    assert tool_attrs["harm.seq"] == (REPAIRED, "ok")
    assert tool_attrs["gen_ai.tool.name"] == REPAIRED


@pytest.mark.parametrize("protocol", ["file", "http/json", "http/protobuf", "grpc"])
def test_one_lone_surrogate_costs_no_span_of_the_batch(protocol: str, tmp_path) -> None:
    n_good = 50
    receiver = Receiver()
    server = None
    if protocol == "file":
        path = tmp_path / "t.jsonl"
        handle = oal.configure("harm", file=str(path), set_global=False, schedule_delay_s=0.05)
    else:
        server, endpoint = start_grpc(receiver) if protocol == "grpc" else start_http(receiver)
        handle = oal.configure("harm", endpoint=endpoint, protocol=protocol, set_global=False, schedule_delay_s=0.05)
    try:
        _hostile_step(n_good)
        assert handle.force_flush(10)
        stats = handle.stats
    finally:
        handle.shutdown(5)
        if server is not None:
            server.shutdown() if protocol != "grpc" else server.stop(0)
    created = n_good + 2  # the bad sample's root and its tool span
    assert stats["queued"] == stats["exported"] == created, stats
    assert stats["failed"] == stats["dropped"] == 0, stats
    if protocol == "file":
        records = list(read_jsonl(str(path)))
    else:
        assert wait_for(lambda: len(receiver.records) == created, 5, 0.05)
        records = receiver.records
    assert len(records) == created
    (tool,) = [r for r in records if r.name.startswith("execute_tool")]
    _check_repaired(tool.attributes, tool.name)
    assert tool.error
    if protocol == "file":  # events and the status message are in the file as written
        line = next(json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if "execute_tool" in x)
        span = next(
            s
            for rs in line["resourceSpans"]
            for ss in rs["scopeSpans"]
            for s in ss["spans"]
            if s["name"].startswith("execute_tool")
        )
        assert span["status"]["message"].endswith(REPAIRED)
        names = [e["name"] for e in span["events"]]
        assert REPAIRED in names and "exception" in names


def test_a_span_that_cannot_be_encoded_is_dropped_and_counted_not_the_batch(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    handle = oal.configure("harm", file=str(path), set_global=False, schedule_delay_s=0.05)
    try:
        tracer = handle.provider.get_tracer("harm")  # type: ignore[union-attr]
        for i in range(20):
            tracer.start_span(f"good-{i}").end()
        tracer.start_span(object()).end()  # type: ignore[arg-type]  # the SDK takes any name; JSON cannot
        assert handle.force_flush(10)
        stats = handle.stats
    finally:
        handle.shutdown(5)
    assert stats["queued"] == 21 and stats["exported"] == 20 and stats["dropped"] == 1, stats
    assert stats["failed"] == 0
    assert sorted(r.name for r in read_jsonl(str(path))) == sorted(f"good-{i}" for i in range(20))


def test_the_file_exporter_repairs_text_and_counts_what_it_cannot_encode(tmp_path) -> None:
    exporter = OTLPJsonFileExporter(tmp_path / "t.jsonl")
    tracer = TracerProvider(resource=Resource({"harm.dir": BAD})).get_tracer(BAD)
    bad = tracer.start_span(BAD, attributes={"k": (BAD, BAD + "\ud83d\ude00")})
    bad.end()
    broken = tracer.start_span(object())  # type: ignore[arg-type]
    broken.end()
    try:
        spans = [*_spans(3), bad, broken]
        assert exporter.export(spans) is SpanExportResult.SUCCESS  # type: ignore[arg-type]
        assert exporter.spans_unencodable == 1
    finally:
        exporter.shutdown()
    records = list(read_jsonl(str(tmp_path / "t.jsonl")))
    assert len(records) == 4
    (repaired,) = [r for r in records if r.name == REPAIRED]
    assert repaired.attributes["k"] == (REPAIRED, REPAIRED + "\U0001f600")  # a well-formed pair is joined
    assert repaired.resource["harm.dir"] == REPAIRED


# -- 2. the http/json export session -------------------------------------------------------------------------
@pytest.mark.parametrize("status", [307, 308])
def test_http_json_never_follows_a_redirect_with_the_credentials(loopbacks, status: int, caplog) -> None:
    other = _serve(loopbacks, _ok)  # another origin (another port)

    def redirect(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Location", other.url + "/v1/traces")
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    first = _serve(loopbacks, redirect)
    exporter = OTLPJsonHttpExporter(first.url, {"x-api-key": "s3cret"}, timeout_s=2)
    with caplog.at_level(logging.WARNING, "otel_agentloop"):
        result, _ = _export_bounded(exporter, _spans(3), 10)
    assert result is SpanExportResult.FAILURE
    assert other.requests == []  # neither the key nor the spans went to the other origin
    assert first.posts() == 1  # a redirect is not retried either
    assert f"HTTP {status}" in caplog.text and other.url + "/v1/traces" in caplog.text
    assert "s3cret" not in caplog.text


@pytest.mark.parametrize("status", [301, 302, 303])
def test_http_json_a_redirect_that_would_turn_the_post_into_a_get_is_a_failed_export(loopbacks, status: int) -> None:
    target = _serve(loopbacks, _ok)  # answers the GET with 200: "delivered" though nothing was

    def redirect(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Location", target.url + "/v1/traces")
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    first = _serve(loopbacks, redirect)
    handle = oal.configure("redirect", endpoint=first.url, protocol="http/json", set_global=False)
    try:
        with oal.sample(0, step=1):
            pass
        handle.force_flush(5)
        stats = handle.stats
    finally:
        handle.shutdown(2)
    assert target.requests == []
    assert stats["exported"] == 0 and stats["failed"] == 1, stats


def _measure_answer(loopbacks: list[Loopback], answer: Callable[[Loopback, BaseHTTPRequestHandler], None]):
    holder: list[Loopback] = []
    server = _serve(loopbacks, lambda handler: answer(holder[0], handler))
    holder.append(server)
    exporter = OTLPJsonHttpExporter(server.url, timeout_s=3, compression="none")
    tracemalloc.start()
    try:
        result, took = _export_bounded(exporter, _spans(5), 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        server.stop.set()
    return server, result, took, peak


HUGE = 256 << 20
CAP = 64 << 20  # the endless answer stops here whatever happens: the test's own bound on time and memory


def test_http_json_reads_a_huge_answer_capped(loopbacks) -> None:
    chunk = b"\0" * (1 << 20)

    def huge(server: Loopback, handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", str(HUGE))
        handler.end_headers()
        for _ in range(HUGE // len(chunk)):
            if server.stop.is_set():
                return
            server.write(handler, chunk)

    server, result, took, peak = _measure_answer(loopbacks, huge)
    print(f"\nhuge answer: {took:.2f} s, peak traced {peak / 1e6:.1f} MB, server sent {server.sent / 1e6:.1f} MB")
    assert result is SpanExportResult.SUCCESS
    assert peak < 16 << 20, peak  # the 256 MB answer is never held
    assert server.sent < 32 << 20, server.sent  # nor downloaded (what socket buffers take, at most)


def test_http_json_cuts_an_endless_answer(loopbacks) -> None:
    chunk = b"ff" * 32768

    def endless(server: Loopback, handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        frame = b"%x\r\n%s\r\n" % (len(chunk), chunk)
        while not server.stop.is_set() and server.sent < CAP:
            server.write(handler, frame)

    server, result, took, peak = _measure_answer(loopbacks, endless)
    print(f"\nendless answer: {took:.2f} s, peak traced {peak / 1e6:.1f} MB, server sent {server.sent / 1e6:.1f} MB")
    assert result is SpanExportResult.SUCCESS and took < 4  # within the 3 s export timeout
    assert peak < 16 << 20, peak
    assert server.sent < 32 << 20, server.sent  # the client hung up long before the server's own cap


@pytest.mark.parametrize("value", ["nan", "NaN", "-5", "0", "inf", "1e308", "99999999999999999999", "Mon, 99 Foo"])
def test_http_json_retry_after_garbage_keeps_retries_bounded(loopbacks, value: str) -> None:
    def unavailable(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(503)
        handler.send_header("Retry-After", value)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    server = _serve(loopbacks, unavailable)
    exporter = OTLPJsonHttpExporter(server.url, timeout_s=1)
    result, took = _export_bounded(exporter, _spans(2), 5)
    print(f"\nRetry-After {value!r}: {server.posts()} POSTs in {took:.2f} s")
    assert result is SpanExportResult.FAILURE, (result, server.posts())
    assert took < 2.5  # timeout_s=1, plus a loaded machine's margin
    assert server.posts() <= 11  # at least 0.1 s between tries: no hammering (was 5,610 in 5 s)


@pytest.mark.parametrize(
    "raw",
    [
        "x-api-key=abc%0Ainjected: 1,x-team=rl",
        "x-api-key=abc%0D%0A,x-team=rl",
        "x-api-key=a%00b,x-team=rl",
        "x-api-key=%E2%82%AC,x-team=rl",  # the euro sign: not Latin-1, http.client cannot send it
    ],
)
def test_http_json_a_header_http_cannot_carry_is_skipped_with_a_warning(monkeypatch, caplog, raw: str) -> None:
    receiver = Receiver()
    server, endpoint = start_http(receiver)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", raw)
    try:
        with caplog.at_level(logging.WARNING, "otel_agentloop"):
            handle = oal.configure("headers", set_global=False, schedule_delay_s=0.05)
            try:
                with oal.sample(0, step=1):
                    pass
                assert handle.force_flush(10)
                stats = handle.stats
            finally:
                handle.shutdown(2)
    finally:
        server.shutdown()
    assert stats["exported"] == 1 and stats["failed"] == 0, stats
    assert receiver.headers and receiver.headers[0].get("x-team") == "rl"
    assert "x-api-key" not in receiver.headers[0] and "injected" not in receiver.headers[0]
    assert "'x-api-key'" in caplog.text and "abc" not in caplog.text  # named, its value never shown


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_configure_headers_http_cannot_carry_are_skipped_for_the_sdk_exporters(caplog, protocol: str) -> None:
    """Headers given to ``configure()`` reach the SDK's exporters checked: a CR/LF item failed every export."""
    receiver = Receiver()
    if protocol == "grpc":
        server, endpoint = start_grpc(receiver)
        stop: Callable[[], object] = functools.partial(server.stop, 0)
    else:
        http_server, endpoint = start_http(receiver)
        stop = http_server.shutdown
    try:
        with caplog.at_level(logging.WARNING, "otel_agentloop"):
            handle = oal.configure(
                "headers",
                endpoint=endpoint,
                protocol=protocol,
                headers={"x-api-key": "abc\ninjected: 1", "x-team": "rl"},
                set_global=False,
                schedule_delay_s=0.05,
            )
            try:
                with oal.sample(0, step=1):
                    pass
                assert handle.force_flush(10)
                stats = handle.stats
            finally:
                handle.shutdown(2)
    finally:
        stop()
    assert stats["exported"] == 1 and stats["failed"] == 0, stats
    assert receiver.headers and receiver.headers[0].get("x-team") == "rl"
    assert "x-api-key" not in receiver.headers[0]
    assert "'x-api-key'" in caplog.text and "abc" not in caplog.text


def test_a_lone_surrogate_in_resource_attributes_does_not_stop_configure(tmp_path) -> None:
    """``os.fsdecode`` of a non-UTF-8 name as a resource attribute: configure() raised UnicodeEncodeError while
    writing the settings handed to Ray workers."""
    path = tmp_path / "t.jsonl"
    bad = os.fsdecode(b"host-\xe9")
    handle = oal.configure("surrogate", file=str(path), resource_attributes={"host.name": bad}, set_global=False)
    try:
        with oal.sample(0, step=1):
            pass
    finally:
        handle.shutdown(5)
    spans = list(read_jsonl(str(path)))
    assert [s.name for s in spans] == ["rl.sample"]
    assert spans[0].resource.get("host.name") == "host-\ufffd"


# -- 3. bounded durations -------------------------------------------------------------------------------------
class _StuckShutdown(SpanExporter):
    """Exports at once; its ``shutdown()`` blocks (as the SDK's OTLP exporters do with an export in flight)."""

    def __init__(self, block_s: float) -> None:
        self.block_s = block_s
        self.release = threading.Event()
        self.exported = 0

    def export(self, spans: Any) -> SpanExportResult:
        self.exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.wait(self.block_s)


def test_shutdown_returns_within_its_timeout_when_the_exporter_shutdown_blocks() -> None:
    stuck = _StuckShutdown(block_s=30)
    handle = oal.configure("stuck", exporters=[stuck], set_global=False, schedule_delay_s=0.05)
    try:
        for i in range(5):
            with oal.sample(i, step=1):
                pass
        t0 = time.monotonic()
        handle.shutdown(0.5)
        took = time.monotonic() - t0
    finally:
        stuck.release.set()
    print(f"\nshutdown(0.5) with a blocking exporter shutdown(): {took:.2f} s")
    assert took < 10, took  # 0.5 s, with room for a loaded machine; far below the 30 s the exporter blocks (was 30.5)
    stats = handle.stats
    assert stuck.exported == stats["exported"] == 5 and stats["dropped"] == stats["pending"] == 0, stats


class _StuckEverywhere(_StuckShutdown):
    """Its ``export()`` and its ``shutdown()`` both block: a backend that hangs mid-export."""

    def __init__(self, block_s: float) -> None:
        super().__init__(block_s)
        self.entered = threading.Event()

    def export(self, spans: Any) -> SpanExportResult:
        self.entered.set()
        self.release.wait(self.block_s)
        return SpanExportResult.FAILURE


def test_shutdown_counts_what_a_stuck_exporter_still_holds_as_dropped() -> None:
    stuck = _StuckEverywhere(block_s=30)
    handle = oal.configure("stuck", exporters=[stuck], set_global=False, schedule_delay_s=0.05)
    try:
        with oal.sample(0, step=1):
            pass
        assert stuck.entered.wait(5)  # the worker is inside export() with the first span now
        for i in range(1, 10):
            with oal.sample(i, step=1):
                pass
        t0 = time.monotonic()
        handle.shutdown(0.5)
        took = time.monotonic() - t0
        stats = handle.stats
    finally:
        stuck.release.set()
    print(f"\nshutdown(0.5) with export() and shutdown() both stuck: {took:.2f} s; {stats}")
    assert took < 10, took  # 0.5 s, with room for a loaded machine; far below the 30 s the exporter blocks
    assert stats["exported"] == stats["failed"] == stats["pending"] == 0, stats
    assert stats["dropped"] == stats["queued"] == 10, stats  # the stuck batch and the queue: all counted


@pytest.mark.parametrize("timeout", [math.inf, 1e12, math.nan, -1.0, pytest.param(10**400, id="int-beyond-float")])
def test_flush_and_shutdown_take_any_timeout_and_still_export(tmp_path, timeout: float) -> None:
    path = tmp_path / "t.jsonl"
    handle = oal.configure("timeouts", file=str(path), set_global=False, schedule_delay_s=60)
    for i in range(3):
        with oal.sample(i, step=1):
            pass
    t0 = time.monotonic()
    flushed = handle.force_flush(timeout)  # never raises
    for i in range(3, 6):
        with oal.sample(i, step=1):
            pass
    handle.shutdown(timeout)  # never raises, and exports what is queued
    took = time.monotonic() - t0
    stats = handle.stats
    if timeout > 0 or math.isnan(timeout):
        assert flushed
        assert stats["exported"] == 6 and stats["dropped"] == 0, stats
        assert len(list(read_jsonl(str(path)))) == 6
    else:  # no time at all: every span is still accounted for
        assert stats["exported"] + stats["failed"] + stats["dropped"] == 6 and stats["pending"] == 0, stats
    assert took < 10, took
