"""Our OTLP gRPC and http/protobuf exporters against real servers on 127.0.0.1 (free ports): what reaches the
receiver, headers, compression, TLS from the OTLP variables, retries with back-off (the receiver's RetryInfo
honoured), no retry of a permanent error, partial success warned, shutdown ending a back-off wait."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from concurrent import futures
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_agentloop.config._otlp import OtlpTarget, resolve_otlp
from otel_agentloop.export._grpc import OTLPGrpcExporter
from otel_agentloop.export._http_proto import OTLPProtoHttpExporter
from tests._support.fast_records import sample_records
from tests._support.otlp_receiver import Receiver, start_grpc, start_http
from tests._support.tls import self_signed

_ENV = [
    f"OTEL_EXPORTER_OTLP_{kind}{name}"
    for kind in ("", "TRACES_")
    for name in ("ENDPOINT", "HEADERS", "INSECURE", "CERTIFICATE", "CLIENT_KEY", "CLIENT_CERTIFICATE", "COMPRESSION")
]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*_ENV, "OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES"):
        monkeypatch.delenv(name, raising=False)


def _batch() -> list[Any]:
    """Fast-path records and an SDK span (a user's own, through the same resource), in one batch."""
    provider = TracerProvider(resource=Resource({"service.name": "encode-test"}))
    with provider.get_tracer("user.code").start_as_current_span("user span") as sdk_span:
        sdk_span.set_attribute("x", 1)
    return [*sample_records(), sdk_span]


class _Scripted(trace_service_pb2_grpc.TraceServiceServicer):
    """Answers each call from ``script`` (a status code, with an optional RetryInfo delay), then OK (with
    ``partial`` as the partial success); records each call's arrival."""

    def __init__(self, script: list[tuple[grpc.StatusCode, float | None]], partial: tuple[int, str] | None = None):
        self.script = list(script)
        self.partial = partial
        self.times: list[float] = []
        self.spans = 0

    def Export(self, request: Any, context: Any) -> Any:
        self.times.append(time.monotonic())
        if self.script:
            code, delay = self.script.pop(0)
            if delay is not None:
                info = error_details_pb2.RetryInfo()
                info.retry_delay.FromNanoseconds(int(delay * 1e9))
                context.set_trailing_metadata((("google.rpc.retryinfo-bin", info.SerializeToString()),))
            context.abort(code, "scripted")
        self.spans += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        answer = trace_service_pb2.ExportTraceServiceResponse()
        if self.partial is not None:
            answer.partial_success.rejected_spans, answer.partial_success.error_message = self.partial
        return answer


def _target(endpoint: str | None, headers: dict[str, object] | None = None, **given: Any) -> OtlpTarget:
    """The traces' target an exporter is built from: the environment's, with ``endpoint`` and ``headers`` as
    arguments (as ``configure()`` resolves it) and an exporter's own ``given`` arguments."""
    return resolve_otlp("TRACES", endpoint, headers).given(**given)


def _serve(servicer: Any) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"http://127.0.0.1:{port}"


# -- gRPC -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_grpc_sends_records_and_sdk_spans_with_headers(compression: str) -> None:
    receiver = Receiver()
    server, endpoint = start_grpc(receiver)
    exporter = OTLPGrpcExporter(_target(endpoint, {"X-Team": "rl"}, timeout_s=5, compression=compression))
    batch = _batch()
    try:
        assert exporter.export(batch) is SpanExportResult.SUCCESS
        assert exporter.export(batch[:1]) is SpanExportResult.SUCCESS  # the channel is reused
    finally:
        exporter.shutdown()
        server.stop(0)
    assert [r.name for r in receiver.records] == [s.name for s in batch] + [batch[0].name]
    assert (
        receiver.records[0].attributes["s"] == "text é ✓" and receiver.records[0].attributes["bytes"] == b"\x00\xffraw"
    )
    assert receiver.headers[0]["x-team"] == "rl"
    assert exporter.export(batch) is SpanExportResult.FAILURE  # after shutdown


def test_grpc_target_reads_the_environment_as_the_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _target(None).grpc_address == "localhost:4317" and _target(None).grpc_tls_files is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Api-Key=s3cret,x-team=rl")
    target = _target(None)
    assert target.grpc_address == "collector:4317" and target.grpc_tls_files == (None, None, None)
    assert target.grpc_metadata == (("api-key", "s3cret"), ("x-team", "rl"))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4317")  # no scheme: TLS by default
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", "/ca.pem")
    assert _target(None).grpc_tls_files == ("/ca.pem", None, None)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "/traces-ca.pem")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", "/k.pem")
    assert _target(None).grpc_tls_files == ("/traces-ca.pem", "/k.pem", None)  # the _TRACES_ set, as the SDK
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "true")
    assert _target(None).grpc_tls_files is None
    given = _target("http://127.0.0.1:1", {"a": "b", "X-Team": "given"}).grpc_metadata  # the argument updates them
    assert given == (("api-key", "s3cret"), ("x-team", "given"), ("a", "b"))
    monkeypatch.setenv("OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES", "unavailable, internal")
    assert OTLPGrpcExporter(_target(None)).retryable == ("UNAVAILABLE", "INTERNAL")


