"""Issue 26: one value boundary on both span paths. Every user value written to a span (attributes, event and
link attributes, timestamps, keys) is checked, converted and limited the moment it is written, as the SDK does,
and a bad value never costs its span. Spans go through the real gRPC exporter to a loopback OTLP receiver; the
fast path's export is compared with the SDK path's field by field where the SDK exports."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanContext, TraceFlags, TraceState

import otel_agentloop as oal
from tests._support.both_paths import PATHS, assert_same, attrs, both, export, strings


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no str")


# -- 1: a bad value written inside a phase never costs the span ----------------------------------------------
def _self_list() -> list[Any]:
    value: list[Any] = [1]
    value.append(value)
    return value


WRITES: dict[str, Callable[[trace.Span], None]] = {
    "str raises": lambda span: span.set_attribute("k", Unprintable()),  # type: ignore[arg-type]
    "a list that contains itself": lambda span: span.set_attribute("k", _self_list()),
    "in an event": lambda span: span.add_event("e", {"k": Unprintable()}),  # type: ignore[dict-item]
}


@pytest.mark.parametrize("fast", PATHS)
@pytest.mark.parametrize("write", list(WRITES))
def test_a_bad_value_written_in_a_tool_keeps_the_span_and_its_time(monkeypatch, fast, write) -> None:
    raised: list[BaseException] = []

    @oal.trace_tool("t")
    def tool() -> int:
        time.sleep(0.03)
        try:
            WRITES[write](trace.get_current_span())
        except Exception as exc:  # the SDK's own span raises from its own call (not wrapped); ours never does
            raised.append(exc)
        return 1

    def scenario(handle: oal.Handle) -> dict[str, float]:
        with oal.step(1), oal.sample(0):
            assert tool() == 1
        return handle.metrics.collect(1)

    run = export(fast, scenario, monkeypatch)
    assert run.result["agent_loop/tool_calls/max"] >= 0.025
    assert run.stats["exported"] == len(run.spans) and run.stats["failed"] == run.stats["dropped"] == 0, run.stats
    span = run.spans["execute_tool t"]
    if not fast:
        return
    assert not raised
    if write == "in an event":
        (event,) = span.events
        assert {kv.key: kv.value.string_value for kv in event.attributes} == {"k": "<unprintable Unprintable>"}
    else:
        expected = "<unprintable Unprintable>" if write == "str raises" else str(_self_list())
        assert attrs(span)["k"] == {"stringValue": expected}


# -- 2: the limits apply as values are written (the memory test: tests/core/test_open_span_memory.py) -------------
def test_attribute_and_event_count_limits_apply_while_the_span_is_open(monkeypatch) -> None:
    def scenario(handle: oal.Handle) -> None:
        @oal.trace_tool("busy")
        def busy() -> None:
            span = trace.get_current_span()
            for i in range(60):
                span.set_attribute(f"user.{i}", i)
                span.add_event(f"e{i}", {"i": i})

        with oal.step(1), oal.sample(0):
            busy()

    runs = both(monkeypatch=monkeypatch, scenario=scenario, OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT="24")
    runs_events = both(monkeypatch=monkeypatch, scenario=scenario, OTEL_SPAN_EVENT_COUNT_LIMIT="5")
    for result in (runs, runs_events):
        assert_same(result)
    busy = runs[True].spans["execute_tool busy"]
    assert len(busy.attributes) == 24 + 16 and busy.dropped_attributes_count > 20  # + the library's room
    assert "rl.sample.index" in attrs(busy)  # identity written back, as on the SDK path
    events = runs_events[True].spans["execute_tool busy"]
    assert [e.name for e in events.events] == [f"e{i}" for i in range(55, 60)]  # the newest kept
    assert events.dropped_events_count == 55


# -- 3: a float (or impossible) event timestamp keeps the span ------------------------------------------------
@pytest.mark.parametrize("fast", PATHS)
def test_a_float_event_timestamp_keeps_the_span(monkeypatch, fast) -> None:
    given = time.time()  # seconds, as a float: read as nanoseconds, the API's unit

    @oal.trace_tool("t")
    def tool() -> None:
        span = trace.get_current_span()
        span.add_event("tick", timestamp=given)  # type: ignore[arg-type]
        span.add_event("nan", timestamp=float("nan"))  # type: ignore[arg-type]
        span.add_event("text", timestamp="now")  # type: ignore[arg-type]
        span.add_event("numpy", timestamp=np.int64(1_700_000_000_000_000_000))  # type: ignore[arg-type]

    def scenario(handle: oal.Handle) -> None:
        with oal.step(1), oal.sample(0):
            tool()

    run = export(fast, scenario, monkeypatch)
    assert run.stats["exported"] == len(run.spans) and run.stats["failed"] == run.stats["dropped"] == 0, run.stats
    span = run.spans["execute_tool t"]
    times = {e.name: e.time_unix_nano for e in span.events}
    assert times["tick"] == int(given)
    assert times["numpy"] == 1_700_000_000_000_000_000
    for name in ("nan", "text"):  # the time of the call (fast path) or the span's end (an SDK span's event)
        assert span.start_time_unix_nano <= times[name] <= span.end_time_unix_nano, name


# -- 4: nested strings and numpy.str_ in attributes= are cut to the length limit on both paths ---------------
def test_nested_and_numpy_strings_in_attributes_are_cut_on_both_paths(monkeypatch) -> None:
    given = {
        "tuple": ("x" * 1000, "y"),
        "list": ["z" * 1000, ["n" * 1000]],
        "dict": {"s": "w" * 1000, "inner": {"t": "v" * 1000}},
        "numpy": np.str_("u" * 1000),
    }

    def scenario(handle: oal.Handle) -> None:
        @oal.phase("generate", attributes={f"phase.{k}": v for k, v in given.items()})
        def gen() -> None:
            pass

        step_attrs = {f"step.{k}": v for k, v in given.items()}
        sample_attrs = {f"sample.{k}": v for k, v in given.items()}
        with oal.step(1, attributes=step_attrs), oal.sample(0, attributes=sample_attrs):  # type: ignore[arg-type]
            gen()

    runs = both(scenario, monkeypatch, OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT="100")
    assert_same(runs)
    for name, span in runs[True].spans.items():
        values = attrs(span)
        prefix = {"rl.step": "step.", "rl.sample": "sample."}.get(name, "phase.")
        assert {prefix + k for k in given} <= set(values), name
        texts = [t for value in values.values() for t in strings(value)]
        assert texts and max(len(t) for t in texts) == 100, name


# -- 5: invalid keys are dropped and counted as the SDK does ------------------------------------------------
def test_invalid_attribute_keys_are_dropped_and_counted_as_the_sdk_does(monkeypatch) -> None:
    def scenario(handle: oal.Handle) -> None:
        @oal.trace_tool("keys")
        def keys() -> None:
            span = trace.get_current_span()
            span.set_attribute("", 1)
            span.set_attribute(5, 2)  # type: ignore[arg-type]
            span.set_attribute(None, 3)  # type: ignore[arg-type]
            span.set_attribute("map", {"": 1, "ok": 2, 7: "seven"})  # type: ignore[dict-item]
            span.set_attributes({5: "five", "": "empty", "fine": True})  # type: ignore[dict-item]

        with oal.step(1), oal.sample(0):
            keys()

    runs = both(scenario, monkeypatch)
    assert_same(runs)
    span = runs[True].spans["execute_tool keys"]
    values = attrs(span)
    assert "" not in values and values["5"] == {"stringValue": "five"} and values["fine"] == {"boolValue": True}
    assert values["map"] == {
        "kvlistValue": {
            "values": [{"key": "ok", "value": {"intValue": "2"}}, {"key": "7", "value": {"stringValue": "seven"}}]
        }
    }
    assert span.dropped_attributes_count == 4  # "", 5 and None by set_attribute; "" by set_attributes


# -- 6: events and links: their attribute limits, dropped counts, invalid contexts, the link count limit ------
def test_event_and_link_limits_and_counts_match_the_sdk(monkeypatch) -> None:
    def linked(n: int, state: TraceState | None = None) -> SpanContext:
        return SpanContext(0xABC + n, 0xDEF + n, is_remote=True, trace_flags=TraceFlags(1), trace_state=state)

    def scenario(handle: oal.Handle) -> None:
        @oal.trace_tool("links")
        def links() -> None:
            span = trace.get_current_span()
            span.add_event("e", {f"k{i}": "x" * 50 for i in range(5)})
            for n in range(3):
                span.add_link(linked(n), {f"a{i}": "y" * 50 for i in range(4)})
            span.add_link(SpanContext(0, 0, is_remote=False), {"why": "kept"})  # invalid, with attributes
            span.add_link(SpanContext(0, 0, is_remote=False))  # invalid, bare: left out
            span.add_link(linked(9))

        with oal.step(1), oal.sample(0):
            links()

    env = {
        "OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT": "2",
        "OTEL_LINK_ATTRIBUTE_COUNT_LIMIT": "2",
        "OTEL_SPAN_LINK_COUNT_LIMIT": "3",
        "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "10",
    }
    runs = both(scenario, monkeypatch, **env)
    assert_same(runs)
    span = runs[True].spans["execute_tool links"]
    (event,) = span.events
    assert [kv.key for kv in event.attributes] == ["k3", "k4"] and event.dropped_attributes_count == 3
    assert all(len(kv.value.string_value) == 10 for kv in event.attributes)
    assert span.dropped_links_count == 2  # five links kept by the SDK's rule, the newest three of them here
    first, invalid, last = span.links
    assert [kv.key for kv in first.attributes] == ["a2", "a3"] and first.dropped_attributes_count == 2
    assert all(len(kv.value.string_value) == 10 for kv in first.attributes)
    assert not invalid.trace_id.strip(b"\0") and [kv.key for kv in invalid.attributes] == ["why"]
    assert int.from_bytes(last.trace_id, "big") == 0xABC + 9
