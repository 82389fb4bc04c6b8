"""One resolved OTLP target builds every exporter (issue 40, item 1): the URL of each signal, the headers, TLS,
compression and timeout rules are the target's own (``config._otlp.OtlpTarget``), and the trace exporters
(gRPC, http/protobuf, http/json: built by ``configure()``'s own table) and the metric exporter follow them,
read off real receivers on 127.0.0.1."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_agentloop.config._otlp import OtlpTarget, resolve_otlp
from otel_agentloop.export._sending import SendingExporter
from otel_agentloop.setup._wiring import otlp_exporter
from tests._support.fast_records import sample_records
from tests._support.header_servers import serve_metrics
from tests._support.otlp_receiver import Receiver, _Servicer, start_grpc, start_http, wait_for
from tests._support.tls import self_signed

PROTOCOLS = ["grpc", "http/protobuf", "http/json"]
# conftest's ``_isolate``: no OTEL_* variable from outside, once-only warnings forgotten before each test


def _exporter(target: OtlpTarget) -> SendingExporter:
    """The trace exporter ``configure()`` builds for ``target``."""
    return otlp_exporter(target)


def _serve(protocol: str, receiver: Receiver) -> tuple[str, Callable[[], object]]:
    if protocol == "grpc":
        server, endpoint = start_grpc(receiver)
        return endpoint, functools.partial(server.stop, 0)
    http_server, endpoint = start_http(receiver)
    return endpoint, http_server.shutdown


def _export_once(target: OtlpTarget) -> SpanExportResult:
    exporter = _exporter(target)
    try:
        return exporter.export_records(sample_records())
    finally:
        exporter.shutdown()


# -- URL ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("signal", ["TRACES", "METRICS"])
def test_the_url_of_each_signal(monkeypatch: pytest.MonkeyPatch, signal: Any) -> None:
    path = "/v1/" + signal.lower()
    assert resolve_otlp(signal).url == "http://localhost:4318" + path
    assert resolve_otlp(signal, "http://c:4318/").url == "http://c:4318" + path  # an argument: the path appended
    assert resolve_otlp(signal, "http://c:4318" + path).url == "http://c:4318" + path  # not twice
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://generic:4318/")
    assert resolve_otlp(signal).url == "http://generic:4318" + path  # the generic variable: the path appended
    monkeypatch.setenv(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT", "http://own:4318/custom")
    assert resolve_otlp(signal).url == "http://own:4318/custom"  # the signal's own: used as it is
    assert resolve_otlp(signal, "http://arg:1").url == "http://arg:1" + path  # the argument wins
    other = "METRICS" if signal == "TRACES" else "TRACES"
    assert resolve_otlp(other).url == "http://generic:4318/v1/" + other.lower()  # the other signal's own path


def test_the_grpc_address_and_its_tls() -> None:
    assert (resolve_otlp("TRACES").grpc_address, resolve_otlp("TRACES").grpc_tls_files) == ("localhost:4317", None)
    assert resolve_otlp("TRACES", "https://c:4317").grpc_tls_files == (None, None, None)  # TLS, the system's CAs
    assert resolve_otlp("TRACES", "c:4317").grpc_address == "c:4317"  # no scheme: as it is, TLS
    assert not resolve_otlp("TRACES", "c:4317").grpc_insecure
    assert resolve_otlp("TRACES", "http://[::1").grpc_address == "http://[::1"  # unparsable: handed as it is


@pytest.mark.parametrize("protocol", ["http/protobuf", "http/json"])
def test_the_signals_own_variable_is_posted_to_as_it_is_on_every_http_protocol(
    monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    """``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is the URL (the SDK's rule); http/json appended ``/v1/traces``."""
    receiver = Receiver()
    receiver.path = "/custom"
    server, endpoint = start_http(receiver)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint + "/custom")
    try:
        assert _export_once(resolve_otlp("TRACES", protocol=protocol)) is SpanExportResult.SUCCESS
    finally:
        server.shutdown()
    assert receiver.paths == ["/custom"] and len(receiver.records) == len(sample_records())


