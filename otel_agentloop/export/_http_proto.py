"""OTLP/HTTP with a protobuf body (``http/protobuf``), encoded by our own encoder (:mod:`._otlp_proto`).

The transport and its constructor are the http/json exporter's
(:class:`~otel_agentloop.export._http_json.OTLPJsonHttpExporter`: built from the resolved target; one reused
session, no redirects followed, bounded answers, retries of 429/502/503/504 and dropped connections with
back-off within the timeout, TLS from ``OTEL_EXPORTER_OTLP[_TRACES]_CERTIFICATE``, ``_CLIENT_CERTIFICATE``,
``_CLIENT_KEY``); the body is ``application/x-protobuf``, uncompressed unless
``OTEL_EXPORTER_OTLP[_TRACES]_COMPRESSION`` (or the argument) says ``gzip`` or ``deflate``, as for the SDK's
exporter (``config._otlp.DEFAULT_COMPRESSION``). A receiver's partial success is warned once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..core._record import FastSpan
from ._http_json import OTLPJsonHttpExporter
from ._otlp_proto import encode_request, warn_rejected

if TYPE_CHECKING:
    from requests import Response


class OTLPProtoHttpExporter(OTLPJsonHttpExporter):
    """POST ``ExportTraceServiceRequest`` bytes to the target's URL. The contract is
    :class:`~otel_agentloop.export._http_json.OTLPJsonHttpExporter`'s."""

    protocol = "http/protobuf"
    content_type = "application/x-protobuf"

    def _encode(self, spans: Sequence[FastSpan]) -> tuple[bytes, int]:
        return encode_request(spans)

    def _answered(self, response: Response, body: bytes) -> None:
        headers = response.headers
        if not body or headers.get("Content-Encoding") or "protobuf" not in headers.get("Content-Type", ""):
            return  # empty, compressed or not protobuf: no partial success is read out of it
        warn_rejected(body, self.endpoint)
