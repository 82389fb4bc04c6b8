"""OTLP/HTTP with a protobuf body (``http/protobuf``), encoded by our own encoder (:mod:`._otlp_proto`).

The transport is the http/json exporter's (:class:`~otel_agentloop.export._http_json.OTLPJsonHttpExporter`:
one reused session, no redirects followed, bounded answers, retries of 429/502/503/504 and dropped
connections with back-off within the timeout, TLS from ``OTEL_EXPORTER_OTLP[_TRACES]_CERTIFICATE``,
``_CLIENT_CERTIFICATE``, ``_CLIENT_KEY``); the body is ``application/x-protobuf``, uncompressed unless
``OTEL_EXPORTER_OTLP[_TRACES]_COMPRESSION`` (or the argument) says ``gzip`` or ``deflate``, as for the SDK's
exporter. A receiver's partial success is warned once. Endpoint and headers come from the environment as the
SDK's exporter reads them (:func:`http_target`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..config._otlp import OtlpTarget, resolve_otlp
from ..core._record import FastSpan
from ._http_json import OTLPJsonHttpExporter
from ._otlp_proto import encode_request, warn_rejected


def http_target(endpoint: str | None, headers: Mapping[str, object] | None) -> tuple[str, dict[str, object]]:
    """The URL and headers, as the SDK's OTLP/HTTP exporter resolves them: an ``endpoint`` argument gets
    ``/v1/traces`` appended when it lacks it; else ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` as it is, else
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` + ``/v1/traces``. The headers of ``OTEL_EXPORTER_OTLP_TRACES_HEADERS`` (else
    ``OTEL_EXPORTER_OTLP_HEADERS``), names lowercased, updated with ``headers``; unchecked (the exporter checks)."""
    return target_of(resolve_otlp("TRACES", endpoint, headers))


def target_of(otlp: OtlpTarget) -> tuple[str, dict[str, object]]:
    """The URL and headers of the resolved ``otlp`` (``config._otlp``), as :func:`http_target` says."""
    return otlp.url, otlp.all_headers  # the exporter skips, with a warning, an item HTTP cannot carry


class OTLPProtoHttpExporter(OTLPJsonHttpExporter):
    """POST ``ExportTraceServiceRequest`` bytes to ``endpoint`` (used as given: see :func:`http_target`).
    The contract is :class:`~otel_agentloop.export._http_json.OTLPJsonHttpExporter`'s."""

    protocol = "http/protobuf"
    content_type = "application/x-protobuf"
    default_compression = "none"

    def __init__(self, endpoint: str, headers: Mapping[str, object] | None = None, timeout_s: float = 10.0, **kw: Any):
        super().__init__(endpoint, headers, timeout_s, **kw)
        self.endpoint = endpoint  # as given (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is used as it is)

    def _encode(self, spans: Sequence[FastSpan]) -> tuple[bytes, int]:
        return encode_request(spans)

    def _answered(self, response: Any, body: bytes) -> None:
        headers = response.headers
        if not body or headers.get("Content-Encoding") or "protobuf" not in headers.get("Content-Type", ""):
            return  # empty, compressed or not protobuf: no partial success is read out of it
        warn_rejected(body, self.endpoint)
