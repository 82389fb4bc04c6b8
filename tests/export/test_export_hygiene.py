"""Export hygiene (issue 12, item 4): exports make no spans under real client instrumentation; the OTLP-JSON
encoder's public-API fallback writes the same JSON; the http/json exporter reuses its connection and honours
Retry-After, compression and TLS settings. Every target is a real server on 127.0.0.1."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

import otel_agentloop as oal
from otel_agentloop.core._door import to_record
from otel_agentloop.export import OTLPJsonHttpExporter
from otel_agentloop.export._http_json import retry_after_s
from otel_agentloop.export._otlp_json import encode_spans
from tests._support import REPO_ROOT
from tests._support.otlp_receiver import Receiver, start_grpc, start_http, wait_for
from tests._support.tls import self_signed

ROOT = REPO_ROOT
OURS = [f"ours-{i}" for i in range(5)]  # what tests/export/instrumented_export.py makes


def _child(protocol: str, endpoint: str, mode: str) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().with_name("instrumented_export.py")), protocol, endpoint, mode],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.e2e  # a subprocess
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf", "http/json"])
def test_exports_under_real_client_instrumentation_make_no_spans(protocol: str) -> None:
    receiver = Receiver()
    server, endpoint = start_grpc(receiver) if protocol == "grpc" else start_http(receiver)
    try:
        stats = _child(protocol, endpoint, "suppressed")
        assert stats["exported"] == stats["queued"] == len(OURS) and stats["failed"] == 0
        assert wait_for(lambda: len(receiver.records) >= len(OURS), 10)
        time.sleep(0.2)  # anything more would have arrived by now
        assert sorted(r.name for r in receiver.records) == OURS  # no HTTP POST / gRPC Export client spans

        # the same exports with our suppression turned off: every export records a client span, which the
        # next export sends (and records another): the check above can fail
        receiver.records.clear()
        _child(protocol, endpoint, "unsuppressed")
        names = {r.name for r in receiver.records}
        client = "/opentelemetry.proto.collector.trace.v1.TraceService/Export" if protocol == "grpc" else "POST"
        assert set(OURS) <= names and client in names, names
        assert sum(r.name == client for r in receiver.records) > len(OURS)
    finally:
        server.stop(0) if protocol == "grpc" else server.shutdown()


# -- OTLP-JSON encoder: the public-API fallback ------------------------------------------------------------
class _PublicOnly:
    """A ReadableSpan-like object with the public API only: every private field is missing."""

    __slots__ = ("span",)

    def __init__(self, span: object) -> None:
        self.span = span

    def __getattr__(self, name: str) -> object:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.span, name)


class _Moved(_PublicOnly):
    """Private fields still there but of another shape (as if the SDK changed them)."""

    __slots__ = ()

    def __getattr__(self, name: str) -> object:
        if name.startswith("_"):
            return "moved"
        return getattr(self.span, name)


def _sdk_spans() -> list:
    memory = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "enc", "rl.run.id": "r1"}),
        span_limits=SpanLimits(max_span_attributes=6),
    )
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("enc-scope", "1.2")
    other = provider.get_tracer("other-scope")
    with tracer.start_as_current_span("root", kind=SpanKind.SERVER) as root:
        root.set_attributes({"s": 'q"uote\n', "i": 7, "f": 0.5, "b": True, "seq": [1, 2], "nan": float("nan")})
        root.set_attribute("evicts-the-oldest", "x")  # one over the limit: droppedAttributesCount
        root.add_event("ev", {"k": "v", "n": 3})
        with tracer.start_as_current_span(
            "child", kind=SpanKind.CLIENT, links=[Link(root.get_span_context(), {"why": "follows"})]
        ) as child:
            child.set_status(Status(StatusCode.ERROR, "boom"))
        with other.start_as_current_span("ok") as ok:
            ok.set_status(Status(StatusCode.OK))
    provider.shutdown()
    return list(memory.get_finished_spans())


def test_the_door_falls_back_to_the_public_span_api() -> None:
    """An SDK span reaches the encoders as a record (``to_record``): read from the SDK's own fields, or from
    the public API where they are missing or moved (another SDK version): the same JSON."""
    spans = _sdk_spans()
    fast = encode_spans([to_record(s) for s in spans])
    assert encode_spans([to_record(_PublicOnly(s)) for s in spans]) == fast  # type: ignore[arg-type]
    assert encode_spans([to_record(_Moved(s)) for s in spans]) == fast  # type: ignore[arg-type]
    decoded = json.loads(fast)["resourceSpans"][0]
    by_name = {s["name"]: s for ss in decoded["scopeSpans"] for s in ss["spans"]}
    assert set(by_name) == {"root", "child", "ok"}  # the output is the full span, not an empty fallback
    assert by_name["root"]["droppedAttributesCount"] == 1 and by_name["root"]["events"][0]["name"] == "ev"
    assert by_name["child"]["status"] == {"code": 2, "message": "boom"} and by_name["child"]["links"]
    assert by_name["child"]["parentSpanId"] == by_name["root"]["spanId"]


# -- http/json exporter against a real HTTP server ---------------------------------------------------------
@pytest.fixture
def http_receiver():
    receiver = Receiver()
    server, endpoint = start_http(receiver)
    yield receiver, endpoint
    server.shutdown()


def test_http_json_exports_reuse_one_connection(http_receiver) -> None:
    receiver, endpoint = http_receiver
    spans = _sdk_spans()
    exporter = OTLPJsonHttpExporter(endpoint, timeout_s=10)
    try:
        results = [exporter.export(spans) for _ in range(10)]
    finally:
        exporter.shutdown()
    assert results == [SpanExportResult.SUCCESS] * 10
    assert len(receiver.records) == 10 * len(spans)
    assert receiver.connections == 1


def test_http_json_honours_retry_after(http_receiver) -> None:
    receiver, endpoint = http_receiver
    receiver.answers.append((503, {"Retry-After": "1"}))
    exporter = OTLPJsonHttpExporter(endpoint, timeout_s=10)
    try:
        assert exporter.export(_sdk_spans()) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
    assert len(receiver.times) == 2 and receiver.times[1] - receiver.times[0] >= 0.95  # not the 0.25 s back-off
    assert len(receiver.records) == 3


def test_http_json_gives_up_when_retry_after_passes_the_deadline(http_receiver) -> None:
    receiver, endpoint = http_receiver
    receiver.answers.append((429, {"Retry-After": "30"}))
    exporter = OTLPJsonHttpExporter(endpoint, timeout_s=2)
    t0 = time.monotonic()
    assert exporter.export(_sdk_spans()) is SpanExportResult.FAILURE
    elapsed = time.monotonic() - t0
    exporter.shutdown()
    # failed at once: no second try, and far less than the 30 s a wait for the Retry-After would take (a bound
    # with room for a loaded machine)
    assert len(receiver.times) == 1 and elapsed < 10, (receiver.times, elapsed)


def test_http_json_shutdown_aborts_a_retry_wait(http_receiver) -> None:
    receiver, endpoint = http_receiver
    receiver.answers.append((503, {"Retry-After": "5"}))
    exporter = OTLPJsonHttpExporter(endpoint, timeout_s=30)
    results: list[SpanExportResult] = []
    worker = threading.Thread(target=lambda: results.append(exporter.export(_sdk_spans())))
    worker.start()
    assert wait_for(lambda: receiver.times, 5, 0.01)
    exporter.shutdown()
    worker.join(2)
    assert results == [SpanExportResult.FAILURE] and len(receiver.times) == 1


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_s("3") == 3.0 and retry_after_s(" 0 ") == 0.0
    assert retry_after_s("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == 10.0
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0.0  # in the past
    assert retry_after_s(None) is None and retry_after_s("soon") is None


@pytest.mark.parametrize(
    ("variable", "value", "encoding"),
    [
        (None, None, "gzip"),  # our default
        ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "none", None),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "deflate", "deflate"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip", "gzip"),
    ],
)
def test_http_json_compression_from_env(http_receiver, monkeypatch, variable, value, encoding) -> None:
    receiver, endpoint = http_receiver
    for name in ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"):
        monkeypatch.delenv(name, raising=False)
    if variable:
        monkeypatch.setenv(variable, value)
    handle = oal.configure("zip", endpoint=endpoint, protocol="http/json", set_global=False, schedule_delay_s=0.05)
    try:
        with handle.provider.get_tracer("t").start_as_current_span("compressed"):
            pass
        assert handle.force_flush(10)
    finally:
        handle.shutdown(5)
    assert [r.name for r in receiver.records] == ["compressed"]  # the receiver decoded the body
    assert receiver.headers[0].get("content-encoding") == encoding


@pytest.mark.e2e  # a subprocess
@pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl CLI makes the test certificates")
def test_http_json_tls_and_client_certificates_from_env(tmp_path, monkeypatch) -> None:
    server_cert, server_key = self_signed(tmp_path, "server", "127.0.0.1", "IP:127.0.0.1")
    client_cert, client_key = self_signed(tmp_path, "client", "trainer")
    receiver = Receiver()
    tls_server, tls_endpoint = start_http(receiver, tls=(server_cert, server_key))
    mtls_server, mtls_endpoint = start_http(receiver, tls=(server_cert, server_key), client_ca=client_cert)
    assert tls_endpoint.startswith("https://")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")  # the SDK's metric exporter: not under test here
    # requests lets this variable override a session's CA bundle: the OTLP setting must win over it
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", client_cert)
    for name in ("CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY"):
        monkeypatch.delenv(f"OTEL_EXPORTER_OTLP_TRACES_{name}", raising=False)
        monkeypatch.delenv(f"OTEL_EXPORTER_OTLP_{name}", raising=False)
    spans = _sdk_spans()

    def export(endpoint: str) -> SpanExportResult:
        exporter = OTLPJsonHttpExporter(endpoint, timeout_s=3)
        try:
            return exporter.export(spans)
        finally:
            exporter.shutdown()

    try:
        assert export(tls_endpoint) is SpanExportResult.FAILURE  # a self-signed server is not trusted
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", server_cert)
        assert export(tls_endpoint) is SpanExportResult.SUCCESS  # trusted through the OTLP variable
        assert len(receiver.records) == len(spans)
        receiver.records.clear()
        assert export(mtls_endpoint) is SpanExportResult.FAILURE  # this one wants a client certificate
        assert not receiver.records
        # mutual TLS, through configure(): the _TRACES_ variables and the generic ones mix as in the OTel exporter
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", client_cert)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_CLIENT_KEY", client_key)
        handle = oal.configure(
            "tls", endpoint=mtls_endpoint, protocol="http/json", set_global=False, schedule_delay_s=0.05
        )
        try:
            with handle.provider.get_tracer("t").start_as_current_span("over-mtls"):
                pass
            assert handle.force_flush(10)
        finally:
            handle.shutdown(5)
        assert [r.name for r in receiver.records] == ["over-mtls"]
    finally:
        tls_server.shutdown()
        mtls_server.shutdown()


def test_suppression_is_scoped_to_the_export() -> None:
    """The key is set only while an exporter runs: the caller's context is left as it was."""
    from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, get_value

    seen: list[object] = []

    class Probe(InMemorySpanExporter):
        def export(self, spans):
            seen.append(get_value(_SUPPRESS_INSTRUMENTATION_KEY))
            return super().export(spans)

    handle = oal.configure("probe", exporters=[Probe()], set_global=False, schedule_delay_s=0.05)
    try:
        with handle.provider.get_tracer("t").start_as_current_span("s"):
            pass
        assert handle.force_flush(10)
    finally:
        handle.shutdown(5)
    assert seen == [True]
    assert get_value(_SUPPRESS_INSTRUMENTATION_KEY) is None
    assert trace.get_current_span() is trace.INVALID_SPAN