def test_grpc_retries_a_retryable_status_after_the_receivers_retry_info() -> None:
    servicer = _Scripted([(grpc.StatusCode.UNAVAILABLE, None), (grpc.StatusCode.RESOURCE_EXHAUSTED, 0.05)])
    server, endpoint = _serve(servicer)
    exporter = OTLPGrpcExporter(_target(endpoint, timeout_s=10))
    try:
        assert exporter.export(_batch()) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
        server.stop(0)
    assert len(servicer.times) == 3 and servicer.spans == len(_batch())
    first_wait, second_wait = servicer.times[1] - servicer.times[0], servicer.times[2] - servicer.times[1]
    assert 0.7 < first_wait < 3  # back-off: 1 s, jittered
    assert second_wait < 0.6  # the receiver asked for 50 ms


def test_grpc_does_not_retry_a_permanent_error_nor_wait_past_its_timeout(caplog: pytest.LogCaptureFixture) -> None:
    servicer = _Scripted([(grpc.StatusCode.INVALID_ARGUMENT, None)])
    server, endpoint = _serve(servicer)
    exporter = OTLPGrpcExporter(_target(endpoint, timeout_s=10))
    try:
        with caplog.at_level(logging.WARNING, "otel_agentloop"):
            assert exporter.export(_batch()) is SpanExportResult.FAILURE
        assert len(servicer.times) == 1
        assert "INVALID_ARGUMENT" in caplog.text
        # a retryable status whose next try would start past the timeout fails at once
        servicer.script = [(grpc.StatusCode.UNAVAILABLE, 5.0)] * 2
        short = OTLPGrpcExporter(_target(endpoint, timeout_s=1))
        t0 = time.monotonic()
        assert short.export(_batch()) is SpanExportResult.FAILURE
        assert time.monotonic() - t0 < 1
        short.shutdown()
    finally:
        exporter.shutdown()
        server.stop(0)


def test_grpc_partial_success_is_warned(caplog: pytest.LogCaptureFixture) -> None:
    servicer = _Scripted([], partial=(2, "spans too old"))
    server, endpoint = _serve(servicer)
    exporter = OTLPGrpcExporter(_target(endpoint, timeout_s=5))
    try:
        with caplog.at_level(logging.WARNING, "otel_agentloop"):
            assert exporter.export(_batch()) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
        server.stop(0)
    assert "rejected 2 span(s)" in caplog.text and "spans too old" in caplog.text


