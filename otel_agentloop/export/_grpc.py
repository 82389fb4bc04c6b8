"""OTLP over gRPC, encoded by our own encoder (:mod:`._otlp_proto`): the bytes go out through a plain
``unary_unary`` call to ``TraceService/Export``, no protobuf objects are built.

It honours what the SDK's gRPC span exporter honours, each read off its resolved target
(``config._otlp.OtlpTarget``, where the rules are written): the endpoint (``grpc_address``; ``https://`` is
TLS, ``http://`` is plain; without a scheme, TLS unless ``OTEL_EXPORTER_OTLP[_TRACES]_INSECURE`` says
``true``), the headers (``grpc_metadata``: names lowercased, an item gRPC cannot carry skipped with a warning),
the timeout, the compression, the TLS files (``grpc_tls_files``: ``OTEL_EXPORTER_OTLP[_TRACES]_CERTIFICATE``,
``_CLIENT_KEY``, ``_CLIENT_CERTIFICATE``); and the retryable status codes
(``OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES``, :func:`retryable_codes`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from opentelemetry.sdk.trace.export import SpanExportResult

from ..config._environment import variable
from ..config._headers import GrpcMetadata
from ..config._otlp import OtlpTarget
from ..core._guard import internal_error, warn_once
from ..core._record import FastSpan
from ._otlp_proto import encode_request, warn_rejected
from ._sending import SendingExporter

EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
RETRYABLE = (
    "CANCELLED",
    "DEADLINE_EXCEEDED",
    "RESOURCE_EXHAUSTED",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNAVAILABLE",
    "DATA_LOSS",
)
"""The status codes retried (the SDK's list), unless ``OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES``
names others."""
MAX_TRIES = 6

if TYPE_CHECKING:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse


class _Call(Protocol):
    """A gRPC channel's ``unary_unary`` callable for ``TraceService/Export`` (grpc is untyped)."""

    def __call__(self, request: bytes, *, metadata: GrpcMetadata, timeout: float) -> ExportTraceServiceResponse: ...


class _Channel(Protocol):
    """A gRPC channel, once its call is made: closed on reconnect and shutdown."""

    def close(self) -> None: ...


class _Metadatum(Protocol):
    """One item of a call's metadata (a ``(key, value)`` namedtuple)."""

    @property
    def key(self) -> str: ...

    @property
    def value(self) -> bytes: ...


class _RpcError(Protocol):
    """A failed call's ``grpc.RpcError`` (a ``grpc.Call`` too), as read here."""

    def trailing_metadata(self) -> Iterable[_Metadatum] | None: ...


def retryable_codes() -> tuple[str, ...]:
    """The status codes retried: those ``OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES`` names (upper
    case), else :data:`RETRYABLE`."""
    codes = variable("OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES")
    return tuple(c.strip().upper() for c in codes.split(",") if c.strip()) if codes else RETRYABLE


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        warn_once(f"grpc-tls-file:{path}", "otel_agentloop: cannot read the OTLP TLS file %s: %s", path, exc)
        return None


class OTLPGrpcExporter(SendingExporter):
    """Export spans to the resolved ``target`` with one gRPC ``Export`` call per batch (see the module docstring).

    Contract: :meth:`export_records` never raises and starts no try and no wait past ``timeout_s`` from its
    start. A retryable status is retried after the receiver's ``RetryInfo`` delay when it gives one, else after
    an exponential back-off (1 s, 2 s, 4 s..., jittered), at most ``MAX_TRIES`` tries; the first UNAVAILABLE
    opens a fresh channel. Any other status, or a wait past the deadline, reports FAILURE (counted by the
    export processor). The first failed try is warned at once, once (:meth:`SendingExporter._failed`). A
    receiver's partial success is warned once. :meth:`shutdown` closes the channel (an export in flight
    ends) and aborts a back-off wait. The channel is opened on the first export;
    a forked child opens its own. Spans that cannot be encoded are left out and counted in
    ``spans_unencodable``.
    """

    protocol = "grpc"

    def __init__(self, target: OtlpTarget) -> None:
        super().__init__(target)
        self.address = target.grpc_address
        self.tls = target.grpc_tls_files
        self.metadata = target.grpc_metadata
        self.compression = target.grpc_compression
        self.retryable = retryable_codes()

    def _forget_connection(self) -> None:
        self._channel: _Channel | None = None
        self._call: _Call | None = None

    def _connect(self) -> _Call:
        import grpc  # type: ignore[import-untyped]
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        with self._lock:
            if self._call is not None:
                return self._call
            tls = self.tls
            if tls is None:
                channel = grpc.insecure_channel(self.address, compression=self.compression)
            else:
                root, key, chain = (_read(path) for path in tls)
                credentials = grpc.ssl_channel_credentials(
                    root_certificates=root, private_key=key, certificate_chain=chain
                )
                channel = grpc.secure_channel(self.address, credentials, compression=self.compression)
            self._channel = channel
            call: _Call = channel.unary_unary(
                EXPORT_METHOD,
                request_serializer=None,  # the request is already bytes
                response_deserializer=ExportTraceServiceResponse.FromString,
            )
            self._call = call
            return call

    def _close(self) -> None:
        with self._lock:
            channel, self._channel, self._call = self._channel, None, None
        if channel is not None:
            try:
                channel.close()
            except Exception:
                internal_error("OTLPGrpcExporter.close")

    def _export(self, spans: Sequence[FastSpan]) -> SpanExportResult:
        import grpc

        deadline = time.monotonic() + self.timeout_s
        body = self.encoded(spans, encode_request)
        if body is None:
            return SpanExportResult.SUCCESS  # nothing left to send (counted as unencodable)
        for attempt in range(MAX_TRIES):
            if self._shutdown:
                return SpanExportResult.FAILURE
            call = self._connect()
            try:
                answer = call(body, metadata=self.metadata, timeout=max(deadline - time.monotonic(), 0.001))
            except grpc.RpcError as error:
                code = error.code()
                name = getattr(code, "name", str(code))
                wait = _retry_delay(error)
                if wait is None:
                    wait = 2.0**attempt * random.uniform(0.8, 1.2)
                if code == grpc.StatusCode.UNAVAILABLE and attempt == 0:
                    self._close()  # as the SDK does: a fresh channel (the next try's) reconnects at once
                self._failed(f"{name}: {error.details()}")  # warned once, at the first failed try
                if (
                    name not in self.retryable
                    or attempt + 1 == MAX_TRIES
                    or self._shutdown
                    or time.monotonic() + wait >= deadline
                ):
                    return SpanExportResult.FAILURE
                if self._stop.wait(wait):
                    return SpanExportResult.FAILURE
                continue
            self._succeeded()
            if answer.HasField("partial_success"):
                warn_rejected(answer.SerializeToString(), self.address)
            return SpanExportResult.SUCCESS
        return SpanExportResult.FAILURE

    @property
    def destination(self) -> str:
        return self.address


def _retry_delay(error: _RpcError) -> float | None:
    """The receiver's ``RetryInfo`` delay in seconds (``google.rpc.retryinfo-bin`` trailer), if it sent one."""
    try:
        trailers = error.trailing_metadata() or ()
        raw = next((item.value for item in trailers if item.key == "google.rpc.retryinfo-bin"), None)
        if raw is None:
            return None
        from google.rpc.error_details_pb2 import RetryInfo  # type: ignore[import-untyped]

        info = RetryInfo.FromString(raw)
        return float(info.retry_delay.seconds + info.retry_delay.nanos / 1e9)
    except Exception:
        return None
