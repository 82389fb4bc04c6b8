"""Partial rollouts: verl fully-async's ``FullyAsyncLLMServerClient.generate`` resumes a turn aborted by a weight
sync by calling the base client's ``generate`` again (prompt + tokens so far). Each such call is one engine
attempt of the turn (DESIGN-36).

Contract:

- The outer ``generate`` (the turn) opens a :class:`Attempts` record (:func:`turn_attempts`); each nested base
  ``generate`` is one attempt (:func:`attempt`). The engine numbers an attempt brings back
  (``_engine_path._received``) go to that attempt (:func:`take_numbers`), not onto the turn.
- Attempt 0 runs under the turn span (the turn's ``traceparent`` reaches the engine: whether it will be
  aborted is not known yet). A turn whose one attempt finished gets that attempt's numbers on the turn, as
  before, and **no segment span**.
- Once an attempt is aborted, every attempt is a ``rl.engine.segment`` span (INTERNAL), child of the turn:
  attempt 0's is written when its abort is seen (its start and end are the attempt's); from attempt 1 on the
  segment is opened before the call and is current during it, so the engine request's ``traceparent`` is the
  segment's and vLLM's ``llm_request`` nests under it. Each carries ``rl.engine.segment.index``,
  ``rl.engine.policy_version`` (verl's ``global_steps`` the attempt ran under), ``rl.engine.finish``
  (``aborted``/``finished``, from verl's ``stop_reason``) and the attempt's engine numbers; its output tokens
  are the tokens verl merged from that attempt, its input tokens the prompt that attempt sent.
- The turn then carries ``rl.engine.segments``, ``rl.engine.policy_versions`` (distinct, in order) and the
  attempts' engine numbers combined (:func:`combine`: seconds, preemptions, cached tokens and iterations
  summed, time to first token the first attempt's, load maxima the largest, running mean weighted by
  iterations, the rest the last attempt's); its token counts are verl's (the sum of its segments').
- The sample span gets ``rl.sample.staleness`` (newest policy version its turns ran under minus the oldest),
  with ``rl.policy.version.min``/``max``.

Nothing raises into verl (an error is logged once); verl's result is never changed.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from ... import semconv as sc
from ...core._context import current_sample
from ...core._errors import mark_error
from ...core._guard import internal_error
from ...core._tracer import current_tracer
from .._patching import Args, AsyncOriginal, Kwargs

ABORTED_STOPS = ("aborted", "abort")
"""verl's ``stop_reason`` of an attempt the server aborted (what its resume loop retries on)."""
_SUMMED = (
    sc.RL_ENGINE_QUEUE_S,
    sc.RL_ENGINE_PREFILL_S,
    sc.RL_ENGINE_DECODE_S,
    sc.RL_ENGINE_PREEMPTIONS,
    sc.RL_NUM_PREEMPTED,
    sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    sc.RL_ENGINE_ITERATIONS,
)
_MAXED = (sc.RL_ENGINE_BATCH_RUNNING_MAX, sc.RL_ENGINE_BATCH_WAITING_MAX, sc.RL_ENGINE_KV_CACHE_USAGE_MAX)
_FIRST = (sc.RL_ENGINE_TTFT_S,)


class Attempt:
    """One engine attempt: the numbers the engine brought back for it (``None``: none came)."""

    __slots__ = ("numbers",)

    def __init__(self) -> None:
        self.numbers: dict[str, AttributeValue] | None = None


class Attempts:
    """The attempts of one turn so far: their segment attributes (one dict per attempt) and whether one was
    aborted (then every attempt is a segment span)."""

    __slots__ = ("aborted", "segments", "turn")

    def __init__(self, turn: Span) -> None:
        self.turn = turn
        self.segments: list[dict[str, AttributeValue]] = []
        self.aborted = False


