"""``report --jaeger --step N`` answers from the step's stored summary, against the real Collector and Jaeger.

A real run through the public API (``configure``, ``step``, the simulated agent loop, ``collect``) writes two
steps of 24 samples, two of them failing, and an inference engine's span (another service) under a turn of step
2's slowest sample. What the terminal and ``--json`` report print is then read from the step's
``rl.step.summary`` span and the slowest sample's trace, fetched by id: the metrics are exactly the dict
``collect()`` returned (the spans' rebuild only approximates it: stored wall times), and every other fact equals
``--from-spans``, which reads all of the step's sample spans. Whatever the summary does not hold falls back to
the spans: ``--top`` past its list, a ``--sample`` it does not name, a page.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.analysis import JaegerClient, decode_resource_spans
from otel_agentloop.analysis._reading._source import EPOCH
from otel_agentloop.demo._agent import SimConfig, run_samples
from otel_agentloop.metrics import StepMetrics
from otel_agentloop.metrics._summary import TOP_STORED

CFG = SimConfig(
    prompts=12, rollout_n=2, time_scale=0.05, tool_prob=1.0, tool_fail_prob=0.0, fail_samples=frozenset({3})
)
STEPS = (1, 2)
SAMPLES = CFG.prompts * CFG.rollout_n


@pytest.fixture(scope="module")
def run(stack: Any) -> tuple[str, dict[int, StepMetrics]]:
    """A service with steps 1 and 2 stored in Jaeger; returns it and what ``collect()`` returned for each step."""
    service = f"summary-{uuid.uuid4().hex[:6]}"
    handle = oal.configure(service, endpoint=stack.otlp_grpc_endpoint, set_global=False, schedule_delay_s=0.05)
    live: dict[int, StepMetrics] = {}
    try:
        for step in STEPS:

            async def main(step: int = step) -> None:
                with oal.step(step):
                    await run_samples(CFG, step, CFG.work())

            asyncio.run(main())
            live[step] = handle.metrics.collect(step)
        assert handle.force_flush(10)
        assert handle.stats["dropped"] == 0 and handle.stats["failed"] == 0
    finally:
        handle.shutdown(5)
    client = JaegerClient(stack.jaeger_url)
    client.wait_for(
        lambda: client.find_all_traces(service, EPOCH, _far()).resource_spans,
        lambda found: _count(found) == len(STEPS) * (SAMPLES + 1),  # the samples and one summary a step
        60,
    )
    _engine_child(stack, client, str(live[2].slowest_trace_id))
    return service, live


ENGINE_SPAN = "llm_request"


def _engine_child(stack: Any, client: JaegerClient, trace_id: str) -> None:
    """An inference engine's span (another service, no ``rl.*`` identity) under the first turn of the trace: a
    report draws it in the sample's waterfall, from its search and from the trace fetched by id alike."""
    turn = next(
        r for r in decode_resource_spans(client.get_trace(trace_id)) if r.attributes.get(sc.RL_PHASE) == sc.GENERATE
    )
    parent = trace.SpanContext(int(trace_id, 16), turn.span_id, is_remote=True, trace_flags=trace.TraceFlags(1))
    provider = TracerProvider(resource=Resource.create({"service.name": "engine-x"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=stack.otlp_grpc_endpoint, insecure=True)))
    span = provider.get_tracer("engine").start_span(
        ENGINE_SPAN, context=trace.set_span_in_context(trace.NonRecordingSpan(parent)), start_time=turn.start_ns
    )
    span.end(end_time=turn.end_ns)
    provider.shutdown()
    client.wait_for(
        lambda: [r.name for r in decode_resource_spans(client.get_trace(trace_id))],
        lambda names: ENGINE_SPAN in names,
        60,
    )


def _far() -> datetime:
    return datetime.now(timezone.utc) + timedelta(days=1)


def _count(resource_spans: list[Any]) -> int:
    names = [r.name for r in decode_resource_spans(resource_spans)]
    return names.count(sc.SAMPLE_SPAN) + names.count(sc.STEP_SUMMARY_SPAN)


