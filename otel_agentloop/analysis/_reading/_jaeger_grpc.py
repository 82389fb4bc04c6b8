"""Jaeger's ``api_v3`` search over gRPC: the one way Jaeger 2.13 filters a search by span attributes.

Jaeger v2.13's HTTP api_v3 gateway drops ``query.attributes`` (its parser builds an empty map), so over HTTP a
search for ``rl.step=3`` returns every trace of the window; its gRPC service
(``jaeger.api_v3.QueryService/FindTraces`` on the query gRPC port, 16685 beside the HTTP 16686 by default) honours
them. The request is a few protobuf fields, written by hand (``TraceQueryParameters`` of Jaeger's
``api_v3/query_service.proto``: service 1, operation 2, attributes 3 (a map), start_time_min 4, start_time_max 5,
search_depth 8); the answer is a stream of OTLP ``TracesData``, whose spans are read straight into records
(:mod:`._decode_pb`, by the rules :func:`~._decode.decode_resource_spans` reads OTLP-JSON with) inside the
OTLP-JSON shape that the searches and :func:`~._decode.decode_resource_spans` read (hex ids); a span those rules
reject is handed on in its OTLP-JSON form (:func:`_span`), so that both transports check spans alike.

``grpc`` and ``opentelemetry.proto`` come with ``opentelemetry-exporter-otlp``; both are imported on first use.
"""

from __future__ import annotations

import base64
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from ._decode import MAX_VALUE_DEPTH
from ._decode_pb import Resources, resource_spans
from ._gc import gc_paused
from ._http import JaegerError, JaegerUnreachableError
from ._jaeger import ResourceSpans, TraceQuery, utc
from ._json import JsonObject, JsonValue

if TYPE_CHECKING:  # imported where an answer is read
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

FIND_TRACES = "/jaeger.api_v3.QueryService/FindTraces"
GET_SERVICES = "/jaeger.api_v3.QueryService/GetServices"
PROBE_TIMEOUT_S = 2.0
"""How long the probe of the gRPC port (:meth:`GrpcQuery.reachable`) waits."""
MAX_MESSAGE = 256 << 20
"""The largest answer message read (one trace, as Jaeger streams them)."""

Progress = Callable[[int], None]
"""Called with the traces read so far, as the answer streams in."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _timestamp(number: int, t: datetime) -> bytes:
    t = utc(t)
    seconds = max(int(t.timestamp()), 0)
    return _field(number, _varint(1 << 3) + _varint(seconds) + _varint(2 << 3) + _varint(t.microsecond * 1000))


def find_request(query: TraceQuery) -> bytes:
    """A serialized ``FindTracesRequest`` (its one field: ``query``, a ``TraceQueryParameters``)."""
    q = query
    out = _field(1, q.service.encode())
    if q.operation:
        out += _field(2, q.operation.encode())
    for key, value in (q.attributes or {}).items():
        out += _field(3, _field(1, key.encode()) + _field(2, value.encode()))
    out += _timestamp(4, q.start) + _timestamp(5, q.end) + _varint(8 << 3) + _varint(max(q.search_depth, 0))
    return _field(1, out)


def grpc_target(base_url: str) -> str | None:
    """The query gRPC address beside the HTTP query URL ``base_url``: its host, the port below its own (Jaeger's
    16686/16685, as ``make up`` and Jaeger's defaults pair them); ``None`` when the URL names no port (a proxy)."""
    parts = urllib.parse.urlsplit(base_url)
    try:
        port = parts.port
    except ValueError:
        return None
    if parts.scheme != "http" or not parts.hostname or port is None or port <= 1:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port - 1}"


@dataclass
class Started:
    """A ``FindTraces`` call under way (:meth:`GrpcQuery.start`): its answer streams in as it is read."""

    call: Iterable[bytes]
    """The gRPC call: its answer's messages, as they come (or :class:`_Failed`)."""
    timeout_s: float

    def drain(self) -> None:
        """Read the answer to its end and drop it (never cut it: Jaeger 2.13 to 2.15 crash when a client stops
        reading; see ``_jaeger_step.StepReader.close``); a failed call is dropped as it is."""
        try:
            for _ in self.call:
                pass
        except Exception:  # whatever the call failed with, nothing waits for its answer
            return


class _Failed:
    """A call that failed as it was made: reading it raises the failure, as reading a call's answer would."""

    def __init__(self, exc: BaseException) -> None:
        self._exc = exc

    def __iter__(self) -> Iterator[bytes]:
        raise self._exc


