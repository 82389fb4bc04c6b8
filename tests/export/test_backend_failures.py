"""Backend failures with a real OTLP receiver on 127.0.0.1: down, restarted, hanging. Never block, count all."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import otel_agentloop as oal
from tests._support.otlp_receiver import Receiver, start_grpc, wait_for


def _spans(n: int, step: int) -> None:
    for i in range(n):
        with oal.sample(i, step=step):
            pass


def test_export_resumes_after_the_receiver_restarts() -> None:
    receiver = Receiver()
    server, endpoint = start_grpc(receiver)
    port = int(endpoint.rsplit(":", 1)[1])
    handle = oal.configure(
        "restart",
        endpoint=endpoint,
        protocol="grpc",
        set_global=False,
        schedule_delay_s=0.05,
        export_timeout_s=2,
        max_queue_size=100,
    )
    try:
        _spans(20, 1)
        assert handle.force_flush(5) and wait_for(lambda: len(receiver.records) == 20, 5, 0.05)
        server.stop(0).wait(5)  # down
        t0 = time.perf_counter()
        _spans(300, 2)  # more than the queue holds: drops are counted, the caller is not slowed
        caller_s = time.perf_counter() - t0
        assert not handle.force_flush(0.3)
        down_stats = handle.stats
        assert down_stats["dropped"] > 0
        assert caller_s < 5
        # up again on the same port: export resumes
        receiver2 = Receiver()
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        from tests._support.otlp_receiver import _Servicer

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_Servicer(receiver2), server)
        assert server.add_insecure_port(f"127.0.0.1:{port}") == port
        server.start()
        # the queue drains (exported now, or failed while the channel reconnects), then new spans flow
        assert wait_for(lambda: handle.stats["pending"] == 0, 30, 0.05)
        _spans(10, 3)
        assert wait_for(lambda: any(r.attributes.get("rl.step") == 3 for r in receiver2.records), 30, 0.05)
        stats = handle.stats
        assert stats["exported"] > down_stats["exported"]
        assert stats["queued"] == stats["exported"] + stats["failed"] + stats["pending"]
    finally:
        handle.shutdown(2)
        server.stop(0)


class _Hang(BaseHTTPRequestHandler):
    release = threading.Event()

    def do_POST(self) -> None:
        self.release.wait(60)
        self.send_response(503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


@pytest.mark.e2e  # a subprocess
def test_a_hanging_endpoint_never_holds_flush_shutdown_or_exit() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hang)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        handle = oal.configure(
            "hang",
            endpoint=endpoint,
            protocol="http/json",
            set_global=False,
            schedule_delay_s=0.05,
            export_timeout_s=30,
        )
        _spans(50, 1)
        t0 = time.perf_counter()
        assert not handle.force_flush(0.5)
        flush_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        handle.shutdown(1.0)
        shutdown_s = time.perf_counter() - t0
        # bounded by their own timeouts (0.5 s, 1 s), with room for a loaded machine: far below the 30 s export
        assert flush_s < 10 and shutdown_s < 10, (flush_s, shutdown_s)

        # a process that exits without calling shutdown: the SDK's exit hook must not wait 30 s
        code = textwrap.dedent(f"""
            import otel_agentloop as oal
            h = oal.configure("exit", endpoint="{endpoint}", protocol="http/json", schedule_delay_s=0.05,
                              export_timeout_s=30)
            for i in range(20):
                with oal.sample(i, step=1):
                    pass
            import time; time.sleep(0.3)
        """)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], timeout=60, check=True)
        assert time.perf_counter() - t0 < 25  # well under the 30 s export timeout, with room for a loaded start
    finally:
        _Hang.release.set()
        server.shutdown()