# -- headers -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_trace_exporter_sends_the_targets_headers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, protocol: str
) -> None:
    receiver = Receiver()
    endpoint, stop = _serve(protocol, receiver)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-env=1,x-team=environment")
    target = resolve_otlp("TRACES", endpoint, {"X-Team": "rl", "x-bad": "a\nb-secret"}, protocol=protocol)
    try:
        with caplog.at_level(logging.WARNING, "otel_agentloop"):
            assert _export_once(target) is SpanExportResult.SUCCESS
    finally:
        stop()
    sent = receiver.headers[0]
    assert (sent.get("x-env"), sent.get("x-team"), "x-bad" in sent) == ("1", "rl", False)
    assert "'x-bad'" in caplog.text and "secret" not in caplog.text  # skipped, named, its value never shown


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_metric_exporter_follows_the_same_target(protocol: str) -> None:
    """The metrics' URL (the signal's path appended to an argument) and headers, by the same rules."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    from otel_agentloop.metrics._otel import _otlp_metric_exporter

    headers: list[dict[str, object]] = []
    url, stop = serve_metrics(protocol, headers)  # HTTP: records a request at /v1/metrics only
    endpoint = url.removesuffix("/v1/metrics")
    target = resolve_otlp("METRICS", endpoint, {"X-Team": "rl", "x-bad": "a\nb"}, protocol=protocol)
    provider = MeterProvider(metric_readers=[PeriodicExportingMetricReader(_otlp_metric_exporter(target), 60_000)])
    try:
        provider.get_meter("target").create_counter("calls").add(1)
        provider.shutdown()  # the reader's last export
        assert wait_for(lambda: bool(headers), 5)
    finally:
        stop()
    assert headers[0].get("x-team") == "rl" and "x-bad" not in headers[0]


# -- TLS ---------------------------------------------------------------------------------------------------------
@pytest.fixture
def tls_files(tmp_path: Any) -> tuple[str, str]:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI makes the test certificates")
    return self_signed(tmp_path, "server", "127.0.0.1", "IP:127.0.0.1")


def _serve_tls(protocol: str, receiver: Receiver, cert: str, key: str) -> tuple[str, Callable[[], object]]:
    if protocol != "grpc":
        http_server, endpoint = start_http(receiver, tls=(cert, key))
        return endpoint, http_server.shutdown
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Servicer(receiver), server)
    with open(cert, "rb") as c, open(key, "rb") as k:
        port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(k.read(), c.read())]))
    server.start()
    return f"https://127.0.0.1:{port}", functools.partial(server.stop, 0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_trace_exporter_trusts_the_targets_certificate(
    monkeypatch: pytest.MonkeyPatch, tls_files: tuple[str, str], protocol: str
) -> None:
    receiver = Receiver()
    endpoint, stop = _serve_tls(protocol, receiver, *tls_files)
    try:
        untrusted = resolve_otlp("TRACES", endpoint, protocol=protocol).given(timeout_s=2)
        assert _export_once(untrusted) is SpanExportResult.FAILURE  # self-signed: not trusted by default
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", tls_files[0])
        trusted = resolve_otlp("TRACES", endpoint, protocol=protocol).given(timeout_s=5)
        assert trusted.http_verify == tls_files[0] and trusted.grpc_tls_files == (tls_files[0], None, None)
        assert _export_once(trusted) is SpanExportResult.SUCCESS
    finally:
        stop()
    assert len(receiver.records) == len(sample_records())


# -- compression -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("protocol", "variable", "given", "encoding"),
    [
        ("http/json", None, None, "gzip"),  # its own default: JSON shrinks ~10x
        ("http/protobuf", None, None, None),  # none, as the SDK's
        ("http/json", "none", None, None),
        ("http/protobuf", "gzip", None, "gzip"),
        ("http/protobuf", "gzip", "deflate", "deflate"),  # an exporter's argument wins
    ],
)
def test_http_compression_per_protocol(
    monkeypatch: pytest.MonkeyPatch, protocol: str, variable: str | None, given: str | None, encoding: str | None
) -> None:
    if variable is not None:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", variable)
    receiver = Receiver()
    server, endpoint = start_http(receiver)
    try:
        target = resolve_otlp("TRACES", endpoint, protocol=protocol).given(compression=given)
        assert _export_once(target) is SpanExportResult.SUCCESS
    finally:
        server.shutdown()
    assert receiver.headers[0].get("content-encoding") == encoding and len(receiver.records) == len(sample_records())


def test_a_compression_no_protocol_knows_is_warned_and_the_default_used(caplog: pytest.LogCaptureFixture) -> None:
    target = resolve_otlp("TRACES").given(compression="brotli")
    with caplog.at_level(logging.WARNING, "otel_agentloop"):
        assert (target.compression_for("http/json"), target.compression_for("http/protobuf")) == ("gzip", "none")
    assert "'brotli' is not one of gzip, deflate, none" in caplog.text
    assert target.grpc_compression is grpc.Compression.NoCompression


@pytest.fixture
def counting_proxy() -> Iterator[Callable[[str], tuple[str, list[int]]]]:
    """A TCP proxy on 127.0.0.1 to ``endpoint`` that counts the bytes the client sends: what went on the wire."""
    closers: list[Callable[[], None]] = []

    def start(endpoint: str) -> tuple[str, list[int]]:
        upstream = endpoint.removeprefix("http://").rsplit(":", 1)
        listener = socket.create_server(("127.0.0.1", 0))
        sent = [0]

        def pump(src: socket.socket, dst: socket.socket, count: bool) -> None:
            with contextlib.suppress(OSError), src, dst:  # the other direction closed them both
                while data := src.recv(65536):
                    sent[0] += len(data) if count else 0
                    dst.sendall(data)

        def serve() -> None:
            with listener:
                while True:
                    try:
                        client, _ = listener.accept()
                    except OSError:
                        return
                    server = socket.create_connection((upstream[0], int(upstream[1])))
                    threading.Thread(target=pump, args=(client, server, True), daemon=True).start()
                    threading.Thread(target=pump, args=(server, client, False), daemon=True).start()

        threading.Thread(target=serve, daemon=True).start()
        closers.append(listener.close)
        return f"http://127.0.0.1:{listener.getsockname()[1]}", sent

    yield start
    for close in closers:
        close()


def test_grpc_compression_reaches_the_wire(monkeypatch: pytest.MonkeyPatch, counting_proxy: Any) -> None:
    receiver = Receiver()
    server, endpoint = start_grpc(receiver)
    wire: dict[str, int] = {}
    try:
        for name in ("none", "gzip"):
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", name)
            proxied, sent = counting_proxy(endpoint)
            exporter = _exporter(resolve_otlp("TRACES", proxied, protocol="grpc"))
            assert exporter.export_records(sample_records() * 50) is SpanExportResult.SUCCESS
            exporter.shutdown()
            wire[name] = sent[0]
    finally:
        server.stop(0)
    assert len(receiver.records) == 2 * 50 * len(sample_records())
    assert wire["gzip"] * 3 < wire["none"], wire  # repeated spans: gzip shrinks them several times


# -- timeout -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, True, "10"])
def test_a_timeout_that_is_no_positive_number_is_warned_and_the_default_used(
    caplog: pytest.LogCaptureFixture, value: Any
) -> None:
    target = resolve_otlp("TRACES").given(timeout_s=value)
    with caplog.at_level(logging.WARNING, "otel_agentloop"):
        assert target.timeout_for("http/json") == 10.0
    assert "OTLP http/json timeout" in caplog.text
    assert (resolve_otlp("TRACES").timeout_for("grpc"), resolve_otlp("TRACES", timeout_s=2.5).timeout_for("grpc")) == (
        10.0,
        2.5,
    )


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_trace_exporter_gives_up_at_the_targets_timeout(protocol: str) -> None:
    """A receiver that accepts the connection and never answers: the export fails at the target's deadline (1 s),
    not the default 10 s."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # the kernel completes the handshakes; nothing reads
        target = resolve_otlp("TRACES", f"http://127.0.0.1:{silent.getsockname()[1]}", protocol=protocol, timeout_s=1)
        exporter = _exporter(target)
        assert exporter.timeout_s == 1.0
        t0 = time.monotonic()
        try:
            assert exporter.export_records(sample_records()) is SpanExportResult.FAILURE
        finally:
            exporter.shutdown()
        assert time.monotonic() - t0 < 5  # a bound, not a measurement: the default would take 10 s
