"""A small real OTLP trace receiver for tests: gRPC and HTTP on 127.0.0.1, decoding the protobuf."""

from __future__ import annotations

import base64
import gzip
import json
import threading
import time
from collections.abc import Callable
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from otel_agentloop import SpanRecord


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
    """Collects decoded spans and request headers; ``fail`` makes it answer UNAVAILABLE / 503."""

    def __init__(self) -> None:
        self.records: list[SpanRecord] = []
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self.fail = False

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


def start_http(receiver: Receiver) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if receiver.fail or self.path != "/v1/traces":
                self.send_response(503 if receiver.fail else 404)
                self.end_headers()
                return
            request = trace_service_pb2.ExportTraceServiceRequest()
            if self.headers.get("Content-Type", "").startswith("application/json"):
                json_format.Parse(json.dumps(_hex_ids_to_base64(json.loads(body))), request)
            else:
                request.ParseFromString(body)
            receiver.add(request, {k.lower(): v for k, v in self.headers.items()})
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()
            self.wfile.write(trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"
