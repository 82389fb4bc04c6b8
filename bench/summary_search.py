"""Issue 29: a run's step summaries read from Jaeger on a 3-node OpenSearch, in pages of 500 vs one search.

``report --step N`` from Jaeger reads the step's ``rl.step.summary`` (one small trace a step), found by a search
by operation name over the store's whole window; the run page reads all of them. Jaeger's OpenSearch reader
fetches every trace of a page with a search of its own, and a full page is split and searched again
(``JaegerClient.find_all_traces``), so the page size decides the cost. This writes ``--steps`` steps over OTLP
(explicit times 5 s apart, two hours ago: per step ``--samples`` sample traces of 5 spans and one summary span
with a 2.5 KB attribute), waits until Jaeger returns every summary, then times ``JaegerSource.search(operation=
rl.step.summary)`` with :data:`STEP_SEARCH_DEPTH` 500 (pages of ``--search-depth``'s default, as before) and
10,000 (the one-search depth), alternating, ``--rounds`` times.

    .venv/bin/python bench/summary_search.py [--steps 1001] [--samples 40] [--rounds 3] [--out /tmp/summary-search]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import soak_store  # bench/ is on the path when run as a script
from machine import machine
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from otel_agentloop import semconv as sc
from otel_agentloop.analysis._reading import _source
from otel_agentloop.analysis._reading._jaeger import JaegerClient
from otel_agentloop.analysis._reading._source import EPOCH, JaegerSource

SERVICE = "summary-search"


def write(endpoint: str, steps: int, samples: int) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
    exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True)
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=100_000, max_export_batch_size=2000))
    tracer = provider.get_tracer(SERVICE)
    t0 = time.time_ns() - 2 * 3600 * 10**9
    body = json.dumps({"pad": "x" * 2500})
    for step in range(1, steps + 1):
        begin = t0 + step * 5 * 10**9
        for i in range(samples):
            ids = {sc.RL_STEP: step, sc.RL_SAMPLE_INDEX: i}
            root = tracer.start_span(sc.SAMPLE_SPAN, attributes=ids, start_time=begin + i)
            ctx = trace.set_span_in_context(root)
            for _ in range(4):
                attrs = {**ids, sc.RL_PHASE: sc.GENERATE}
                tracer.start_span("chat m", context=ctx, attributes=attrs, start_time=begin + i).end(begin + 10**8)
            root.end(begin + 2 * 10**8)
        attrs = {sc.RL_STEP: step, sc.RL_STEP_SUMMARY: body}
        tracer.start_span(sc.STEP_SUMMARY_SPAN, attributes=attrs, start_time=begin).end(begin + 3 * 10**9)
        if step % 20 == 0:
            provider.force_flush()  # a bounded queue: never drop a span
    provider.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1001)
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("/tmp/summary-search"))
    args = ap.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    print(json.dumps({"machine": machine(), "command": " ".join([sys.executable, *sys.argv])}), flush=True)
    second = soak_store.start_second("opensearch", args.out)
    try:
        write(second.otlp_endpoint, args.steps, args.samples)
        client = JaegerClient(second.stack.jaeger_url, timeout_s=120)
        end = datetime.now(timezone.utc) + timedelta(days=1)
        op = sc.STEP_SUMMARY_SPAN
        deadline = time.monotonic() + 600
        while client.find_all_traces(SERVICE, EPOCH, end, operation=op, search_depth=20_000).traces < args.steps:
            if time.monotonic() > deadline:
                raise SystemExit("Jaeger did not return every summary in 600 s")
            time.sleep(5)
        print(f"stored: {second.stored():,.0f} spans, {args.steps} summaries", flush=True)
        saved = _source.STEP_SEARCH_DEPTH
        for rnd in range(args.rounds):
            for depth in (500, 10_000):
                _source.STEP_SEARCH_DEPTH = depth
                source = JaegerSource(client, [SERVICE], "--service", None, 500)
                t = time.perf_counter()
                found = source.search(print, operation=op)
                print(f"round {rnd}: depth {depth:>6}: {len(found)} summaries in {time.perf_counter() - t:.2f} s")
        _source.STEP_SEARCH_DEPTH = saved
    finally:
        second.stop()


if __name__ == "__main__":
    main()
