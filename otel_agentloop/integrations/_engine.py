"""The carrier between a generation turn and an inference engine, shared by every engine integration.

- :func:`trace_headers`: the W3C ``traceparent`` (and ``tracestate``) of the current span, the turn, as a dict
  to hand to the engine (vLLM's ``AsyncLLM.generate(trace_headers=...)``, an HTTP request's headers, SGLang's
  ``external_trace_header``). The sampled flag is our sampling decision: an unsampled sample sends ``00`` and
  the engine records no span for it. Headers are always sent for a valid span, sampled or not: without them
  vLLM would start a root span of its own for the request. Outside any span: ``{}``.
- :func:`record_engine_output`: the engine's per-request numbers on the current (turn) span, read from what the
  engine returns (vLLM's ``RequestOutput`` and its ``metrics``, a ``RequestStateStats``), so they are there
  even when the engine's own tracing is off. :func:`record_openai_response`: the same from an
  OpenAI-compatible response body (usage, id, finish reasons; no timing, the server does not return it).

No engine is imported here: outputs are read by attribute. Nothing raises into the caller (an error is
logged once); with tracing off each call is one check.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from .. import semconv as sc
from ..core._guard import internal_error, safe_str
from ..core._record import span_ids

__all__ = ["engine_attributes", "record_engine_output", "record_openai_response", "trace_headers"]


def trace_headers() -> dict[str, str]:
    """``{"traceparent": ...}`` (+ ``"tracestate"``) of the current span; ``{}`` outside any valid span."""
    try:
        ids = span_ids(trace.get_current_span())  # a record's from its fields (no SpanContext built)
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


def _seconds(value: object) -> float | None:
    """A non-negative finite duration in seconds, else ``None`` (vLLM leaves unset timestamps at 0)."""
    if type(value) is not float and type(value) is not int:
        return None
    seconds = float(value)
    return seconds if 0.0 <= seconds < float("inf") else None


def engine_attributes(output: Any, engine: str = "vllm") -> dict[str, AttributeValue]:
    """The turn attributes of one finished engine output (vLLM ``RequestOutput``-shaped: ``request_id``,
    ``prompt_token_ids``, ``outputs[i].token_ids`` / ``.finish_reason``, ``metrics`` with
    ``queued_ts``/``scheduled_ts``/``first_token_ts``/``last_token_ts``/``first_token_latency``/
    ``num_preemptions``). What is missing or not a number is left out."""
    attrs: dict[str, AttributeValue] = {sc.RL_ENGINE_NAME: engine}
    request_id = getattr(output, "request_id", None)
    if request_id is not None:
        attrs[sc.GEN_AI_RESPONSE_ID] = safe_str(request_id, 256)
    prompt = getattr(output, "prompt_token_ids", None)
    if prompt is not None:
        attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] = len(prompt)
    completions = getattr(output, "outputs", None) or ()
    tokens = 0
    reasons: list[str] = []
    for completion in completions:
        tokens += len(getattr(completion, "token_ids", ()) or ())
        reason = getattr(completion, "finish_reason", None)
        if reason is not None:
            reasons.append(safe_str(reason, 256))
    if completions:
        attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = tokens
    if reasons:
        attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] = tuple(reasons)
    stats = getattr(output, "metrics", None)
    if stats is not None:
        _stats_attributes(stats, attrs)
    return attrs


def _stats_attributes(stats: Any, attrs: dict[str, AttributeValue]) -> None:
    """vLLM v1's ``RequestStateStats``, as its ``do_tracing`` turns them into ``gen_ai.latency.*``."""
    queued = _seconds(getattr(stats, "queued_ts", None))
    scheduled = _seconds(getattr(stats, "scheduled_ts", None))
    first = _seconds(getattr(stats, "first_token_ts", None))
    last = _seconds(getattr(stats, "last_token_ts", None))
    if queued and scheduled:
        _put(attrs, sc.RL_ENGINE_QUEUE_S, scheduled - queued)
    if scheduled and first:
        _put(attrs, sc.RL_ENGINE_PREFILL_S, first - scheduled)
    if first and last:
        _put(attrs, sc.RL_ENGINE_DECODE_S, last - first)
    ttft = _seconds(getattr(stats, "first_token_latency", None))
    if ttft:
        attrs[sc.RL_ENGINE_TTFT_S] = ttft
    preemptions = getattr(stats, "num_preemptions", None)
    if type(preemptions) is int and preemptions >= 0:
        attrs[sc.RL_ENGINE_PREEMPTIONS] = preemptions
        attrs[sc.RL_NUM_PREEMPTED] = preemptions  # summed over the sample's turns, like record_generation


def _put(attrs: dict[str, AttributeValue], key: str, seconds: float) -> None:
    if seconds >= 0.0:
        attrs[key] = seconds


def record_engine_output(output: Any, *, engine: str = "vllm", span: Span | None = None) -> None:
    """Put one finished engine output's numbers (:func:`engine_attributes`) on ``span``, by default the
    current span (the turn). A no-op when that span is not recording; never raises."""
    target = trace.get_current_span() if span is None else span
    if not target.is_recording():
        return
    try:
        target.set_attributes(engine_attributes(output, engine))
    except Exception:
        internal_error("record_engine_output")


def record_openai_response(body: object, *, engine: str = "vllm", span: Span | None = None) -> None:
    """An OpenAI-compatible ``/v1/completions`` or ``/v1/chat/completions`` response body (the parsed JSON
    mapping) on ``span``, by default the current span: ``usage.prompt_tokens``/``completion_tokens``, ``id``,
    each choice's ``finish_reason``. A no-op when not recording; never raises."""
    target = trace.get_current_span() if span is None else span
    if not target.is_recording() or not isinstance(body, Mapping):
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
        target.set_attributes(attrs)
    except Exception:
        internal_error("record_openai_response")
