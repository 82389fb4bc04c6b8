"""Content capture (off by default, redacted, truncated, counted), trainer-phase spans, fork safety."""

from __future__ import annotations

import asyncio
import os
import re
import time

import pytest

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.analysis import read_jsonl


def test_content_is_not_captured_by_default(traced) -> None:
    with oal.sample(0, step=1) as s:
        s.record_content(prompt="secret prompt", response="secret answer")
    (root,) = traced.by_name("rl.sample")
    assert sc.RL_PROMPT_CONTENT not in root.attributes and sc.RL_RESPONSE_CONTENT not in root.attributes


def test_content_capture_redacts_then_truncates_and_counts(tmp_path) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    mem = InMemorySpanExporter()
    handle = oal.configure(
        "content",
        exporters=[mem],
        set_global=False,
        capture_content=True,
        max_content_chars=40,
        redact=lambda t: re.sub(r"\d{4}-\d{4}", "[card]", t),
    )
    try:
        with oal.sample(0, step=1) as s:
            s.record_content(prompt="pay with 1234-5678 please", response="ok " * 50)
        metrics = handle.metrics.collect(1)
        assert handle.force_flush(5)
        (root,) = [x for x in mem.get_finished_spans() if x.name == "rl.sample"]
        assert root.attributes[sc.RL_PROMPT_CONTENT] == "pay with [card] please"
        response = root.attributes[sc.RL_RESPONSE_CONTENT]
        assert len(response) == 40 and response.endswith("…[truncated]")
        assert metrics["agent_loop/telemetry/content_truncated"] >= 1
    finally:
        handle.shutdown(5)
    with pytest.raises(ValueError, match="max_content_chars"):
        oal.configure("bad", set_global=False, max_content_chars=0)


def test_trainer_phases_nest_under_the_step_and_fill_timing_raw(traced) -> None:
    timing_raw: dict[str, float] = {}

    @oal.trainer_phase("update_actor", timing_raw)
    def update() -> str:
        return "updated"

    async def rollout() -> None:
        async with oal.trainer_phase("gen", timing_raw):
            await asyncio.sleep(0.02)

    with oal.step(4):
        t0 = time.perf_counter()
        asyncio.run(rollout())
        around = time.perf_counter() - t0
        assert update() == "updated"
        with pytest.raises(KeyError), oal.trainer_phase("adv", timing_raw):
            raise KeyError("advantage")
    spans = {s.name: s for s in traced.spans()}
    step_span = spans["rl.step"]
    for name in ("rl.train.gen", "rl.train.update_actor", "rl.train.adv"):
        assert spans[name].parent.span_id == step_span.context.span_id
        assert spans[name].attributes[sc.RL_STEP] == 4
    assert spans["rl.train.adv"].status.status_code.name == "ERROR"
    # the block's seconds, in timing_raw and as the span's duration: each at least the block's sleep and at most a
    # timer around it (bounds that hold under any load)
    gen_span = spans["rl.train.gen"]
    assert 0.02 <= timing_raw["gen"] <= around and 0.02 <= (gen_span.end_time - gen_span.start_time) / 1e9 <= around
    assert set(timing_raw) == {"gen", "update_actor", "adv"}


def test_trainer_phase_times_even_when_tracing_is_off() -> None:
    oal.configure("off", enabled=False)
    timing_raw: dict[str, float] = {}
    with oal.trainer_phase("gen", timing_raw) as span:
        assert not span.is_recording()
    assert timing_raw["gen"] >= 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_exports_its_own_spans(tmp_path) -> None:
    path = tmp_path / "fork.jsonl"
    handle = oal.configure("fork", file=str(path), set_global=False, schedule_delay_s=0.05)
    try:
        with oal.sample(0, step=1):
            pass
        pid = os.fork()
        if pid == 0:  # child: its queue starts empty and its worker thread is fresh
            code = 1
            try:
                with oal.sample(1, step=1):
                    pass
                code = 0 if handle.force_flush(5) and handle.stats["exported"] >= 1 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
        assert handle.force_flush(5)
    finally:
        handle.shutdown(5)
    indices = sorted(r.attributes[sc.RL_SAMPLE_INDEX] for r in read_jsonl(str(path)) if r.name == "rl.sample")
    assert indices == [0, 1]
