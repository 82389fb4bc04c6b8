"""OTLP/HTTP with a JSON body (``http/json``), using the cheap string encoder instead of protobuf.

Settings the exporter reads itself, as the OTel OTLP/HTTP exporter does (the ``_TRACES_`` variable first, then
the generic one; an argument wins over both):

- ``OTEL_EXPORTER_OTLP[_TRACES]_CERTIFICATE``: CA bundle that verifies the server (else the system's);
  ``_CLIENT_CERTIFICATE`` and ``_CLIENT_KEY``: the client's certificate and key for mutual TLS.
- ``OTEL_EXPORTER_OTLP[_TRACES]_COMPRESSION``: ``gzip`` (our default when unset: JSON shrinks ~10x),
  ``deflate`` or ``none``.
- ``OTEL_EXPORTER_OTLP[_TRACES]_INSECURE`` does not apply: as for the OTel HTTP exporter, the endpoint's
  scheme decides (``https://`` is TLS, ``http://`` is plain).
"""

from __future__ import annotations

import email.utils
import gzip
import os
import random
import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ..core._guard import after_fork_in_child, internal_error, warn_once
from ._otlp_json import encode_spans
from ._processor import suppressed

_RETRYABLE = frozenset({429, 502, 503, 504})
COMPRESSIONS = ("gzip", "deflate", "none")


def _env(name: str) -> str | None:
    for key in (f"OTEL_EXPORTER_OTLP_TRACES_{name}", f"OTEL_EXPORTER_OTLP_{name}"):
        value = os.environ.get(key, "").strip()
        if value:
            return value
    return None


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delay-seconds or an HTTP date); ``None`` if absent or
    unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(when.timestamp() - (time.time() if now is None else now), 0.0)


class OTLPJsonHttpExporter(SpanExporter):
    """POST ``{"resourceSpans": ...}`` to ``endpoint`` (``.../v1/traces``) over one reused HTTP session.

    Contract: :meth:`export` never raises, and starts no try and no wait past ``timeout_s`` from its start
    (each try's connect and each read get the time left; a server that trickles bytes can stretch the last
    try, which is why the export processor never waits on the network). A retryable answer (429/502/503/504)
    is retried after its ``Retry-After`` when it gives one, else after a jittered back-off (0.25 s doubling
    to 2 s); a dropped pooled connection is retried at once, other connection errors after the back-off.
    When the next try would start past the deadline, or on any other answer, the export reports FAILURE
    (counted by the export processor). :meth:`shutdown` aborts a back-off wait. The network calls run with
    instrumentation suppressed. A forked child opens its own connections.
    """

    def __init__(
        self,
        endpoint: str,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
        *,
        compression: str | None = None,
        certificate_file: str | None = None,
        client_key_file: str | None = None,
        client_certificate_file: str | None = None,
    ) -> None:
        self.endpoint = endpoint if endpoint.rstrip("/").endswith("/v1/traces") else endpoint.rstrip("/") + "/v1/traces"
        chosen = (compression or _env("COMPRESSION") or "gzip").lower()
        if chosen not in COMPRESSIONS:
            warn_once(
                "http-json-compression",
                "otel_agentloop: OTLP compression %r is not one of %s; using gzip",
                chosen,
                ", ".join(COMPRESSIONS),
            )
            chosen = "gzip"
        self.compression = chosen
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        if chosen != "none":
            self.headers["Content-Encoding"] = chosen
        self.timeout_s = timeout_s
        self.verify: bool | str = certificate_file or _env("CERTIFICATE") or True
        client_cert = client_certificate_file or _env("CLIENT_CERTIFICATE")
        client_key = client_key_file or _env("CLIENT_KEY")
        self.cert: str | tuple[str, str] | None = (
            (client_cert, client_key) if client_cert and client_key else client_cert
        )
        self._shutdown = False
        self._stop = threading.Event()
        self._session: Any = None
        self._lock = threading.Lock()
        after_fork_in_child(self, "_after_fork")

    def _after_fork(self) -> None:
        # the parent's pooled sockets are not ours to use or close: drop the session, open fresh connections
        self._session = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if self._shutdown:
            self._stop.set()

    def _get_session(self) -> Any:
        session = self._session
        if session is None:
            import requests  # first export, on the export thread: configure() does not pay for the import

            with self._lock:
                if self._session is None:
                    session = requests.Session()
                    session.headers.update(self.headers)
                    self._session = session
                session = self._session
        return session

    def _body(self, spans: Sequence[ReadableSpan]) -> bytes:
        data = encode_spans(spans).encode("utf-8")
        if self.compression == "gzip":
            return gzip.compress(data, compresslevel=1)
        if self.compression == "deflate":
            return zlib.compress(data, 1)
        return data

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            return SpanExportResult.FAILURE
        with suppressed():
            try:
                return self._export(spans)
            except Exception:
                if not self._shutdown:  # shutdown closed the session under an export in flight: not a bug
                    internal_error("OTLPJsonHttpExporter.export")
                return SpanExportResult.FAILURE

    def _export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        import requests

        deadline = time.monotonic() + self.timeout_s
        body = self._body(spans)
        session = self._get_session()
        backoff = 0.25
        reconnected = False
        while True:
            remaining = deadline - time.monotonic()
            wait: float | None = None
            try:
                # verify and cert per request: on the session alone, REQUESTS_CA_BUNDLE would override them
                response = session.post(
                    self.endpoint, data=body, timeout=max(remaining, 0.01), verify=self.verify, cert=self.cert
                )
                response.content  # noqa: B018 -- read the body: the connection goes back to the pool
                if response.ok:
                    return SpanExportResult.SUCCESS
                retry = response.status_code in _RETRYABLE
                reason = f"HTTP {response.status_code}"
                if retry:
                    wait = retry_after_s(response.headers.get("Retry-After"))
            except requests.exceptions.SSLError as exc:
                retry, reason = False, f"TLS: {exc}"
            except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
                retry, reason = True, str(exc)
                if not reconnected and isinstance(exc, requests.exceptions.ConnectionError):
                    reconnected = True  # the server closed an idle pooled connection: try a fresh one at once
                    wait = 0.0
            except requests.exceptions.RequestException as exc:
                retry, reason = False, str(exc)
            if wait is None:
                wait = backoff * random.uniform(0.8, 1.2)
                backoff = min(backoff * 2, 2.0)
            if not retry or self._shutdown or time.monotonic() + wait >= deadline:
                warn_once(
                    "http-json-export",
                    "otel_agentloop: OTLP http/json export to %s failed (%s); spans are "
                    "counted as failed, see handle.stats",
                    self.endpoint,
                    reason,
                )
                return SpanExportResult.FAILURE
            if wait > 0 and self._stop.wait(wait):
                return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self._shutdown = True
        self._stop.set()
        session, self._session = self._session, None
        if session is not None:
            try:
                session.close()
            except Exception:
                internal_error("OTLPJsonHttpExporter.shutdown")

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