_FORK_SCRIPT = """
import os, sys
from opentelemetry.sdk.trace import TracerProvider
from otel_agentloop.export._http_json import OTLPJsonHttpExporter
from opentelemetry.sdk.trace.export import SpanExportResult
span = TracerProvider().get_tracer("f").start_span("forked")
span.end()
exporter = OTLPJsonHttpExporter(sys.argv[1], timeout_s=10)
ok = [exporter.export([span]) is SpanExportResult.SUCCESS]
pid = os.fork()
if pid == 0:
    os._exit(0 if exporter.export([span]) is SpanExportResult.SUCCESS else 3)
_, status = os.waitpid(pid, 0)
ok.append(os.waitstatus_to_exitcode(status) == 0)
ok.append(exporter.export([span]) is SpanExportResult.SUCCESS)
print(ok)
"""


@pytest.mark.e2e  # a subprocess
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_http_json_forked_child_opens_its_own_connection(http_receiver) -> None:
    receiver, endpoint = http_receiver
    out = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT, endpoint], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert out.stdout.strip() == "[True, True, True]", out.stderr[-2000:]
    assert [r.name for r in receiver.records] == ["forked"] * 3
    assert receiver.connections == 2  # the parent kept its connection; the child did not write on it


def test_worker_env_carries_the_exporters_tls_and_compression_settings(monkeypatch, tmp_path) -> None:
    for name in ("ca.pem", "client.pem", "client.key"):  # files that exist: a missing one is dropped, with a warning
        (tmp_path / name).write_text("not checked here\n")
    settings = {
        "OTEL_EXPORTER_OTLP_CERTIFICATE": str(tmp_path / "ca.pem"),
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": str(tmp_path / "client.pem"),
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY": str(tmp_path / "client.key"),
        "OTEL_EXPORTER_OTLP_COMPRESSION": "deflate",
    }
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    handle = oal.configure("env", file=str(tmp_path / "t.jsonl"), set_global=False)
    try:
        assert {key: handle.worker_env.get(key) for key in settings} == settings  # Ray workers connect alike
    finally:
        handle.shutdown(5)
