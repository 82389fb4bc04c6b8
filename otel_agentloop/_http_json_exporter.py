"""OTLP/HTTP with a JSON body (``http/json``), using the cheap string encoder instead of protobuf."""

from __future__ import annotations

import gzip
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ._guard import warn_once
from ._otlp_json import encode_spans

_RETRYABLE = {429, 502, 503, 504}


class OTLPJsonHttpExporter(SpanExporter):
    """POST ``{"resourceSpans": ...}`` to ``endpoint`` (``.../v1/traces``), gzip-compressed.

    Retries a retryable answer (429/502/503/504, connection refused) with back-off within ``timeout_s`` per
    export; then reports FAILURE (counted by the export processor). Never raises.
    """

    def __init__(self, endpoint: str, headers: Mapping[str, str] | None = None, timeout_s: float = 10.0) -> None:
        self.endpoint = endpoint if endpoint.rstrip("/").endswith("/v1/traces") else endpoint.rstrip("/") + "/v1/traces"
        self.headers = {"Content-Type": "application/json", "Content-Encoding": "gzip", **(headers or {})}
        self.timeout_s = timeout_s
        self._shutdown = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            return SpanExportResult.FAILURE
        body = gzip.compress(encode_spans(spans).encode("utf-8"), compresslevel=1)
        deadline = time.monotonic() + self.timeout_s
        delay = 0.25
        while True:
            remaining = deadline - time.monotonic()
            try:
                request = urllib.request.Request(self.endpoint, data=body, headers=self.headers, method="POST")
                with urllib.request.urlopen(request, timeout=max(remaining, 0.01)) as response:
                    response.read()
                return SpanExportResult.SUCCESS
            except urllib.error.HTTPError as exc:
                retry = exc.code in _RETRYABLE
                reason = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                retry = True
                reason = str(getattr(exc, "reason", exc))
            if not retry or self._shutdown or time.monotonic() + delay > deadline:
                warn_once(
                    "http-json-export",
                    "otel_agentloop: OTLP http/json export to %s failed (%s); spans are "
                    "counted as failed, see handle.stats",
                    self.endpoint,
                    reason,
                )
                return SpanExportResult.FAILURE
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    def shutdown(self) -> None:
        self._shutdown = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