def _report(stack: Any, tmp_path: Path, service: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "report", "--jaeger", stack.jaeger_url, "--service", service, *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    return out


def test_json_from_the_summary_is_what_collect_returned_and_what_the_spans_say(stack, run, tmp_path) -> None:
    service, live = run
    for step in STEPS:
        stored = json.loads(_report(stack, tmp_path, service, "--step", str(step), "--json").stdout)
        spans = json.loads(_report(stack, tmp_path, service, "--step", str(step), "--json", "--from-spans").stdout)
        assert (stored["read_from"], spans["read_from"]) == ("summary", "spans")
        assert stored["metrics"] == dict(live[step])  # exactly: the dict collect() returned
        # the spans' rebuild has every key but the live process's own counters (spans exported, dropped, ...)
        live_only = {k for k in stored["metrics"] if k.startswith(f"{sc.METRIC_PREFIX}/telemetry/")}
        assert live_only and stored["metrics"].keys() - live_only == spans["metrics"].keys()
        for key, value in spans["metrics"].items():
            assert stored["metrics"][key] == pytest.approx(value, abs=0.002), key
        assert stored["slowest_trace_id"] == spans["slowest_trace_id"] == live[step].slowest_trace_id
        assert stored["verdicts"] == spans["verdicts"]
        assert stored["verdicts"]["counts"]["failed"] == CFG.rollout_n
        assert stored["verdicts"]["failed"] == [[3, n] for n in range(CFG.rollout_n)]
        assert len(stored["slowest"]) == 5
        for a, b in zip(stored["slowest"], spans["slowest"], strict=True):
            assert a.keys() == b.keys()
            for key, value in a.items():
                assert b[key] == (pytest.approx(value, abs=0.002) if isinstance(value, float) else value), key


def test_terminal_report_reads_the_summary_and_draws_the_slowest_sample_from_its_trace(stack, run, tmp_path) -> None:
    service, live = run
    stored = _report(stack, tmp_path, service).stdout  # no --step: the latest step
    spans = _report(stack, tmp_path, service, "--step", "2", "--from-spans").stdout
    assert "== step 2: agent_loop metrics as collected (its rl.step.summary) from" in stored
    assert "== step 2: agent_loop metrics rebuilt from" in spans
    title = f"sample {live[2].slowest_sample[0]} (rollout {live[2].slowest_sample[1]}), step 2, trace "
    assert title + str(live[2].slowest_trace_id) in stored
    # the waterfall: the same spans, fetched by trace id instead of found by a search of the step, the engine's
    # span (another service, no step) under its turn in both
    assert stored[stored.index(title) :] == spans[spans.index(title) :]
    assert ENGINE_SPAN in stored[stored.index(title) :]


def test_what_the_summary_does_not_hold_is_read_from_the_spans(stack, run, tmp_path) -> None:
    service, _ = run
    more = json.loads(_report(stack, tmp_path, service, "--step", "1", "--json", "--top", str(TOP_STORED + 1)).stdout)
    assert more["read_from"] == "spans" and len(more["slowest"]) == TOP_STORED + 1
    listed = json.loads(_report(stack, tmp_path, service, "--step", "1", "--json", "--top", str(TOP_STORED)).stdout)
    assert listed["read_from"] == "summary" and len(listed["slowest"]) == TOP_STORED
    named = {(row["sample_index"], row["rollout_n"]) for row in listed["slowest"]}
    fastest = next(k for k in CFG.work() if k not in named)
    other = _report(stack, tmp_path, service, "--step", "1", "--sample", str(fastest[0]), "--rollout", str(fastest[1]))
    assert "agent_loop metrics rebuilt from" in other.stdout
    assert f"sample {fastest[0]} (rollout {fastest[1]}), step 1, trace " in other.stdout
    page = _report(stack, tmp_path, service, "--step", "1", "--html", str(tmp_path / "step.html"))
    assert "agent_loop metrics rebuilt from" in page.stdout and (tmp_path / "step.html").stat().st_size > 0


MISBEHAVE = ["--steps", "3", "--misbehave", "--prompts", "4", "--rollout-n", "4", "--time-scale", "0.2"]
MISBEHAVE += ["--val-every", "0"]
HUNG_KEY, SLOW_KEY = (0, 0), (1, 0)  # demo/_main.misbehaviour, at step 3


@pytest.fixture(scope="module")
def misbehaved(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """``simulate --misbehave`` into Jaeger (step 3: sample 0/0 hung, 1/0 slow, the watchdog's snapshot spans in
    their traces); returns the service."""
    service = f"misbehave-{uuid.uuid4().hex[:6]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "simulate", *MISBEHAVE, "--endpoint", stack.otlp_grpc_endpoint,
         "--service-name", service],
        cwd=tmp_path_factory.mktemp("misbehave"), env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    client = JaegerClient(stack.jaeger_url)

    def stored() -> list[str]:
        return [r.name for r in decode_resource_spans(client.find_all_traces(service, EPOCH, _far()).resource_spans)]

    def complete(names: list[str]) -> bool:  # 3 summaries; 16 samples a step (the hung one may end cancelled)
        return names.count(sc.STEP_SUMMARY_SPAN) >= 3 and names.count(sc.SAMPLE_SPAN) >= 47

    assert complete(client.wait_for(stored, complete, 60))
    return service


def test_hung_and_slow_samples_from_the_summary_are_what_the_spans_say(stack, misbehaved, tmp_path) -> None:
    """Step 3's verdicts, and the waterfalls of its hung and its slow sample (their traces hold the watchdog's
    snapshot spans, which no report draws), are the same from the summary as from the spans."""
    stored = json.loads(_report(stack, tmp_path, misbehaved, "--step", "3", "--json").stdout)
    spans = json.loads(_report(stack, tmp_path, misbehaved, "--step", "3", "--json", "--from-spans").stdout)
    assert (stored["read_from"], spans["read_from"]) == ("summary", "spans")
    assert stored["verdicts"] == spans["verdicts"]
    assert [[s["sample_index"], s["rollout_n"]] for s in stored["verdicts"]["hung"]] == [list(HUNG_KEY)]
    assert [[s["sample_index"], s["rollout_n"]] for s in stored["verdicts"]["slow"]] == [list(SLOW_KEY)]
    for index, rollout in (HUNG_KEY, SLOW_KEY):
        args = ("--step", "3", "--sample", str(index), "--rollout", str(rollout))
        text = _report(stack, tmp_path, misbehaved, *args).stdout
        rebuilt = _report(stack, tmp_path, misbehaved, *args, "--from-spans").stdout
        assert "as collected (its rl.step.summary)" in text and "rebuilt from" in rebuilt
        title = f"sample {index} (rollout {rollout}), step 3, trace "
        assert text[text.index(title) :] == rebuilt[rebuilt.index(title) :]
        assert sc.SNAPSHOT_SUFFIX.strip() not in text[text.index(title) :]