_ATTEMPTS: contextvars.ContextVar[Attempts | None] = contextvars.ContextVar("otel_agentloop_attempts", default=None)
_ATTEMPT: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar("otel_agentloop_attempt", default=None)


def take_numbers(numbers: Mapping[str, AttributeValue]) -> bool:
    """Give an engine call's numbers to the attempt running in this context; ``False`` (the caller puts them on
    the current span) outside an attempt."""
    current = _ATTEMPT.get()
    if current is None:
        return False
    current.numbers = dict(numbers)
    return True


def in_turn() -> Attempts | None:
    """The attempts record of the turn whose ``generate`` is running in this context, if any."""
    return _ATTEMPTS.get()


async def turn_attempts(turn: Span, call: Callable[[], Awaitable[Any]]) -> Any:
    """Run the turn's ``generate`` (``call``) with an attempts record; afterwards, when it had segments, write
    the turn's combined attributes (before verl's own numbers are recorded on it)."""
    attempts = Attempts(turn)
    token = _ATTEMPTS.set(attempts)
    try:
        output = await call()
    finally:
        _ATTEMPTS.reset(token)
    try:
        if attempts.aborted:
            turn.set_attributes(turn_attributes(attempts.segments))
    except Exception:
        internal_error("verl.segments.turn")
    return output


