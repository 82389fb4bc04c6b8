"""A small real OTLP trace receiver for tests: gRPC and HTTP on 127.0.0.1, decoding the protobuf."""

from __future__ import annotations

import base64
import gzip
import json
import ssl
import threading
import time
import zlib
from collections.abc import Callable
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from otel_agentloop.metrics import SpanRecord


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` seconds pass; its last value (for an assert)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def to_records(request: trace_service_pb2.ExportTraceServiceRequest) -> list[SpanRecord]:
    out = []
    for rs in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    SpanRecord(
                        trace_id=int.from_bytes(s.trace_id, "big"),
                        span_id=int.from_bytes(s.span_id, "big"),
                        parent_id=int.from_bytes(s.parent_span_id, "big") if s.parent_span_id else 0,
                        name=s.name,
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes={kv.key: _value(kv.value) for kv in s.attributes},
                        error=s.status.code == 2,
                        resource=resource,
                        links=tuple(
                            (int.from_bytes(link.trace_id, "big"), int.from_bytes(link.span_id, "big"))
                            for link in s.links
                        ),
                    )
                )
    return out


def _hex_ids_to_base64(obj):
    """OTLP/JSON encodes trace/span ids as hex (the spec's exception to protobuf's JSON mapping, which
    json_format follows with base64): convert them before json_format parses the request."""
    for rs in obj.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for item in (span, *span.get("links", [])):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if item.get(key):
                            item[key] = base64.b64encode(bytes.fromhex(item[key])).decode()
    return obj


def _value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    return getattr(v, kind) if kind else None


class Receiver:
    """Collects decoded spans and request headers; ``fail`` makes it answer UNAVAILABLE / 503.

    HTTP only: ``answers`` are (status, headers) answered, in order, before any request is accepted;
    ``connections`` counts TCP connections; ``times`` holds each POST's arrival (``time.monotonic()``) and
    ``paths`` its path; a POST to another path than ``path`` is answered 404."""

    def __init__(self) -> None:
        self.records: list[SpanRecord] = []
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self.fail = False
        self.answers: list[tuple[int, dict[str, str]]] = []
        self.connections = 0
        self.times: list[float] = []
        self.paths: list[str] = []
        self.path = "/v1/traces"

    def add(self, request, headers) -> None:
        with self.lock:
            self.records.extend(to_records(request))
            self.headers.append(headers)


class _Servicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def Export(self, request, context):
        if self.receiver.fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "test receiver down")
        self.receiver.add(request, dict(context.invocation_metadata()))
        return trace_service_pb2.ExportTraceServiceResponse()


def start_grpc(receiver: Receiver) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Servicer(receiver), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"http://127.0.0.1:{port}"


def start_http(
    receiver: Receiver, tls: tuple[str, str] | None = None, client_ca: str | None = None
) -> tuple[ThreadingHTTPServer, str]:
    """Serve OTLP/HTTP (protobuf or JSON, gzip/deflate) with keep-alive; over TLS with ``tls=(cert, key)``,
    requiring a client certificate signed by ``client_ca`` when given."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: a client that reuses its connection is seen doing it

        def setup(self) -> None:
            super().setup()
            with receiver.lock:
                receiver.connections += 1

        def _answer(self, status: int, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with receiver.lock:
                receiver.times.append(time.monotonic())
                receiver.paths.append(self.path)
                canned = receiver.answers.pop(0) if receiver.answers else None
            if canned is not None:
                self._answer(*canned)
                return
            encoding = self.headers.get("Content-Encoding")
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            if receiver.fail or self.path != receiver.path:
                self._answer(503 if receiver.fail else 404)
                return
            request = trace_service_pb2.ExportTraceServiceRequest()
            if self.headers.get("Content-Type", "").startswith("application/json"):
                json_format.Parse(json.dumps(_hex_ids_to_base64(json.loads(body))), request)
            else:
                request.ParseFromString(body)
            receiver.add(request, {k.lower(): v for k, v in self.headers.items()})
            response = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self._answer(200, {"Content-Type": "application/x-protobuf"}, response)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    scheme = "http"
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        if client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(client_ca)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    # polled every 50 ms: shutdown() returns within that (the default 0.5 s made each stop cost half a second)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server, f"{scheme}://127.0.0.1:{server.server_address[1]}"
