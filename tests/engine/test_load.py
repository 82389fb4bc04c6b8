"""The engine's state under each request and over time (issue 36), against a real in-process ``AsyncLLM`` whose
scheduler preempts (``load_driver.py``: 16 KV blocks, ``max_num_seqs=8``, prefix caching, the user's own stat
logger), read back from a real Jaeger through the real Collector."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import JaegerClient, decode_resource_spans
from otel_agentloop.metrics import SpanRecord

from .conftest import as_list, trace_spans
from .load_driver import ABORTED_ID, MAX_TOKENS, N_SAMPLES, RESUMED_ID, RESUMED_TOKENS, TURNS

LOAD_ATTRIBUTES = (*sc.ENGINE_LOAD_ATTRIBUTES, sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, sc.RL_ENGINE_PREEMPTIONS)


def _turns(jaeger: JaegerClient, trace_id: str, expect: int) -> list[SpanRecord]:
    spans = trace_spans(jaeger, trace_id, expect=expect)
    return [s for s in spans if s.attributes.get(sc.RL_PHASE) == sc.GENERATE]


def _all_turns(load: dict[str, Any], jaeger: JaegerClient) -> dict[str, SpanRecord]:
    """Every turn span of the run (both steps and the aborted-then-resumed turn), by request id."""
    turns: dict[str, SpanRecord] = {}
    for sample in load["step0"] + load["step1"]:
        found = _turns(jaeger, sample["trace_id"], expect=1 + TURNS)
        assert len(found) == TURNS, [s.attributes for s in found]
        turns.update({t.attributes[sc.GEN_AI_RESPONSE_ID]: t for t in found})
    (resumed,) = _turns(jaeger, load["aborted"]["trace_id"], expect=4)
    turns[resumed.attributes[sc.GEN_AI_RESPONSE_ID]] = resumed
    return turns


def test_every_turn_carries_the_engines_load_and_the_preemptions_and_cached_tokens_add_up(
    load: dict[str, Any], stack: Any
) -> None:
    """Every turn has the engine's load while its request was in the engine; the turns' preemptions add up to
    what vLLM counted itself (``IterationStats.num_preempted_reqs``, summed by the user's own logger, which still
    ran), and that is above 0; the turns' cached prompt tokens add up to the engine's prefix-cache hits."""
    turns = _all_turns(load, JaegerClient(stack.jaeger_url))
    assert len(turns) == (N_SAMPLES + 2) * TURNS + 1 and RESUMED_ID in turns
    returned = {t["request_id"]: t for s in load["step0"] + load["step1"] for t in s["turns"]}
    for request_id, turn in turns.items():
        a = turn.attributes
        assert all(key in a for key in LOAD_ATTRIBUTES), (request_id, a)
        assert 1 <= a[sc.RL_ENGINE_BATCH_RUNNING_MAX] <= 8 and a[sc.RL_ENGINE_BATCH_WAITING_MAX] >= 0, a
        assert 0 < a[sc.RL_ENGINE_BATCH_RUNNING_MEAN] <= a[sc.RL_ENGINE_BATCH_RUNNING_MAX], a
        assert 0.0 < a[sc.RL_ENGINE_KV_CACHE_USAGE_MAX] <= 1.0 and a[sc.RL_ENGINE_ITERATIONS] >= 1, a
        if request_id in returned:  # what the engine returned to the caller for that request
            expected = returned[request_id]
            assert a[sc.RL_ENGINE_PREEMPTIONS] == expected["preemptions"], (a, expected)
            assert a[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == expected["cached"], (a, expected)
            assert a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == expected["output_tokens"] == MAX_TOKENS
            assert a[sc.RL_ENGINE_FINISH] == sc.ENGINE_FINISHED
            assert a[sc.RL_ENGINE_ITERATIONS] >= MAX_TOKENS  # one token per iteration at most
    user = load["user_logger"]
    assert user["records"] > 0  # the user's own logger ran
    preemptions = sum(t.attributes[sc.RL_ENGINE_PREEMPTIONS] for t in turns.values())
    assert preemptions == user["preempted"] > 0, (preemptions, user)
    cached = sum(t.attributes[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] for t in turns.values())
    assert cached == user["hits"] > 0, (cached, user)
    # the shared system prompt's blocks were hit: a preempted turn shows the engine full while it ran
    assert any(t.attributes[sc.RL_ENGINE_PREEMPTIONS] > 0 for t in turns.values())
    assert max(t.attributes[sc.RL_ENGINE_KV_CACHE_USAGE_MAX] for t in turns.values()) > 0.9


def test_a_request_aborted_through_vllms_abort_and_resumed_is_two_segments_of_its_turn(
    load: dict[str, Any], stack: Any
) -> None:
    """``AsyncLLM.abort()`` after a few outputs, then a second request in the same turn: two ``rl.engine.segment``
    spans under the turn, the first aborted with its partial numbers, the second finished; the turn's output
    tokens, cached tokens and preemptions are the sums of its segments'."""
    aborted, resumed = load["aborted"], load["aborted"]["resumed"]
    assert aborted["finish_reason"] == "abort" and 0 < aborted["output_tokens"] < 200, aborted
    spans = trace_spans(JaegerClient(stack.jaeger_url), aborted["trace_id"], expect=4)
    (turn,) = [s for s in spans if s.attributes.get(sc.RL_PHASE) == sc.GENERATE]
    segments = sorted(
        (s for s in spans if s.name == sc.ENGINE_SEGMENT_SPAN), key=lambda s: s.attributes[sc.RL_ENGINE_SEGMENT_INDEX]
    )
    assert [s.parent_id for s in segments] == [turn.span_id] * 2
    first, second = (s.attributes for s in segments)
    assert first[sc.GEN_AI_RESPONSE_ID] == ABORTED_ID and first[sc.RL_ENGINE_FINISH] == sc.ENGINE_ABORTED
    assert first[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == aborted["output_tokens"]
    assert as_list(first[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ["abort"]
    assert first[sc.RL_ENGINE_PREEMPTIONS] == aborted["preemptions"] and first[sc.RL_ENGINE_ITERATIONS] >= 1
    assert first[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == aborted["cached"]
    assert second[sc.GEN_AI_RESPONSE_ID] == RESUMED_ID and second[sc.RL_ENGINE_FINISH] == sc.ENGINE_FINISHED
    assert second[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == resumed["output_tokens"] == RESUMED_TOKENS
    a = turn.attributes
    assert a[sc.RL_ENGINE_SEGMENTS] == 2 and a[sc.RL_ENGINE_FINISH] == sc.ENGINE_FINISHED
    assert a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == aborted["output_tokens"] + RESUMED_TOKENS
    assert a[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == aborted["cached"] + resumed["cached"]
    assert a[sc.RL_ENGINE_PREEMPTIONS] == aborted["preemptions"] + resumed["preemptions"]


def _load_spans(load: dict[str, Any], jaeger: JaegerClient) -> list[SpanRecord]:
    start = datetime.fromtimestamp(load["start"], timezone.utc) - timedelta(seconds=5)
    end = datetime.fromtimestamp(load["end"], timezone.utc) + timedelta(seconds=5)

    def fetch() -> list[dict[str, Any]]:
        return jaeger.find_traces("rl-load", start, end, operation=sc.ENGINE_LOAD_SPAN)

    def spans(found: list[dict[str, Any]]) -> list[SpanRecord]:
        return [s for s in decode_resource_spans(found) if s.name == sc.ENGINE_LOAD_SPAN]

    preempted = load["user_logger"]["preempted"]
    found = jaeger.wait_for(
        fetch,
        lambda f: sum(sum(as_list(s.attributes[sc.RL_ENGINE_LOAD_PREEMPTIONS])) for s in spans(f)) >= preempted,
        timeout_s=60,
    )
    return spans(found)


def test_the_engines_load_over_time_is_exported_as_load_spans(load: dict[str, Any], stack: Any) -> None:
    """``rl.engine.load`` spans: root spans with equal-length arrays, one point per 100 ms at most, a window
    per step (``rl.step``), and every preemption vLLM counted in one of their points."""
    spans = _load_spans(load, JaegerClient(stack.jaeger_url))
    assert spans
    steps = set()
    for span in spans:
        a = span.attributes
        assert not span.parent_id and a[sc.RL_ENGINE_NAME] == "vllm"
        assert re.fullmatch(r".+:\d+:0", a[sc.RL_ENGINE_ID]), a[sc.RL_ENGINE_ID]
        offsets = as_list(a[sc.RL_ENGINE_LOAD_OFFSET_MS])
        arrays = [as_list(a[k]) for k in (sc.RL_ENGINE_LOAD_RUNNING, sc.RL_ENGINE_LOAD_WAITING,
                                          sc.RL_ENGINE_LOAD_KV_CACHE_USAGE, sc.RL_ENGINE_LOAD_PREEMPTIONS)]  # fmt: skip
        assert 0 < len(offsets) <= 600 and all(len(x) == len(offsets) for x in arrays)
        assert offsets[0] == 0 and all(b > a for a, b in itertools.pairwise(offsets))
        duration_ms = (span.end_ns - span.start_ns) / 1e6
        assert offsets[-1] == round(duration_ms) and len(offsets) <= duration_ms / 100 + 2
        assert all(0.0 <= kv <= 1.0 for kv in arrays[2]) and max(arrays[0]) <= 8
        steps.add(a.get(sc.RL_STEP))
    assert {0, 1} <= steps
    total = sum(sum(as_list(s.attributes[sc.RL_ENGINE_LOAD_PREEMPTIONS])) for s in spans)
    assert total == load["user_logger"]["preempted"]


def test_report_names_the_preemption_behind_a_slow_sample_and_perfetto_draws_the_engines_load(
    load: dict[str, Any], stack: Any, tmp_path: Path
) -> None:
    """``report --step 0`` from the real Jaeger: a sample whose turn the engine preempted has a cause that names
    the preemption and the KV cache, the engine state line is printed, and ``--perfetto`` has the engine's
    counter tracks (``"ph": "C"``) for running, waiting and KV usage."""
    _load_spans(load, JaegerClient(stack.jaeger_url))  # stored by now
    preempted = {s["trace_id"] for s in load["step0"] if any(t["preemptions"] > 0 for t in s["turns"])}
    assert preempted, "no step-0 sample was preempted: the load driver no longer overloads the KV cache"
    report = [sys.executable, "-m", "otel_agentloop", "report", "--jaeger", stack.jaeger_url, "--service", "rl-load"]
    report += ["--step", "0", "--top", "50"]
    done = subprocess.run(report, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "engine state: peak KV cache" in done.stdout, done.stdout
    said = [line for line in done.stdout.splitlines() if any(trace_id in line for trace_id in preempted)]
    assert any(re.search(r"preempted (once|\d+ times) at \d+ % KV cache", line) for line in said), done.stdout
    out = tmp_path / "step0.json"
    done = subprocess.run([*report, "--perfetto", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    counters = [e for e in json.loads(out.read_text())["traceEvents"] if e.get("ph") == "C"]
    assert counters and {"running", "waiting", "kv"} <= {k for e in counters for k in e.get("args", {})}, counters[:5]
