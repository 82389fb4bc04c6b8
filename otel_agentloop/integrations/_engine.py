"""The carrier between a generation turn and an inference engine, shared by every engine integration.

- :func:`trace_headers`: the W3C ``traceparent`` (and ``tracestate``) of the current span, the turn, as a dict
  to hand to the engine (vLLM's ``AsyncLLM.generate(trace_headers=...)``, an HTTP request's headers, SGLang's
  ``external_trace_header``). The sampled flag is our sampling decision: an unsampled sample sends ``00`` and
  the engine records no span for it. Headers are always sent for a valid span, sampled or not: without them
  vLLM would start a root span of its own for the request. Outside any span: ``{}``.
- :func:`turn_span`: the generation turn an engine request belongs to, also when the user wrapped the engine
  call in a span of their own (a retry or timeout helper): engine numbers go on the turn, never on that span.
- :func:`record_attributes`: an engine's per-request numbers (read by that engine's own reader:
  ``integrations.vllm._output``, SGLang's) onto the turn span; :func:`seconds` and :func:`count` are the
  checks every reader applies to a value. :func:`record_openai_response`: the same from an OpenAI-compatible
  response body (usage, id, finish reasons; no timing, the server does not return it).

No engine is imported here: outputs are read by attribute. Nothing raises into the caller (an error is
logged once); with tracing off each call is one check.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from .. import semconv as sc
from ..core._context import current_sample
from ..core._guard import internal_error, safe_str
from ..core._record import span_ids
from ..core._scope import span_of

__all__ = ["count", "record_attributes", "record_openai_response", "seconds", "trace_headers", "turn_span"]


def trace_headers(span: Span | None = None) -> dict[str, str]:
    """``{"traceparent": ...}`` (+ ``"tracestate"``) of ``span``, by default the current span; ``{}`` outside any
    valid span."""
    try:
        target = trace.get_current_span() if span is None else span
        ids = span_ids(target)  # a record's from its fields (no SpanContext built)
        if ids is None:
            return {}
        trace_id, span_id, flags, state = ids
        headers = {"traceparent": f"00-{trace_id:032x}-{span_id:016x}-{flags & 1:02x}"}
        if state:
            headers["tracestate"] = state.to_header()
        return headers
    except Exception:
        internal_error("trace_headers")
        return {}


def seconds(value: object) -> float | None:
    """A non-negative finite duration in seconds, else ``None`` (vLLM leaves unset timestamps at 0)."""
    if type(value) is not float and type(value) is not int:
        return None
    value = float(value)
    return value if 0.0 <= value < float("inf") else None


def count(value: object) -> int | None:
    """A non-negative ``int`` (not a ``bool``), else ``None``."""
    return value if type(value) is int and value >= 0 else None


def turn_span() -> Span:
    """The generation turn the engine request belongs to: the current span when it is a generation phase span,
    else the current sample's most recently started open generation phase span (the user wrapped the engine
    call in a span of their own: a retry or timeout helper), else the current span. Never raises."""
    current = trace.get_current_span()
    try:
        if _phase_of(current) == sc.GENERATE:
            return current
        handle = current_sample()
        tracked = handle.tracked_sample if handle is not None else None
        phases = getattr(tracked.registry, "_phases", None) if tracked is not None and tracked.tracked else None
        if phases:
            for scope in reversed(list(phases)):  # start order: the latest first
                if scope.sample is tracked and scope.phase == sc.GENERATE:
                    span = span_of(scope)
                    if span.is_recording():
                        return span
    except Exception:
        internal_error("turn_span")
    return current


def _phase_of(span: Span) -> object:
    attrs = getattr(span, "attributes", None)
    return attrs.get(sc.RL_PHASE) if attrs is not None else None


def record_attributes(attrs: Mapping[str, AttributeValue], span: Span | None = None) -> None:
    """Put engine numbers (already read and checked by an engine's reader) on ``span``, by default the turn
    (:func:`turn_span`). A no-op when that span is not recording; never raises."""
    try:
        target = turn_span() if span is None else span
        if target.is_recording():
            target.set_attributes(attrs)
    except Exception:
        internal_error("record_engine_output")


def record_openai_response(body: object, *, engine: str = "vllm", span: Span | None = None) -> None:
    """An OpenAI-compatible ``/v1/completions`` or ``/v1/chat/completions`` response body (the parsed JSON
    mapping) on ``span``, by default the turn (:func:`turn_span`): ``usage.prompt_tokens``/``completion_tokens``,
    ``id``, each choice's ``finish_reason``. A no-op when not recording; never raises."""
    if not isinstance(body, Mapping):
        return
    try:
        attrs: dict[str, AttributeValue] = {sc.RL_ENGINE_NAME: engine}
        if body.get("id") is not None:
            attrs[sc.GEN_AI_RESPONSE_ID] = safe_str(body["id"], 256)
        usage = body.get("usage")
        if isinstance(usage, Mapping):
            for key, name in (
                (sc.GEN_AI_USAGE_INPUT_TOKENS, "prompt_tokens"),
                (sc.GEN_AI_USAGE_OUTPUT_TOKENS, "completion_tokens"),
            ):
                value = usage.get(name)
                if type(value) is int and value >= 0:
                    attrs[key] = value
        choices = body.get("choices")
        if isinstance(choices, list):
            reasons = [
                safe_str(c["finish_reason"], 256) for c in choices if isinstance(c, Mapping) and c.get("finish_reason")
            ]
            if reasons:
                attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] = tuple(reasons)
    except Exception:
        internal_error("record_openai_response")
        return
    record_attributes(attrs, span)
