"""Deeply nested attribute values (issue 41, item 5): what the library writes, ``report`` reads. A value nested
17 to 64 levels is exported as nested arrays on both span paths (the SDK 1.45 follows any depth), and reading
it back keeps its span, so the phase's time stays in the metrics; a value nested deeper than the reader follows
(the SDK path writes any depth) costs that attribute alone. Real spans through the file exporter and the gRPC
exporter to a loopback receiver."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

import otel_agentloop as oal
from otel_agentloop.analysis import Skipped, read_jsonl
from otel_agentloop.analysis._reading._report import summary_of
from tests._support.both_paths import assert_same, attrs, both


def nested(depth: int) -> Any:
    """A list ``depth`` levels deep around ``"core"`` (depth 1: ``["core"]``)."""
    value: Any = "core"
    for _ in range(depth):
        value = [value]
    return value


def depth_of(value: Any) -> int:
    levels = 0
    while isinstance(value, (tuple, list)):
        (value,) = value
        levels += 1
    assert value == "core"
    return levels


def _write(path: Path, value: Any, *, fast: bool) -> dict[str, float]:
    @oal.trace_tool("deep")
    def tool() -> None:
        time.sleep(0.02)
        trace.get_current_span().set_attribute("user.deep", value)

    handle = oal.configure("deep", file=str(path), set_global=False, schedule_delay_s=30, fast_path=fast)
    try:
        with oal.step(1), oal.sample(0):
            tool()
        metrics = handle.metrics.collect(1)
        assert handle.force_flush(10)
    finally:
        handle.shutdown(5)
    return metrics


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "sdk-path"])
@pytest.mark.parametrize("depth", [17, 32, 40, 64])
def test_a_deep_attribute_keeps_its_span_and_the_phase_time(tmp_path: Path, fast: bool, depth: int) -> None:
    path = tmp_path / "traces.jsonl"
    collected = _write(path, nested(depth), fast=fast)
    skipped = Skipped()
    records = list(read_jsonl(str(path), skipped))
    assert skipped.count == 0, skipped.first
    (tool,) = [r for r in records if r.name == "execute_tool deep"]
    assert depth_of(tool.attributes["user.deep"]) == depth  # nested arrays, read back whole
    rebuilt = summary_of(records, 1)
    assert rebuilt.metrics["agent_loop/tool_calls/max"] == pytest.approx(collected["agent_loop/tool_calls/max"])
    assert collected["agent_loop/tool_calls/max"] >= 0.015


@pytest.mark.parametrize("depth", [80, 400])
def test_deeper_than_the_reader_follows_costs_the_attribute_not_the_span(tmp_path: Path, depth: int) -> None:
    """The SDK's span follows any depth (400: its line nests past Python's recursion limit in JSON)."""
    path = tmp_path / "traces.jsonl"
    collected = _write(path, nested(depth), fast=False)
    skipped = Skipped()
    records = list(read_jsonl(str(path), skipped))
    assert skipped.count == 0, skipped.first
    (tool,) = [r for r in records if r.name == "execute_tool deep"]
    assert str(tool.attributes["user.deep"]).startswith("<nested deeper than 64 levels")
    assert summary_of(records, 1).metrics["agent_loop/tool_calls/max"] == pytest.approx(
        collected["agent_loop/tool_calls/max"]
    )


def test_a_list_nested_40_deep_is_the_same_nested_arrays_on_both_paths(monkeypatch) -> None:
    @oal.trace_tool("t")
    def tool() -> None:
        trace.get_current_span().set_attribute("user.deep", nested(40))

    def scenario(handle: oal.Handle) -> None:
        with oal.step(1), oal.sample(0):
            tool()

    runs = both(scenario, monkeypatch)
    assert_same(runs)
    value = attrs(runs[True].spans["execute_tool t"])["user.deep"]
    levels = 0
    while "arrayValue" in value:
        (value,) = value["arrayValue"]["values"]
        levels += 1
    assert (levels, value) == (40, {"stringValue": "core"})
