"""verl's agent-loop phases as spans, shared by every trainer: each turn's generation (on verl's own
``simple_timer`` measurement, named and filled in by the LLM server client's call), each tool call, and the
reward (``compute_score``)."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Generator, Sequence
from contextlib import AbstractContextManager
from typing import Any, cast

from ... import semconv as sc
from ...core import _context
from ...core._guard import internal_error
from ...core._lifecycle import finish
from ...core._phase import PhaseSpec, start
from ...core._scope import OpenSpan, span_of
from .._patching import Args, AsyncOriginal, Kwargs, awaited_in
from . import _patching as patching
from . import _segments
from ._objects import Scored

_TOOL_CALLS = PhaseSpec(sc.TOOL_CALLS, sc.TOOL_CALLS_SPAN, {sc.RL_PHASE: sc.TOOL_CALLS})
_GENERATE_TURN = PhaseSpec.build(sc.GENERATE)
_TURN: contextvars.ContextVar[Any] = contextvars.ContextVar("otel_agentloop_turn_span", default=None)


def traced_timer(original: Callable[..., AbstractContextManager[object]]) -> Callable[..., object]:
    """verl's ``simple_timer`` with our phase span on verl's own measurement: the span starts just inside verl's
    timer and gets verl's measured duration (what verl adds to ``timing_raw``), so spans and verl's
    AgentLoopMetrics agree exactly, whatever the GIL does between the two clocks. ``tool_calls``: the
    ``rl.tool_calls`` span (around the turn's ``asyncio.gather``); ``generate_sequences``: the turn's generation
    span (the client call names it and fills in its GenAI facts); ``compute_score``: the duration is handed to
    the enclosing ``rl.reward`` span."""

    @contextlib.contextmanager
    def simple_timer(name: str, timing_raw: Any) -> Generator[None, None, None]:
        if not patching.state.active or name not in _TIMED:
            with original(name, timing_raw):
                yield
            return
        before = _timed(timing_raw, name)
        started = token = None
        error: BaseException | None = None
        try:
            with original(name, timing_raw):
                if name != sc.COMPUTE_SCORE:
                    started = start(_TOOL_CALLS if name == sc.TOOL_CALLS else _GENERATE_TURN)
                    if started is not None and name == sc.GENERATE:
                        token = _TURN.set(span_of(started))
                try:
                    yield
                except BaseException as exc:
                    error = exc
                    raise
                finally:
                    if token is not None:
                        _TURN.reset(token)
        finally:
            elapsed = _timed(timing_raw, name) - before  # 0 when verl recorded nothing (an exception)
            if name == sc.COMPUTE_SCORE:
                holder = _SCORE_TIMER.get()
                if holder is not None and elapsed > 0:
                    holder.append(elapsed)
            elif started is not None:
                end_span(started, error, elapsed)

    simple_timer.__wrapped__ = original  # type: ignore[attr-defined]
    return simple_timer


_TIMED = (sc.GENERATE, sc.TOOL_CALLS, sc.COMPUTE_SCORE)
_SCORE_TIMER: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar(
    "otel_agentloop_score_timer", default=None
)


def _timed(timing_raw: Any, name: str) -> float:
    try:
        return float(timing_raw.get(name, 0.0))
    except Exception:
        return 0.0


def end_span(started: OpenSpan, error: BaseException | None, elapsed: float) -> None:
    """End ``started`` lasting ``elapsed`` seconds as verl measured it (now, when verl measured nothing)."""
    if elapsed <= 0 or error is not None:
        finish(started, error)
        return
    end_time = None
    try:
        begin = getattr(span_of(started), "start_time", None)
        end_time = begin + int(elapsed * 1e9) if begin else None
    except Exception:
        internal_error("verl.timer.end")
    finish(started, None, end_time)  # through the lifecycle: the in-flight registry forgets the phase


def _spec(cache: dict[str, PhaseSpec], key: str, build: Callable[[], PhaseSpec]) -> PhaseSpec:
    spec = cache.get(key)
    if spec is None:
        spec = cache[key] = build()
    return spec


_generate_specs: dict[str, PhaseSpec] = {}
_tool_specs: dict[str, PhaseSpec] = {}
_REWARD = PhaseSpec.build(sc.COMPUTE_SCORE)


_IN_GENERATE: contextvars.ContextVar[bool] = contextvars.ContextVar("otel_agentloop_in_generate", default=False)


async def generate(original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    """One generation span per turn: ``FullyAsyncLLMServerClient.generate`` (resuming aborted requests) calls
    the base client's, which then adds no span of its own: each such call is one engine attempt of the turn
    (:mod:`._segments`)."""
    if _IN_GENERATE.get():
        attempts = _segments.in_turn()
        if attempts is None:
            return await original(*args, **kwargs)
        return await _segments.attempt(attempts, original, args, kwargs)
    token = _IN_GENERATE.set(True)
    try:
        return await _generate_span(original, args, kwargs)
    finally:
        _IN_GENERATE.reset(token)


async def _generate_span(original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    config = getattr(args[0], "config", None) if args else None
    try:
        model = str(config.actor_rollout_ref.model.get("path", "")) if config is not None else ""
    except Exception:
        model = ""
    spec = _spec(_generate_specs, model, lambda: PhaseSpec.build(sc.GENERATE, model=model.rsplit("/", 1)[-1] or None))
    try:
        provider = str(config.actor_rollout_ref.rollout.name) if config is not None else None
    except Exception:
        provider = None
    turn = _TURN.get()
    if turn is not None:  # verl's generate_sequences timer opened this turn's span: name it and fill it in
        _TURN.set(None)
        try:
            turn.update_name(spec.name)
            for key, value in spec.attributes.items():
                turn.set_attribute(key, value)
            if provider:
                turn.set_attribute(sc.GEN_AI_PROVIDER_NAME, provider)
        except Exception:
            internal_error("verl.generate.name")
        output = await _segments.turn_attempts(turn, lambda: original(*args, **kwargs))
        _record_generation(turn, output, kwargs)
        return output
    started = start(spec, extra={sc.GEN_AI_PROVIDER_NAME: provider} if provider else None)
    if started is None:
        return await original(*args, **kwargs)
    span = span_of(started)
    output = await awaited_in(started, _segments.turn_attempts, (span, lambda: original(*args, **kwargs)), {})
    _record_generation(span, output, kwargs)
    finish(started)
    return output


def _record_generation(span: Any, output: Any, kwargs: dict[str, Any]) -> None:
    try:
        prompt_ids = kwargs.get("prompt_ids")
        if prompt_ids is not None:
            span.set_attribute(sc.GEN_AI_USAGE_INPUT_TOKENS, len(prompt_ids))
        span.set_attribute(sc.GEN_AI_USAGE_OUTPUT_TOKENS, len(output.token_ids))
        if output.stop_reason is not None:
            span.set_attribute(sc.GEN_AI_RESPONSE_FINISH_REASONS, (str(output.stop_reason),))
        if output.num_preempted is not None:
            span.set_attribute(sc.RL_NUM_PREEMPTED, int(output.num_preempted))
        version = (output.extra_fields or {}).get("global_steps")
        if version is not None:
            span.set_attribute(sc.RL_POLICY_VERSION, int(version))
            _segments.note_versions(int(version))
    except Exception:
        internal_error("verl.generate.record")


async def call_tool(original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    tool_call = args[1] if len(args) > 1 else kwargs.get("tool_call")
    name = str(getattr(tool_call, "name", "") or "unknown")
    spec = _spec(_tool_specs, name, lambda: PhaseSpec.build(sc.TOOL_CALLS, tool=name))
    call_id = getattr(tool_call, "id", None)
    started = start(spec, extra={sc.GEN_AI_TOOL_CALL_ID: str(call_id)} if call_id else None)
    result = await awaited_in(started, original, args, kwargs)
    if started is not None:
        finish(started)
    return result


async def compute_score(original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    started = start(_REWARD)
    holder: list[float] = []
    token = _SCORE_TIMER.set(holder)
    try:
        result = await awaited_in(started, original, args, kwargs)
    finally:
        _SCORE_TIMER.reset(token)
    if started is None:
        return result
    try:
        outputs = cast("Sequence[Scored] | None", args[1] if len(args) > 1 else kwargs.get("outputs"))
        score = outputs[-1].reward_score if outputs else None
        if score is not None:
            span_of(started).set_attribute(sc.RL_REWARD_SCORE, float(score))
            _context.record_sample(reward=score)
    except Exception:
        internal_error("verl._compute_score.record")
    end_span(started, None, sum(holder))  # verl's compute_score timer, when it ran (no reward handles: now)
    return result
