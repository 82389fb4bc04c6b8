"""``report --jaeger`` against a slow or hostile server (issue 41, items 8 and 9), with real loopback servers and
the real CLI in a subprocess: ``--timeout`` bounds a whole call (a server that drips its headers or its body one
byte every half second cannot hold ``report``), and a redirect is followed only to http(s) (a redirect to
``ftp://`` would get around the URL check)."""

from __future__ import annotations

import contextlib
import http.server
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._support.otlp_lines import assert_one_line_error, run_cli

pytestmark = pytest.mark.e2e  # the CLI or Python in subprocesses

DRIP_S = 60.0
"""How long the dripping server would go on (far past any bound the test allows)."""
_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"


class _Drip(socketserver.BaseRequestHandler):
    """Reads the request, then sends ``server.drip`` one byte every half second for :data:`DRIP_S` seconds
    (``headers``: the status line, then the headers byte by byte; ``body``: all headers at once, then the body
    byte by byte)."""

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(5)
        with contextlib.suppress(OSError):
            sock.recv(65536)
            if self.server.mode == "body":  # type: ignore[attr-defined]
                sock.sendall(_HEAD)
                stream = b'{"result": {"resourceSpans": [' + b" " * 100000
            else:
                sock.sendall(b"HTTP/1.1 200 OK\r\n")
                stream = b"X-Drip: " + b"a" * 100000
            end = time.monotonic() + DRIP_S
            for byte in stream:
                if time.monotonic() > end:
                    break
                sock.sendall(bytes([byte]))
                time.sleep(0.5)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextlib.contextmanager
def _serve(server: socketserver.BaseServer) -> Iterator[str]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[index]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("mode", ["headers", "body"])
def test_timeout_bounds_a_whole_call_against_a_dripping_server(tmp_path: Path, mode: str) -> None:
    server = _Server(("127.0.0.1", 0), _Drip)
    server.mode = mode  # type: ignore[attr-defined]
    with _serve(server) as url:
        start = time.monotonic()
        proc = run_cli(["report", "--jaeger", url, "--timeout", "2"], tmp_path)
        elapsed = time.monotonic() - start
    # bounded: far below the drip's DRIP_S (which an unbounded call would wait out), with room for a loaded
    # machine's interpreter start
    assert elapsed < DRIP_S / 2, f"report took {elapsed:.1f} s against a server dripping its {mode} (--timeout 2)"
    assert_one_line_error(proc, "cannot query Jaeger", "no complete answer within 2 s")


class _Redirect(http.server.BaseHTTPRequestHandler):
    """Answers every GET with a redirect to ``server.location``."""

    def do_GET(self) -> None:
        self.send_response(302)
        self.send_header("Location", self.server.location)  # type: ignore[attr-defined]
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


def test_a_redirect_to_ftp_is_not_followed(tmp_path: Path) -> None:
    ftp = socket.socket()  # an FTP server's port: any connection to it means the redirect was followed
    ftp.bind(("127.0.0.1", 0))
    ftp.listen(8)
    ftp.settimeout(0.5)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Redirect)
    server.location = f"ftp://127.0.0.1:{ftp.getsockname()[1]}/api/v3/services"  # type: ignore[attr-defined]
    try:
        with _serve(server) as url:
            proc = run_cli(["report", "--jaeger", url, "--timeout", "2"], tmp_path)
        with contextlib.suppress(TimeoutError):
            conn, _ = ftp.accept()
            conn.close()
            pytest.fail("report followed a redirect to ftp://")
    finally:
        ftp.close()
    assert_one_line_error(proc, "cannot query Jaeger", "redirected to 'ftp://127.0.0.1", "not followed")


def test_a_redirect_to_http_is_still_followed(tmp_path: Path) -> None:
    target = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    with _serve(target) as good:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Redirect)
        server.location = good + "/elsewhere"  # type: ignore[attr-defined]
        with _serve(server) as url:
            proc = run_cli(["report", "--jaeger", url, "--timeout", "5"], tmp_path)
    assert_one_line_error(proc, "no sample spans found")  # the 404 of the redirect's target: followed


class _NotFound(http.server.BaseHTTPRequestHandler):
    """api_v3's answer to an empty search: 404."""

    def do_GET(self) -> None:
        body = b'{"error": {"code": 404, "message": "trace not found"}}'
        self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None
