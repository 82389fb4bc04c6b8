"""A delay inside the SDK's span start never shifts a span (issue 26): both paths read the start time first.

A sampler that sleeps 60 ms stands for anything that makes ``start_span`` slow (a thread switch, load). With
``fast_path=False`` the SDK read the wall clock after the sampler, so the whole sample moved later: its
children's events fell before their spans started and consecutive samples overlapped.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

import otel_agentloop as oal
from otel_agentloop import testing

DELAY_S = 0.06


class SlowSampler(Sampler):
    """Records every span, after sleeping ``DELAY_S`` in each decision."""

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        time.sleep(DELAY_S)
        return ALWAYS_ON.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        return "SlowSampler"


@oal.trace_generate(model="m")
def generate() -> None:
    trace.get_current_span().add_event("token")


@oal.trace_tool("search")
def search() -> None:
    trace.get_current_span().add_event("query")


def _start(span: ReadableSpan) -> int:
    assert span.start_time is not None
    return span.start_time


def _end(span: ReadableSpan) -> int:
    assert span.end_time is not None
    return span.end_time


@pytest.mark.parametrize("fast_path", [False, True], ids=["sdk-path", "fast-path"])
def test_a_slow_sampler_shifts_no_span(fast_path: bool) -> None:
    with testing.capture(fast_path=fast_path, sampler=SlowSampler()) as captured:
        with oal.step(1):
            for index in range(3):
                with oal.sample(index):
                    generate()
                    search()
        spans = captured.spans()
    by_id = {s.context.span_id: s for s in spans if s.context is not None}
    samples = sorted((s for s in spans if s.name == "rl.sample"), key=_start)
    assert len(samples) == 3
    children = [s for s in spans if s.parent is not None and s.parent.span_id in by_id]
    assert len(children) == 6 and {s.name for s in children} == {"text_completion m", "execute_tool search"}
    for child in children:
        assert child.parent is not None
        parent = by_id[child.parent.span_id]
        assert _start(parent) <= _start(child) <= _end(child) <= _end(parent), (parent.name, child.name)
    events = [(s, e) for s in spans for e in s.events]
    assert len(events) == 6
    for span, event in events:
        assert _start(span) <= event.timestamp <= _end(span), (span.name, event.name)
    for earlier, later in itertools.pairwise(samples):
        assert _end(earlier) <= _start(later), "consecutive samples overlap"
