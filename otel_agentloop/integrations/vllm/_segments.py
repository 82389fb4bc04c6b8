"""Engine attempts of one turn, in-process (issue 36, partial rollouts): a turn whose request was aborted (vLLM
``abort()``, a closed stream) or that made more than one engine request gets an ``rl.engine.segment`` span per
attempt, child of the turn, with ``rl.engine.segment.index``, ``rl.engine.finish`` and that attempt's engine
attributes; the turn gets ``rl.engine.segments`` and its output tokens, cached prompt tokens and preemptions
summed over the attempts (the rest is the last attempt's).
A turn with one attempt that finished has no segment span (no extra volume for the common case).

An attempt after the first is known to be a segment when it starts: its span is started then, and the
``traceparent`` sent to the engine is the segment's (vLLM's ``llm_request`` nests under it). The first attempt
is only known to be one when it was aborted or a second one starts: its segment span is written then, with its
own start and end times (its ``llm_request`` stays the turn's child). In-process vLLM knows no policy version:
``rl.engine.policy_version`` is left to the frameworks that have one (verl fully-async).

Bounded: the attempts of at most :data:`MAX_TURNS` turns are remembered (the oldest forgotten).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from ... import semconv as sc
from ...core._guard import internal_error
from ...core._record import span_ids
from ...core._tracer import current_tracer

MAX_TURNS = 4096
"""Turns whose attempts are remembered at once."""

SUMMED = (
    sc.GEN_AI_USAGE_OUTPUT_TOKENS,
    sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    sc.RL_ENGINE_PREEMPTIONS,
    sc.RL_NUM_PREEMPTED,
)
"""Turn attributes that are the sum over its attempts (the others are the last attempt's)."""


class _Turn:
    """What one turn's attempts left: how many, the first one's attributes and times (until its segment span is
    written), and the running sums."""

    __slots__ = ("count", "first", "first_written", "sums")

    def __init__(self) -> None:
        self.count = 0
        self.first: tuple[dict[str, AttributeValue], int, int] | None = None
        self.first_written = False
        self.sums: dict[str, int] = {}


_turns: OrderedDict[tuple[int, int], _Turn] = OrderedDict()


class Attempt:
    """One engine request under a turn: :meth:`start` when the call starts, :meth:`end` with its attributes."""

    __slots__ = ("index", "segment", "start_ns", "state", "turn")

    def __init__(self, turn: Span) -> None:
        self.turn = turn
        self.start_ns = time.time_ns()
        self.segment: Span | None = None
        key = _key(turn)
        state = _turns.get(key) if key is not None else None
        if state is None:
            state = _Turn()
            if key is not None:
                _turns[key] = state
                while len(_turns) > MAX_TURNS:
                    _turns.popitem(last=False)
        self.state = state
        self.index = state.count
        state.count += 1
        if self.index > 0:
            self.segment = _start(turn, self.index, self.start_ns)

    def context_span(self) -> Span:
        """The span whose ``traceparent`` goes to the engine: this attempt's segment, else the turn."""
        return self.segment if self.segment is not None else self.turn

    def end(self, attrs: dict[str, AttributeValue]) -> dict[str, AttributeValue]:
        """The attributes for the turn after this attempt (its own when it is the turn's only one and
        finished); writes the segment spans this attempt makes known. Never raises."""
        try:
            return self._end(attrs)
        except Exception:
            internal_error("vllm.segments")
            return attrs

    def _end(self, attrs: dict[str, AttributeValue]) -> dict[str, AttributeValue]:
        state, now = self.state, time.time_ns()
        for key in SUMMED:
            value = attrs.get(key)
            if type(value) is int:
                state.sums[key] = state.sums.get(key, 0) + value
        aborted = attrs.get(sc.RL_ENGINE_FINISH) == sc.ENGINE_ABORTED
        if self.index == 0:
            state.first = (dict(attrs), self.start_ns, now)
            if not aborted:
                return attrs  # one attempt, finished: no segment span
        if state.first is not None and not state.first_written:
            first, start, end = state.first
            span = _start(self.turn, 0, start)
            if span is not None:
                span.set_attributes(first)
                span.end(end_time=end)
            state.first_written = True
        if self.segment is not None:
            self.segment.set_attributes(attrs)
            self.segment.end(end_time=now)
        turn = {**attrs, **state.sums, sc.RL_ENGINE_SEGMENTS: state.count}
        return turn


def _key(span: Span) -> tuple[int, int] | None:
    ids = span_ids(span)
    return (ids[0], ids[1]) if ids is not None else None


def _start(turn: Span, index: int, start_ns: int) -> Span | None:
    """A segment span of ``turn`` (index ``index``) started at ``start_ns``; ``None`` when tracing is off."""
    tracer = current_tracer()
    if tracer is None:
        return None
    attrs: Mapping[str, AttributeValue] = {sc.RL_ENGINE_SEGMENT_INDEX: index, sc.RL_ENGINE_NAME: "vllm"}
    return tracer.start_span(
        sc.ENGINE_SEGMENT_SPAN,
        context=trace.set_span_in_context(turn),
        kind=trace.SpanKind.INTERNAL,
        attributes=attrs,
        start_time=start_ns,
    )