def test_grpc_shutdown_ends_a_back_off_wait() -> None:
    servicer = _Scripted([(grpc.StatusCode.UNAVAILABLE, 20.0)] * 3)
    server, endpoint = _serve(servicer)
    exporter = OTLPGrpcExporter(_target(endpoint, timeout_s=30))
    result: list[SpanExportResult] = []
    worker = threading.Thread(target=lambda: result.append(exporter.export(_batch())))
    try:
        worker.start()
        deadline = time.monotonic() + 5
        while not servicer.times and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        t0 = time.monotonic()
        exporter.shutdown()
        worker.join(5)
        # ended at once: far below the 20 s back-off it was waiting out (a bound with room for a loaded machine)
        assert time.monotonic() - t0 < 10 and result == [SpanExportResult.FAILURE]
        assert len(servicer.times) == 1
    finally:
        server.stop(0)


@pytest.mark.e2e  # a subprocess
@pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl CLI makes the test certificates")
def test_grpc_tls_from_the_certificate_variable(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = self_signed(tmp_path, "server", "127.0.0.1", "IP:127.0.0.1")
    receiver = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    from tests._support.otlp_receiver import _Servicer

    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Servicer(receiver), server)
    with open(cert, "rb") as c, open(key, "rb") as k:
        credentials = grpc.ssl_server_credentials([(k.read(), c.read())])
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:
        untrusted = OTLPGrpcExporter(_target(f"https://127.0.0.1:{port}", timeout_s=2))
        assert untrusted.export(_batch()) is SpanExportResult.FAILURE  # self-signed: not trusted by default
        untrusted.shutdown()
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", cert)
        trusted = OTLPGrpcExporter(_target(f"127.0.0.1:{port}", timeout_s=5))  # no scheme: TLS
        assert trusted.export(_batch()) is SpanExportResult.SUCCESS
        trusted.shutdown()
    finally:
        server.stop(0)
    assert len(receiver.records) == len(_batch())


# -- http/protobuf ---------------------------------------------------------------------------------------------
def test_http_target_reads_the_environment_as_the_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (_target(None).url, _target(None).http_headers) == ("http://localhost:4318/v1/traces", {})
    assert _target("http://c:4318").url == "http://c:4318/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "X-A=1,b=2")
    target = _target(None, {"B": "3"})
    assert (target.url, target.http_headers) == ("http://c:4318/v1/traces", {"x-a": "1", "b": "3"})
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/custom")
    assert _target(None).url == "http://c:4318/custom"  # used as it is, as the SDK does


@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
def test_http_protobuf_sends_records_compressed_as_configured(compression, monkeypatch) -> None:
    if compression is not None:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", compression)
    receiver = Receiver()
    server, endpoint = start_http(receiver)
    exporter = OTLPProtoHttpExporter(_target(endpoint, {"x-team": "rl"}, timeout_s=5))
    batch = _batch()
    try:
        assert exporter.export(batch) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
        server.shutdown()
    assert [r.name for r in receiver.records] == [s.name for s in batch]
    sent = receiver.headers[0]
    assert sent["content-type"] == "application/x-protobuf" and sent["x-team"] == "rl"
    assert sent.get("content-encoding") == compression  # none unless asked, as the SDK's exporter


def test_http_protobuf_retries_503_and_warns_a_partial_success(caplog: pytest.LogCaptureFixture) -> None:
    receiver = Receiver()
    partial = trace_service_pb2.ExportTraceServiceResponse()
    partial.partial_success.rejected_spans = 3
    partial.partial_success.error_message = "quota"
    server, endpoint = start_http(receiver)
    receiver.answers = [(503, {"Retry-After": "0"}), (429, {})]
    exporter = OTLPProtoHttpExporter(_target(endpoint, timeout_s=10))
    try:
        assert exporter.export(_batch()) is SpanExportResult.SUCCESS  # third try
        assert len(receiver.times) == 3 and len(receiver.records) == len(_batch())
        body = partial.SerializeToString()
        receiver.answers = [(200, {"Content-Type": "application/x-protobuf"}, body)]  # type: ignore[list-item]
        with caplog.at_level(logging.WARNING, "otel_agentloop"):
            assert exporter.export(_batch()) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
        server.shutdown()
    assert "rejected 3 span(s)" in caplog.text and "quota" in caplog.text


