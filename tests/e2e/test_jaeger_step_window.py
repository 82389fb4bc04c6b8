"""``report --jaeger --step N`` reads the step's own time, not the whole store, against the real Jaeger (api_v3).

Jaeger 2.13's HTTP api_v3 ignores ``query.attributes`` (a tag does not narrow a search), so a step's search is
first narrowed to the step's window, found from its ``rl.step`` and ``rl.step.summary`` spans (by operation name,
which Jaeger filters on). Three steps ten minutes apart (explicit times, over OTLP): the search for step 2
returns step 2's traces only; a step with neither span falls back to the whole window and still finds every
sample; ``report --step 2`` counts step 2's samples.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import JaegerClient
from otel_agentloop.analysis._reading._source import EPOCH, JaegerSource

SAMPLES = 6
GAP_S = 600
"""Steps this far apart: well past the window's slack."""


@pytest.fixture(scope="module")
def steps(stack: Any) -> str:
    """A service with steps 1-3 (a ``rl.step`` span, samples, a ``rl.step.summary`` span each) and step 4 (samples
    only), an hour old, ``GAP_S`` apart. Returns the service."""
    service = f"window-{uuid.uuid4().hex[:6]}"
    provider = TracerProvider(resource=Resource.create({"service.name": service, sc.RL_RUN_ID: service}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=stack.otlp_grpc_endpoint, insecure=True)))
    tracer = provider.get_tracer("window-job")
    t0 = time.time_ns() - 3600 * 10**9
    for step in (1, 2, 3, 4):
        begin = t0 + step * GAP_S * 10**9
        if step < 4:
            tracer.start_span(sc.STEP_SPAN, attributes={sc.RL_STEP: step}, start_time=begin).end(begin + 20 * 10**9)
        for i in range(SAMPLES):
            start = begin + 10**9 + i * 10**7
            ids = {sc.RL_STEP: step, sc.RL_SAMPLE_INDEX: i, sc.RL_ROLLOUT_N: 0}
            root = tracer.start_span(sc.SAMPLE_SPAN, attributes=ids, start_time=start)
            gen = {**ids, sc.RL_PHASE: sc.GENERATE}
            child = trace.set_span_in_context(root)
            tracer.start_span("text_completion m", context=child, attributes=gen, start_time=start).end(start + 10**8)
            root.end(end_time=start + 10**8)
        if step < 4:
            summary = tracer.start_span(sc.STEP_SUMMARY_SPAN, attributes={sc.RL_STEP: step}, start_time=begin + 10**9)
            summary.end(begin + 2 * 10**9)
    provider.shutdown()
    client = JaegerClient(stack.jaeger_url)
    want = 4 * SAMPLES
    client.wait_for(
        lambda: _samples(client, service, EPOCH, datetime.now(timezone.utc)),
        lambda found: len(found) == want,
        60,
    )
    return service


def _samples(client: JaegerClient, service: str, start: datetime, end: datetime) -> list[tuple[int, int]]:
    from otel_agentloop.analysis import decode_resource_spans

    found = client.find_all_traces(service, start, end)
    return [
        (int(r.attributes[sc.RL_STEP]), int(r.attributes[sc.RL_SAMPLE_INDEX]))
        for r in decode_resource_spans(found.resource_spans)
        if r.name == sc.SAMPLE_SPAN
    ]


def _source(stack: Any, service: str) -> JaegerSource:
    return JaegerSource(JaegerClient(stack.jaeger_url), [service], "--service", None, 500)


def test_a_steps_search_reads_the_steps_window_only(stack, steps: str) -> None:
    records = _source(stack, steps).search(lambda line: pytest.fail(line), step=2)
    found = {int(r.attributes[sc.RL_STEP]) for r in records if sc.RL_STEP in r.attributes}
    assert found == {2}, found  # Jaeger ignores the tag: without the window, steps 1, 3 and 4 came back too
    assert sum(r.name == sc.SAMPLE_SPAN for r in records) == SAMPLES
    assert {r.name for r in records} >= {sc.STEP_SPAN, sc.STEP_SUMMARY_SPAN, sc.SAMPLE_SPAN}


def test_a_step_without_step_or_summary_spans_reads_the_whole_window(stack, steps: str) -> None:
    source = _source(stack, steps)
    start, end = source.window()
    assert source.step_window(steps, 4, start, end) == (start, end)
    records = source.search(lambda line: pytest.fail(line), step=4)
    samples = {int(r.attributes[sc.RL_SAMPLE_INDEX]) for r in records if r.name == sc.SAMPLE_SPAN and
               r.attributes.get(sc.RL_STEP) == 4}  # fmt: skip
    assert samples == set(range(SAMPLES))
    lo, hi = source.step_window(steps, 2, start, end)
    assert timedelta(0) < hi - lo < timedelta(seconds=GAP_S)


def test_report_step_counts_the_steps_samples(stack, steps: str, tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "report", "--jaeger", stack.jaeger_url, "--service", steps,
         "--step", "2", "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["metrics"]["agent_loop/num_samples"] == SAMPLES


def test_compare_reads_both_steps_windows(stack, steps: str, tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "report", "--jaeger", stack.jaeger_url, "--service", steps,
         "--compare", "1", "3", "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    compared = json.loads(out.stdout)
    assert (compared["a"]["step"], compared["b"]["step"]) == (1, 3)
    assert compared["a"]["num_samples"] == compared["b"]["num_samples"] == SAMPLES  # each read once


def test_the_step_and_summary_searches_run_once_for_every_step_read(stack, steps: str) -> None:
    source = _source(stack, steps)
    by_operation: list[str | None] = []
    find = source.client.find_all_traces

    def counted(*args: Any, **kwargs: Any) -> Any:
        by_operation.append(kwargs.get("operation"))
        return find(*args, **kwargs)

    source.client.find_all_traces = counted  # type: ignore[method-assign]
    for step in (1, 2, 3):  # as a run page's step pages read them
        records = source.search(lambda line: pytest.fail(line), step=step)
        assert {int(r.attributes[sc.RL_STEP]) for r in records if sc.RL_STEP in r.attributes} == {step}
    assert by_operation.count(sc.STEP_SPAN) == 1 and by_operation.count(sc.STEP_SUMMARY_SPAN) == 1, by_operation
    assert by_operation.count(None) == 3
