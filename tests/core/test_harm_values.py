"""Hostile user values never reach the user as our exception and never lose a span (issue 13 classes 4, 6, 7,
9, 11, 12)."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as pb_encode
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from tests._support.spans import span_metrics


class BadStr(Exception):  # noqa: N818
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class Escape(BaseException):
    pass


class BaseStr(Exception):  # noqa: N818
    def __str__(self) -> str:
        raise Escape("from __str__")


@pytest.mark.parametrize("exc_type", [BadStr, BaseStr])
def test_exception_with_failing_str_is_reraised_and_the_span_and_sample_end(traced, exc_type) -> None:
    @oal.trace_reward
    def score() -> float:
        raise exc_type("x")

    with pytest.raises(exc_type), oal.step(1), oal.sample(0):
        score()
    names = sorted(s.name for s in traced.spans())
    assert names == ["rl.reward", "rl.sample", "rl.step"]
    reward = traced.by_name("rl.reward")[0]
    assert reward.attributes[sc.ERROR_TYPE].endswith(exc_type.__name__)
    metrics = traced.handle.metrics.collect(1)
    assert metrics["agent_loop/num_samples"] == 1


class ManyValues:
    def __int__(self) -> int:
        raise RuntimeError("a multi-element tensor cannot be converted")

    def __float__(self) -> float:
        raise RuntimeError("no float")


@pytest.mark.parametrize("bad", [np.array([1, 2, 3]), np.ma.masked, ManyValues(), object()])
def test_record_never_raises_and_keeps_other_fields(traced, bad) -> None:
    with oal.step(1), oal.sample(0) as s:
        s.record(response_length=bad, prompt_length=7, reward=bad)
        oal.record_sample(num_preempted=bad, turns=2)
        oal.record_generation(input_tokens=bad, output_tokens=3, finish_reason=BadStr())
    table = traced.handle.metrics.take(1)
    assert table.prompt_length.tolist() == [7]
    root = traced.by_name("rl.sample")[0]
    assert root.attributes[sc.RL_NUM_TURNS] == 2


def test_record_of_a_huge_int_keeps_the_error_flag_and_other_fields(traced) -> None:
    with pytest.raises(ValueError), oal.step(1), oal.sample(0) as s:
        s.record(prompt_length=2**70, response_length=11)
        raise ValueError("sample failed")
    table = traced.handle.metrics.take(1)
    assert table.error.tolist() == [True]
    assert table.response_length.tolist() == [11]


def test_content_capture_never_raises_and_never_leaks_unredacted_text() -> None:
    exporter = InMemorySpanExporter()

    def redact(text: str):
        if "secret" in text:
            raise RuntimeError("redactor broke")
        return 42  # not a string

    handle = oal.configure(
        "c", exporters=[exporter], set_global=False, capture_content=True, redact=redact, schedule_delay_s=0.05
    )
    try:
        with oal.sample(0, step=1) as s:
            s.record_content(prompt="my secret", response=BadStr())
            s.record_content(prompt="plain")
        assert handle.force_flush(5)
        root = next(x for x in exporter.get_finished_spans() if x.name == "rl.sample")
        values = [v for k, v in root.attributes.items() if k in (sc.RL_PROMPT_CONTENT, sc.RL_RESPONSE_CONTENT)]
        assert not any("secret" in str(v) for v in values)
    finally:
        handle.shutdown(5)


def test_bind_in_executor_map_runs_each_call_in_the_bound_context(traced) -> None:
    def which(_: int) -> int | None:
        s = oal.current_sample()
        time.sleep(0.01)
        return None if s is None else s.index

    with oal.sample(5, step=1), ThreadPoolExecutor(4) as pool:
        assert list(pool.map(oal.bind(which), range(16))) == [5] * 16


# -- limits (class 9) --------------------------------------------------------------------------------
def test_identity_survives_a_tiny_attribute_count_limit(monkeypatch) -> None:
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "4")
    exporter = InMemorySpanExporter()
    handle = oal.configure("lim", exporters=[exporter], set_global=False)
    try:

        @oal.trace_generate(model="m")
        def gen() -> None:
            time.sleep(0.01)

        with oal.step(1):
            for i in range(3):
                with oal.sample(i, rollout_n=0):
                    gen()
        metrics = handle.metrics.collect(1)
        assert metrics["agent_loop/num_samples"] == 3
        assert metrics["agent_loop/generate_sequences/min"] > 0
    finally:
        handle.shutdown(5)


def test_identity_survives_many_user_attributes(traced) -> None:
    @oal.phase("generate", attributes={f"user.{i}": i for i in range(200)})
    def gen() -> None:
        time.sleep(0.02)

    with oal.step(1), oal.sample(0):
        gen()
    assert traced.handle.metrics.collect(1)["agent_loop/generate_sequences/max"] >= 0.015


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no str")


def test_an_unprintable_attribute_value_does_not_drop_the_span(traced) -> None:
    @oal.phase("generate", attributes={"bad": Unprintable()})  # type: ignore[dict-item]
    def gen() -> int:
        return 1

    with oal.step(1), oal.sample(0, attributes={"bad": Unprintable()}):  # type: ignore[dict-item]
        assert gen() == 1
    assert sorted(s.name for s in traced.spans()) == ["rl.sample", "rl.step", "text_completion"]


# -- data (class 11) ---------------------------------------------------------------------------------
def test_otlp_json_types_attributes_like_otlp_protobuf(tmp_path) -> None:
    memory = InMemorySpanExporter()
    path = tmp_path / "t.jsonl"
    handle = oal.configure("types", exporters=[memory], file=path, set_global=False, schedule_delay_s=0.05)
    try:
        with oal.span(
            "tool_calls",
            tool="x",
            attributes={"f": np.float64(1.5), "d": {"k": 1, "s": "v"}, "n": None, "l": [1, None, 3]},
        ) as sp:
            sp.set_attribute("big", 2**70)
        assert handle.force_flush(5)
    finally:
        handle.shutdown(5)
    (span,) = memory.get_finished_spans()
    pb = json_format.MessageToDict(pb_encode([span]))
    pb_attrs = {
        kv["key"]: kv.get("value", {}) for kv in pb["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"]
    }
    line = json.loads(path.read_text().splitlines()[0])
    ours = {kv["key"]: kv["value"] for kv in line["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"]}
    for key in ("f", "d", "n", "l"):
        assert ours.get(key) == pb_attrs.get(key), key
    assert "big" not in ours  # protobuf cannot encode it either: dropped, not misreported


def test_collect_of_a_running_step_counts_each_sample_once(traced) -> None:
    @oal.trace_generate
    def gen() -> None:
        time.sleep(0.01)

    with oal.step(1):
        with oal.sample(0):
            gen()
        running = oal.sample(1)
        running.__enter__()
        gen()
        first = traced.handle.metrics.collect(1)
        gen()
        running.__exit__(None, None, None)
    second = traced.handle.metrics.collect(1)
    assert first["agent_loop/num_samples"] == 1
    assert first["agent_loop/telemetry/samples_in_flight"] == 1
    # the late sample reaches the next collect of its step, whole (both turns), and only that one
    assert second["agent_loop/num_samples"] == 1 and second["agent_loop/late_samples"] == 1
    assert second["agent_loop/slowest/sample_index"] == 1
    assert second["agent_loop/generate_sequences/max"] >= 0.02
    assert span_metrics(traced.handle.metrics.collect(1)) == {"agent_loop/num_samples": 0.0}  # never twice


# -- cost (class 12) ---------------------------------------------------------------------------------
def test_an_exception_through_many_decorated_frames_is_recorded_once_and_bounded(traced) -> None:
    @oal.phase("tool_calls", tool="deep")
    def deep(n: int) -> None:
        if n == 0:
            raise KeyError("bottom")
        deep(n - 1)

    t0 = time.perf_counter()
    with pytest.raises(KeyError), oal.sample(0, step=1):
        deep(300)
    elapsed = time.perf_counter() - t0
    spans = traced.by_name("execute_tool deep")
    assert len(spans) == 301 and all(s.attributes[sc.ERROR_TYPE] == "KeyError" for s in spans)
    traces = [
        e.attributes["exception.stacktrace"]
        for s in spans
        for e in s.events
        if "exception.stacktrace" in (e.attributes or {})
    ]
    assert len(traces) == 1 and len(traces[0]) <= 16_384
    print(f"300 nested decorated frames: {elapsed * 1e3:.1f} ms")


def test_cancellation_is_not_an_error(traced) -> None:
    @oal.trace_tool("slow")
    async def slow() -> None:
        await asyncio.sleep(10)

    async def run() -> None:
        task = asyncio.ensure_future(slow())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    (s,) = traced.by_name("execute_tool slow")
    assert sc.ERROR_TYPE not in s.attributes and s.attributes[sc.RL_CANCELLED] is True


def test_identity_survives_a_flood_of_attributes_set_after_start(traced) -> None:
    from opentelemetry import trace

    @oal.trace_generate
    def gen() -> None:
        span = trace.get_current_span()
        for i in range(500):  # far more than the count limit (128 + reserved)
            span.set_attribute(f"user.{i}", i)
        time.sleep(0.01)

    with oal.step(1), oal.sample(0, rollout_n=2) as s:
        gen()
        for i in range(500):
            s.span.set_attribute(f"user.{i}", i)
        s.record(response_length=9)
    metrics = traced.handle.metrics.collect(1)
    assert metrics["agent_loop/num_samples"] == 1
    assert metrics["agent_loop/generate_sequences/max"] >= 0.009