# -- configure() ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf", "http/json", "file"])
def test_configure_exports_records_without_materialising_them(protocol, tmp_path, monkeypatch) -> None:
    """configure() builds our exporters, and they take the fast path's records as they are: no SDK span is
    built for export (the door's ``materialise`` is never called)."""
    import otel_agentloop as oal
    from otel_agentloop.analysis import read_jsonl
    from otel_agentloop.core import _door
    from otel_agentloop.export import OTLPJsonFileExporter, OTLPJsonHttpExporter

    built: list[Any] = []
    real = _door.materialise
    monkeypatch.setattr(_door, "materialise", lambda span, processor=None: built.append(span) or real(span, processor))
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    receiver = Receiver()
    server: Any = None
    if protocol == "file":
        handle = oal.configure("records", file=str(tmp_path / "t.jsonl"), set_global=False, schedule_delay_s=0.05)
    else:
        server, endpoint = start_grpc(receiver) if protocol == "grpc" else start_http(receiver)
        handle = oal.configure("records", endpoint=endpoint, protocol=protocol, set_global=False, schedule_delay_s=0.05)
    try:
        (processor,) = handle.export_processors
        kinds = {
            "grpc": OTLPGrpcExporter,
            "http/protobuf": OTLPProtoHttpExporter,
            "http/json": OTLPJsonHttpExporter,
            "file": OTLPJsonFileExporter,
        }
        assert type(processor.exporter) is kinds[protocol]

        @oal.trace_tool("search")
        def search() -> int:
            return 1

        for i in range(3):
            with oal.sample(i, step=1):
                search()
        assert handle.force_flush(10)
        stats = handle.stats
    finally:
        handle.shutdown(5)
        if server is not None:
            server.stop(0) if protocol == "grpc" else server.shutdown()
    names = (
        [s.name for s in read_jsonl(str(tmp_path / "t.jsonl"))]
        if protocol == "file"
        else [r.name for r in receiver.records]
    )
    assert sorted(names) == ["execute_tool search"] * 3 + ["rl.sample"] * 3, names
    assert stats["exported"] == 6 and stats["failed"] == stats["dropped"] == 0, stats
    assert not built


def test_configure_resolves_the_otlp_settings_once_signal_over_generic_and_the_exporter_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``handle.otlp``: each signal's variable over the generic one, as the OTel specification says; the trace
    exporter connects, compresses and sends headers as it says, and the metrics get their own."""
    import otel_agentloop as oal

    receiver = Receiver()
    server, endpoint = start_http(receiver)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # the traces' own wins
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint + "/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "deflate")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-generic=1")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-traces=2")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    handle = oal.configure("otlp-once", set_global=False, schedule_delay_s=0.05)
    try:
        traces, metrics = handle.otlp.traces, handle.otlp.metrics
        assert (traces.url, traces.source) == (endpoint + "/v1/traces", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        assert (traces.protocol, traces.compression, dict(traces.headers)) == (
            "http/protobuf",
            "deflate",
            {"x-traces": "2"},
        )
        assert (metrics.endpoint, metrics.url) == ("http://127.0.0.1:9", "http://127.0.0.1:9/v1/metrics")
        assert (metrics.compression, dict(metrics.headers)) == ("gzip", {"x-generic": "1"})
        with oal.sample(0, step=1):
            pass
        assert handle.force_flush(10)
    finally:
        handle.shutdown(5)
        server.shutdown()
    assert [r.name for r in receiver.records] == ["rl.sample"]
    sent = receiver.headers[0]
    assert sent["content-encoding"] == "deflate" and sent["x-traces"] == "2" and "x-generic" not in sent
