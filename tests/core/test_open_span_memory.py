"""Issue 26: an open span's memory is bounded by the span limits, whatever the user writes to it. 1,000,000
``add_event`` calls or distinct ``set_attribute`` keys on one open phase span (the fast path, the default) grow
the traced Python memory by less than :data:`BOUND` while the span is open, once the first writes have filled
the limits (the defaults keep 128 events, and 128 + 16 attributes): +9 KiB and +22 KiB measured; +330 MB and
+122 MB before the limits applied as values are written."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable

import pytest
from opentelemetry import trace

import otel_agentloop as oal
from otel_agentloop import testing

N = 1_000_000
BOUND = 1 << 20  # bytes: 1 MiB


def _events(span: trace.Span, start: int, n: int) -> None:
    for i in range(start, start + n):
        span.add_event("token", {"i": i})


def _attributes(span: trace.Span, start: int, n: int) -> None:
    for i in range(start, start + n):
        span.set_attribute(f"user.key.{i}", i)


@pytest.mark.slow  # a million writes: 14-28 s each at load 7
@pytest.mark.parametrize("write", [_events, _attributes], ids=["events", "attributes"])
def test_a_million_writes_on_one_open_span_stay_within_the_limits_memory(write: Callable[..., None]) -> None:
    growth: list[int] = []

    @oal.trace_tool("long")
    def tool() -> None:
        span = trace.get_current_span()
        write(span, 0, 1000)  # the first writes fill the limits: what the span may hold
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            write(span, 1000, N)
            gc.collect()
            growth.append(tracemalloc.get_traced_memory()[0] - before)
        finally:
            tracemalloc.stop()

    with testing.capture() as captured:
        with oal.step(1), oal.sample(0):
            tool()
        (span,) = captured.by_name("execute_tool long")
    print(f"{N:,} {write.__name__[1:]} on one open span: {growth[0] / 1024:+.1f} KiB")
    assert growth[0] < BOUND, f"+{growth[0] / 1e6:.1f} MB on one open span"
    if write is _events:
        assert len(span.events) == 128 and span.dropped_events == N + 1000 - 128
        assert span.events[-1].attributes == {"i": N + 999}  # the newest kept
    else:
        assert f"user.key.{N + 999}" in span.attributes and span.dropped_attributes > N
        assert span.attributes["rl.sample.index"] == 0  # the identity written back at the end
