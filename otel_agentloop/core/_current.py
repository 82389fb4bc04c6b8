"""The current step and sample.

Two :class:`contextvars.ContextVar` carry the RL identity (step, validate, sample index, rollout n) to every
phase span started below them. asyncio copies the context into each task (``create_task``, ``gather``) and
``asyncio.to_thread`` copies it into the thread, so the identity survives both; ``loop.run_in_executor`` and
hand-made threads do not copy it: wrap the callable with ``bind``. What reads them lives here (the current
step and sample, facts recorded on the current sample or generation span); the ``step`` and ``sample`` blocks
that set them, with their spans, are ``_context``'s.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from .. import semconv as sc
from ._guard import internal_error, safe_str
from ._scope import TrackedSample
from ._state import TracePer, state
from ._values import coerce_number

content_policy = state.content


class StepState:
    """The active step (immutable once entered)."""

    __slots__ = ("span", "step", "trace_per", "validate")

    def __init__(self, step: int, validate: bool, trace_per: TracePer, span: Span | None) -> None:
        self.step = step
        self.validate = validate
        self.trace_per = trace_per
        self.span = span


class SampleHandle:
    """The active sample: its identity, root span, and the attributes every phase span below it carries."""

    __slots__ = (
        "clock_offset",
        "index",
        "merged",
        "phase_attributes",
        "rollout_n",
        "span",
        "step",
        "tracked_sample",
        "validate",
    )

    def __init__(self, index: int, rollout_n: int | None, step: int | None, validate: bool, span: Span | None):
        self.index = index
        self.rollout_n = rollout_n
        self.step = step
        self.validate = validate
        self.span = span
        attrs: dict[str, AttributeValue] = {sc.RL_SAMPLE_INDEX: index, sc.RL_VALIDATE: validate}
        if step is not None:
            attrs[sc.RL_STEP] = step
        if rollout_n is not None:
            attrs[sc.RL_ROLLOUT_N] = rollout_n
        self.phase_attributes: Mapping[str, AttributeValue] = attrs
        self.merged: dict[object, dict[str, AttributeValue]] = {}
        """Per phase spec: its attributes + this sample's identity (built once per sample, not per span)."""
        self.tracked_sample: TrackedSample | None = None
        """The in-flight registry's record of this sample, ``None`` when not tracked."""
        self.clock_offset: int | None = None
        """The root span's wall-clock start minus its monotonic start (``_clock``): the timeline its phase
        spans share; ``None`` when the sample is not traced."""

    @property
    def trace_id(self) -> str | None:
        """Hex trace id of the sample's root span, or ``None`` when not traced."""
        if self.span is None:
            return None
        return format(self.span.get_span_context().trace_id, "032x")

    def record(
        self,
        *,
        num_preempted: int | None = None,
        prompt_length: int | None = None,
        response_length: int | None = None,
        reward: float | None = None,
        turns: int | None = None,
    ) -> None:
        """Record per-sample facts on the root span (read by the metrics processor when the sample ends).

        ``num_preempted`` set here replaces the value accumulated from generation spans. A value that cannot
        be converted (whatever its conversion raises), or an int outside int64, is dropped with a one-time
        warning; the other fields are kept. Never raises.
        """
        span = self.span
        if span is None:
            return
        try:
            for key, value, kind in (
                (sc.RL_NUM_PREEMPTED, num_preempted, int),
                (sc.RL_PROMPT_LENGTH, prompt_length, int),
                (sc.RL_RESPONSE_LENGTH, response_length, int),
                (sc.RL_REWARD_SCORE, reward, float),
                (sc.RL_NUM_TURNS, turns, int),
            ):
                if value is not None:
                    coerced = coerce_number(value, kind, key)
                    if coerced is not None:
                        span.set_attribute(key, coerced)
        except Exception:
            internal_error("SampleHandle.record")

    def record_content(self, *, prompt: object = None, response: object = None) -> None:
        """Attach prompt/response text to the root span, only when content capture is on
        (``configure(capture_content=True)``); redacted, then truncated to ``max_content_chars``."""
        span = self.span
        if span is None or not content_policy.enabled:
            return
        try:
            for key, value in ((sc.RL_PROMPT_CONTENT, prompt), (sc.RL_RESPONSE_CONTENT, response)):
                if value is not None:
                    cleaned = content_policy.clean(value)
                    if cleaned is not None:
                        span.set_attribute(key, cleaned)
        except Exception:
            internal_error("SampleHandle.record_content")


_STEP: contextvars.ContextVar[StepState | None] = contextvars.ContextVar("otel_agentloop_step", default=None)
_SAMPLE: contextvars.ContextVar[SampleHandle | None] = contextvars.ContextVar("otel_agentloop_sample", default=None)


def current_step() -> StepState | None:
    """The step entered in this context, if any."""
    return _STEP.get()


def current_sample() -> SampleHandle | None:
    """The sample entered in this context, if any."""
    return _SAMPLE.get()


def enter_step_state(state: StepState | None) -> contextvars.Token[StepState | None]:
    """Make ``state`` this context's step (an integration that rebuilds a step elsewhere); returns the token
    for :func:`leave_step_state`."""
    return _STEP.set(state)


def leave_step_state(token: contextvars.Token[StepState | None]) -> None:
    """Undo :func:`enter_step_state` (the step entered before it is this context's step again)."""
    _STEP.reset(token)


def record_sample(**facts: Any) -> None:
    """:meth:`SampleHandle.record` on the current sample; a no-op outside a sample or when tracing is off."""
    handle = _SAMPLE.get()
    if handle is not None:
        try:
            handle.record(**facts)
        except TypeError:
            raise
        except Exception:
            internal_error("record_sample")


def record_generation(
    *,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    finish_reason: str | None = None,
    num_preempted: int | None = None,
) -> None:
    """Record GenAI usage on the current (generation) span. ``num_preempted`` is summed over turns like verl."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    try:
        for key, value in (
            (sc.GEN_AI_USAGE_INPUT_TOKENS, input_tokens),
            (sc.GEN_AI_USAGE_OUTPUT_TOKENS, output_tokens),
            (sc.RL_NUM_PREEMPTED, num_preempted),
        ):
            if value is not None:
                coerced = coerce_number(value, int, key)
                if coerced is not None:
                    span.set_attribute(key, coerced)
        if finish_reason is not None:
            span.set_attribute(sc.GEN_AI_RESPONSE_FINISH_REASONS, (safe_str(finish_reason, 256),))
    except Exception:
        internal_error("record_generation")
