"""Paging past the search depth against the real Jaeger (api_v3): :meth:`JaegerClient.find_all_traces` walks back
from a full page's oldest trace (Badger returns the newest traces first) and fetches every trace with fewer
searches than splitting each full window in halves."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import JaegerClient
from otel_agentloop.analysis._reading import _jaeger

TRACES = 240
DEPTH = 20


def _halves(page: object, lo: datetime, hi: datetime) -> list[tuple[datetime, datetime]]:
    mid = lo + (hi - lo) / 2
    return [(mid, hi), (lo, mid)]


def test_a_store_past_the_search_depth_is_read_whole_walking_back_from_each_full_page(
    stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = f"paging-{uuid.uuid4().hex[:6]}"
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=stack.otlp_grpc_endpoint, insecure=True)))
    tracer = provider.get_tracer("paging")
    t0 = time.time_ns() - 60 * 10**9
    for i in range(TRACES):  # one trace each, 10 ms apart, in bursts of 40 a second apart (like steps)
        start = t0 + (i // 40) * 10**9 + (i % 40) * 10**7
        tracer.start_span(sc.SAMPLE_SPAN, attributes={sc.RL_SAMPLE_INDEX: i}, start_time=start).end(start + 10**6)
    provider.shutdown()
    client = JaegerClient(stack.jaeger_url)
    end = datetime.now(timezone.utc) + timedelta(days=1)
    client.wait_for(
        lambda: client.find_all_traces(service, _jaeger._UNIX, end, search_depth=500).resource_spans,
        lambda rs: sum(len(ss["spans"]) for r in rs for ss in r["scopeSpans"]) >= TRACES,
        60,
    )
    found = client.find_all_traces(service, _jaeger._UNIX, end, search_depth=DEPTH)
    assert found.traces == TRACES and not found.full
    monkeypatch.setattr(_jaeger, "_split", _halves)
    halved = client.find_all_traces(service, _jaeger._UNIX, end, search_depth=DEPTH)
    assert halved.traces == TRACES and not halved.full
    # from the epoch, halves take ~2 searches per halving to reach the data, then refetch every full level
    assert found.searches < halved.searches, (found.searches, halved.searches)