class GrpcQuery:
    """``GrpcQuery("127.0.0.1:16685", timeout_s=10)``: :meth:`find_traces` as ``JaegerClient.find_traces`` answers
    (OTLP-JSON ``resourceSpans``), with ``attributes`` honoured. Each call is bounded as ``JaegerClient``'s are."""

    def __init__(self, target: str, timeout_s: float = 10.0) -> None:
        import grpc  # type: ignore[import-untyped]  # with opentelemetry-exporter-otlp; a report from Jaeger only

        self.target, self.timeout_s = target, timeout_s
        self._grpc = grpc
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            # grpc.experimental.ChannelOptions.SingleThreadedUnaryStream: an answer's messages are read in the
            # calling thread, without a hand-off per message (a step's 8,192 traces: 0.3 s of CPU less)
            ("SingleThreadedUnaryStream", 1),
        ]
        self._channel = grpc.insecure_channel(target, options=options)
        self._find = self._channel.unary_stream(FIND_TRACES)
        self._services = self._channel.unary_unary(GET_SERVICES)

    def services(self) -> list[str] | None:
        """The services the Jaeger at the target lists (one ``GetServices`` call), ``None`` when none answers
        there (refused, another gRPC service, not gRPC, or an answer that does not parse)."""
        try:
            answer = self._services(b"", timeout=PROBE_TIMEOUT_S)
        except self._grpc.RpcError:
            return None
        return _strings(answer)

    def find_traces(self, query: TraceQuery, progress: Progress | None = None) -> ResourceSpans:
        """The ``resourceSpans`` of the traces of the query's service in its window whose spans match its
        ``attributes`` (and ``operation``), at most ``search_depth``; ``[]`` for none. Raises :class:`JaegerError`."""
        return self.collect(self.start(query), progress)

    def start(self, query: TraceQuery) -> Started:
        """:meth:`find_traces`'s search, sent now: Jaeger searches and reads the traces while the caller does
        other things; :meth:`collect` reads the answer (or :meth:`Started.drain` drops it). Its deadline runs
        from now."""
        request = find_request(query)
        timeout_s = query.timeout_s(self.timeout_s)
        try:
            call = self._find(request, timeout=timeout_s)
        except self._grpc.RpcError as exc:
            call = _Failed(exc)
        return Started(call, timeout_s)

    def collect(self, started: Started, progress: Progress | None = None) -> ResourceSpans:
        """The answer of a :meth:`start`ed search, as :meth:`find_traces` returns it. Raises
        :class:`JaegerError`. Interrupted (Ctrl-C), it reads the rest of the answer before it stops (under a second
        for a step of 8,192 traces), as :meth:`Started.drain` does."""
        out: ResourceSpans = []
        try:
            with gc_paused():  # tens of thousands of records, no cycles
                self._stream(started.call, progress, out)
        except KeyboardInterrupt:  # the answer is read to its end first (a second Ctrl-C cuts it): see drain()
            started.drain()
            raise
        except self._grpc.RpcError as exc:
            code = exc.code()
            if code == self._grpc.StatusCode.NOT_FOUND:  # an empty search
                return out
            if code == self._grpc.StatusCode.UNAVAILABLE:
                raise JaegerUnreachableError(f"{self.target} (gRPC): {exc.details()}") from None
            if code == self._grpc.StatusCode.DEADLINE_EXCEEDED:
                timeout_s = started.timeout_s
                raise JaegerError(f"gRPC FindTraces at {self.target}: no answer within {timeout_s:g} s") from None
            raise JaegerError(f"gRPC FindTraces at {self.target}: {code.name}: {exc.details()}") from None
        except ValueError as exc:  # a message that is not TracesData
            raise JaegerError(f"gRPC FindTraces at {self.target}: the answer is not OTLP: {exc}") from None
        return out

    def _stream(self, call: Iterable[bytes], progress: Progress | None, out: ResourceSpans) -> None:
        """The answer's ``resourceSpans``, appended to ``out`` as they come."""
        from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

        resources = Resources()
        for traces, message in enumerate(call, 1):
            data = TracesData.FromString(message)
            out += [resource_spans(rs, _span, _attributes, resources) for rs in data.resource_spans]
            if progress is not None:  # Jaeger sends a trace (or a chunk of one) per message
                progress(traces)

    def close(self) -> None:
        self._channel.close()


def _strings(message: bytes) -> list[str] | None:
    """Field 1 of ``message`` as repeated strings (``GetServicesResponse.services``); ``None`` when it is not
    such a message."""
    out: list[str] = []
    i = 0
    try:
        while i < len(message):
            key, i = _read_varint(message, i)
            if key & 7 != 2:
                return None
            size, i = _read_varint(message, i)
            if i + size > len(message):
                return None
            if key >> 3 == 1:
                out.append(message[i : i + size].decode())
            i += size
    except (IndexError, UnicodeDecodeError):
        return None
    return out


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if not byte & 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


def _value(v: AnyValue, depth: int) -> JsonObject:
    """One ``AnyValue`` in OTLP-JSON; past :data:`MAX_VALUE_DEPTH` an empty one (the decoder reads it as too deep
    before it looks inside)."""
    if depth > MAX_VALUE_DEPTH + 1:
        return {}
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return {"stringValue": v.string_value}
    if kind == "int_value":
        return {"intValue": v.int_value}
    if kind == "double_value":
        return {"doubleValue": v.double_value}
    if kind == "bool_value":
        return {"boolValue": v.bool_value}
    if kind == "array_value":
        values: list[JsonValue] = [_value(x, depth + 1) for x in v.array_value.values]
        return {"arrayValue": {"values": values}}
    if kind == "kvlist_value":
        return {"kvlistValue": {"values": _attributes(v.kvlist_value.values, depth + 1)}}
    if kind == "bytes_value":
        return {"bytesValue": base64.b64encode(v.bytes_value).decode()}
    return {}


def _attributes(kvs: Iterable[KeyValue], depth: int = 0) -> list[JsonValue]:
    return [{"key": kv.key, "value": _value(kv.value, depth)} for kv in kvs]


def _hex(raw: bytes) -> str:
    return raw.hex()


def _span(s: Span) -> JsonObject:
    return {
        "traceId": _hex(s.trace_id),
        "spanId": _hex(s.span_id),
        "parentSpanId": _hex(s.parent_span_id),
        "name": s.name,
        "kind": s.kind,
        "startTimeUnixNano": s.start_time_unix_nano,
        "endTimeUnixNano": s.end_time_unix_nano,
        "attributes": _attributes(s.attributes),
        "status": {"code": s.status.code, "message": s.status.message},
        "events": [
            {"name": e.name, "timeUnixNano": e.time_unix_nano, "attributes": _attributes(e.attributes)}
            for e in s.events
        ],
        "links": [{"traceId": _hex(link.trace_id), "spanId": _hex(link.span_id)} for link in s.links],
    }