async def attempt(attempts: Attempts, original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    """One engine attempt of ``attempts``' turn (the base client's ``generate``); see the module."""
    index = len(attempts.segments)
    segment: Span | None = None
    tracer = current_tracer()
    if attempts.aborted and tracer is not None:
        try:
            segment = tracer.start_span(sc.ENGINE_SEGMENT_SPAN, context=trace.set_span_in_context(attempts.turn))
        except Exception:
            internal_error("verl.segments.open")
    start_ns = time.time_ns()
    record = Attempt()
    token = _ATTEMPT.set(record)
    try:
        if segment is not None:
            with trace.use_span(segment, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                output = await original(*args, **kwargs)
        else:
            output = await original(*args, **kwargs)
    except BaseException as exc:
        if segment is not None:
            _fail(segment, exc)
        raise
    finally:
        _ATTEMPT.reset(token)
    try:
        attrs = segment_attributes(index, record.numbers, output, kwargs)
        attempts.segments.append(attrs)
        aborted = attrs.get(sc.RL_ENGINE_FINISH) == sc.ENGINE_ABORTED
        if segment is not None:
            segment.set_attributes(attrs)
            segment.end()
        elif aborted and tracer is not None:  # the first abort: attempt 0 becomes a segment, after the fact
            attempts.aborted = True
            context = trace.set_span_in_context(attempts.turn)
            late = tracer.start_span(sc.ENGINE_SEGMENT_SPAN, context=context, attributes=attrs, start_time=start_ns)
            late.end()
        elif record.numbers:  # one attempt, finished: the turn carries its numbers, as without segments
            attempts.turn.set_attributes(record.numbers)
        attempts.aborted = attempts.aborted or aborted
        note_versions(attrs.get(sc.RL_ENGINE_POLICY_VERSION))
    except Exception:
        internal_error("verl.segments.attempt")
    return output


def _fail(segment: Span, exc: BaseException) -> None:
    try:
        mark_error(segment, exc)  # cancellation is noted, not an error
        segment.end()
    except Exception:
        internal_error("verl.segments.error")


def segment_attributes(
    index: int, numbers: Mapping[str, AttributeValue] | None, output: Any, kwargs: Mapping[str, Any]
) -> dict[str, AttributeValue]:
    """One attempt's segment attributes: the sample's identity (``rl.step``, ``rl.sample.index``, ...), the
    engine's numbers, then verl's facts of the attempt (index, policy version, how it ended, its tokens)."""
    handle = current_sample()
    attrs: dict[str, AttributeValue] = dict(handle.phase_attributes) if handle is not None else {}
    attrs.update(numbers or {})
    attrs[sc.RL_ENGINE_SEGMENT_INDEX] = index
    extra = getattr(output, "extra_fields", None)
    version = extra.get("global_steps") if isinstance(extra, Mapping) else None
    if type(version) is int:
        attrs[sc.RL_ENGINE_POLICY_VERSION] = version
    stop = getattr(output, "stop_reason", None)
    attrs[sc.RL_ENGINE_FINISH] = sc.ENGINE_ABORTED if stop in ABORTED_STOPS else sc.ENGINE_FINISHED
    tokens = getattr(output, "token_ids", None)
    if isinstance(tokens, list):
        attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = len(tokens)
    prompt = kwargs.get("prompt_ids")
    if isinstance(prompt, list):
        attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] = len(prompt)
    return attrs


def turn_attributes(segments: list[dict[str, AttributeValue]]) -> dict[str, AttributeValue]:
    """The turn's attributes from its segments' (:func:`combine`), with the segment count and policy versions.
    Token counts are left to verl's merged output (recorded on the turn afterwards)."""
    attrs = combine(segments)
    for key in (sc.RL_ENGINE_SEGMENT_INDEX, sc.RL_ENGINE_POLICY_VERSION, sc.GEN_AI_USAGE_INPUT_TOKENS):
        attrs.pop(key, None)
    attrs[sc.RL_ENGINE_SEGMENTS] = len(segments)
    versions: list[int] = []
    for segment in segments:
        version = segment.get(sc.RL_ENGINE_POLICY_VERSION)
        if type(version) is int and version not in versions:
            versions.append(version)
    if versions:
        attrs[sc.RL_ENGINE_POLICY_VERSIONS] = tuple(versions)
    return attrs


def combine(segments: list[dict[str, AttributeValue]]) -> dict[str, AttributeValue]:
    """Attempts' engine numbers as one request's: see the module (values of the wrong type are skipped)."""
    out: dict[str, AttributeValue] = {}
    for segment in segments:
        out.update(segment)  # the last attempt's by default
    for key in _SUMMED:
        values = _numbers(segments, key)
        if values:
            out[key] = sum(values)
    for key in _MAXED:
        values = _numbers(segments, key)
        if values:
            out[key] = max(values)
    for key in _FIRST:
        values = _numbers(segments, key)
        if values:
            out[key] = values[0]
    pairs = [_numbers([s], sc.RL_ENGINE_BATCH_RUNNING_MEAN) + _numbers([s], sc.RL_ENGINE_ITERATIONS) for s in segments]
    weighted = [(p[0], p[1]) for p in pairs if len(p) == 2]
    total = sum(n for _, n in weighted)
    if total:
        out[sc.RL_ENGINE_BATCH_RUNNING_MEAN] = float(sum(m * n for m, n in weighted) / total)
    return out


def _numbers(segments: list[dict[str, AttributeValue]], key: str) -> list[int | float]:
    """``key``'s non-negative numbers over ``segments``, in order (a bool, text or negative value skipped)."""
    out: list[int | float] = []
    for segment in segments:
        value = segment.get(key)
        if (type(value) is int or type(value) is float) and value >= 0:
            out.append(value)
    return out


def note_versions(version: AttributeValue | None) -> None:
    """Widen the current sample's policy versions by ``version``; its staleness is their spread."""
    if type(version) is not int:
        return
    handle = current_sample()
    span = handle.span if handle is not None else None
    if span is None or not span.is_recording():
        return
    attrs = getattr(span, "attributes", None) or {}
    low, high = attrs.get(sc.RL_POLICY_VERSION_MIN), attrs.get(sc.RL_POLICY_VERSION_MAX)
    low = version if type(low) is not int else min(low, version)
    high = version if type(high) is not int else max(high, version)
    span.set_attributes(
        {sc.RL_POLICY_VERSION_MIN: low, sc.RL_POLICY_VERSION_MAX: high, sc.RL_SAMPLE_STALENESS: high - low}
    )
