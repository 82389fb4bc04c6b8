"""Jaeger's api_v3 search over gRPC, for the soak's tag queries (bench/soak_store.py).

Jaeger v2.13's api_v3 HTTP gateway drops ``query.attributes`` (its parser builds an empty map: "not supported by
grpc-gateway"); its gRPC service (``jaeger.api_v3.QueryService/FindTraces`` on the query gRPC port) honours
them. The request is a few protobuf fields, written here by hand (``TraceQueryParameters`` of Jaeger's
``api_v3/query_service.proto``: service 1, operation 2, attributes 3 (map), start_time_min 4, start_time_max 5,
search_depth 8: ``find_request``, the report's own, in ``analysis/_reading/_jaeger_grpc.py``); each answer is an
OTLP ``TracesData``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

import grpc
from opentelemetry.proto.trace.v1.trace_pb2 import Status, TracesData

from otel_agentloop.analysis._reading._jaeger import TraceQuery
from otel_agentloop.analysis._reading._jaeger_grpc import FIND_TRACES, find_request


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
        request = find_request(TraceQuery(service, start, end, attributes, operation, search_depth))
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
