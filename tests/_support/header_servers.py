"""Real OTLP receivers on 127.0.0.1 for the header tests: traces (gRPC or HTTP, ``otlp_receiver``) and metrics,
each keeping the headers of every request."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc

from tests._support.otlp_receiver import Receiver, start_grpc, start_http


def serve(protocol: str, receiver: Receiver) -> tuple[str, Callable[[], object]]:
    """Serve ``receiver`` over gRPC or HTTP on 127.0.0.1; returns the endpoint and how to stop it."""
    if protocol == "grpc":
        server, endpoint = start_grpc(receiver)
        return endpoint, functools.partial(server.stop, 0)
    http_server, endpoint = start_http(receiver)
    return endpoint, http_server.shutdown


# -- a metrics receiver (for the library's metrics: the SDK's OTLP metric exporter) -----------------------------
class _MetricsServicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, headers: list[dict[str, object]]) -> None:
        self.headers = headers

    def Export(self, request, context):
        self.headers.append(dict(context.invocation_metadata()))
        return metrics_service_pb2.ExportMetricsServiceResponse()


def serve_metrics(protocol: str, headers: list[dict[str, object]]) -> tuple[str, Callable[[], object]]:
    """A real OTLP metrics receiver on 127.0.0.1 that records each request's headers."""
    if protocol == "grpc":
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_MetricsServicer(headers), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        return f"http://127.0.0.1:{port}", functools.partial(server.stop, 0)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/v1/metrics":
                headers.append({k.lower(): v for k, v in self.headers.items()})
            body = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
            self.send_response(200 if self.path == "/v1/metrics" else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    http_server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    http_server.daemon_threads = True
    threading.Thread(target=http_server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{http_server.server_address[1]}/v1/metrics", http_server.shutdown
