"""Jaeger's api_v3 search over gRPC, for the soak's tag queries (bench/soak_store.py).

Jaeger v2.13's api_v3 HTTP gateway drops ``query.attributes`` (its parser builds an empty map: "not supported by
grpc-gateway"); its gRPC service (``jaeger.api_v3.QueryService/FindTraces`` on the query gRPC port) honours
them. The request is a few protobuf fields, written here by hand (``TraceQueryParameters`` of Jaeger's
``api_v3/query_service.proto``: service 1, operation 2, attributes 3 (map), start_time_min 4, start_time_max 5,
search_depth 8); each answer is an OTLP ``TracesData``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

import grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Status, TracesData

FIND_TRACES = "/jaeger.api_v3.QueryService/FindTraces"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _bytes(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _timestamp(field: int, t: datetime) -> bytes:
    t = t.astimezone(timezone.utc)
    seconds = int(t.timestamp())
    return _bytes(field, _varint(1 << 3) + _varint(seconds) + _varint(2 << 3) + _varint(t.microsecond * 1000))


def find_request(
    service: str,
    start: datetime,
    end: datetime,
    attributes: Mapping[str, str] | None = None,
    operation: str | None = None,
    search_depth: int = 1000,
) -> bytes:
    """A serialized ``FindTracesRequest`` (its one field: ``query``, a ``TraceQueryParameters``)."""
    query = _bytes(1, service.encode())
    if operation:
        query += _bytes(2, operation.encode())
    for key, value in (attributes or {}).items():
        query += _bytes(3, _bytes(1, key.encode()) + _bytes(2, value.encode()))
    query += _timestamp(4, start) + _timestamp(5, end) + _varint(8 << 3) + _varint(search_depth)
    return _bytes(1, query)


@dataclass(frozen=True)
class FoundSpan:
    trace_id: str
    name: str
    duration_ns: int
    error: bool


class GrpcSearch:
    """``GrpcSearch("127.0.0.1:16685").find(...)``: every span of the traces Jaeger's FindTraces returns."""

    def __init__(self, target: str, timeout_s: float = 300.0) -> None:
        self.channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 256 << 20)])
        self.timeout_s = timeout_s
        self._find = self.channel.unary_stream(FIND_TRACES, response_deserializer=TracesData.FromString)

    def find(
        self,
        service: str,
        start: datetime,
        end: datetime,
        attributes: Mapping[str, str] | None = None,
        operation: str | None = None,
        search_depth: int = 1000,
    ) -> list[FoundSpan]:
        request = find_request(service, start, end, attributes, operation, search_depth)
        out: list[FoundSpan] = []
        try:
            for data in self._find(request, timeout=self.timeout_s):
                for rs in data.resource_spans:
                    for ss in rs.scope_spans:
                        out.extend(
                            FoundSpan(
                                s.trace_id.hex(),
                                s.name,
                                s.end_time_unix_nano - s.start_time_unix_nano,
                                s.status.code == Status.STATUS_CODE_ERROR,
                            )
                            for s in ss.spans
                        )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:  # an empty search
                return out
            raise
        return out

    def close(self) -> None:
        self.channel.close()
