"""SGLang's output dict read into turn attributes (the same names vLLM's reader gives, where SGLang reports them).

=====================================  ================================================================
attribute                              SGLang ``meta_info``
=====================================  ================================================================
``gen_ai.response.id``                 ``id``
``gen_ai.usage.input_tokens``          ``prompt_tokens``
``gen_ai.usage.output_tokens``         ``completion_tokens``
``gen_ai.usage.cache_read.input_tokens`` ``cached_tokens`` (prompt tokens served from the radix cache)
``gen_ai.response.finish_reasons``     ``finish_reason.type`` (``stop``, ``length``, ``abort``)
``rl.engine.finish``                   ``aborted`` when that type is ``abort``, else ``finished``
``rl.engine.preemptions``              ``num_retractions`` (SGLang retracts a running request when its KV
                                       cache runs out: vLLM's preemption); also ``rl.num_preempted``
``rl.engine.queue_s``                  ``queue_time`` (``enable_metrics`` only)
``rl.engine.time_to_first_token_s``    ``first_token_latency`` (``enable_metrics`` only)
``rl.engine.prefill_s``                ``prefill_finished_time - forward_entry_time`` (both wall times)
``rl.engine.decode_s``                 ``request_finished_ts - prefill_finished_time``
=====================================  ================================================================

A value that is missing or not a number of the right kind is left out (one attribute per bad field).
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from ... import semconv as sc
from ...core._guard import internal_error, safe_str
from .._engine import count, seconds

ABORT = "abort"
"""SGLang's finish reason type of an aborted request."""
_COUNTS = (
    (sc.GEN_AI_USAGE_INPUT_TOKENS, "prompt_tokens"),
    (sc.GEN_AI_USAGE_OUTPUT_TOKENS, "completion_tokens"),
    (sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, "cached_tokens"),
    (sc.RL_ENGINE_PREEMPTIONS, "num_retractions"),
)
_DURATIONS = ((sc.RL_ENGINE_QUEUE_S, "queue_time"), (sc.RL_ENGINE_TTFT_S, "first_token_latency"))


def output_attributes(output: object) -> dict[str, AttributeValue]:
    """The turn attributes of one finished SGLang output (see the module). Never raises."""
    attrs: dict[str, AttributeValue] = {sc.RL_ENGINE_NAME: "sglang"}
    try:
        meta = output.get("meta_info") if isinstance(output, Mapping) else None
        if not isinstance(meta, Mapping):
            return attrs
        if isinstance(meta.get("id"), str):
            attrs[sc.GEN_AI_RESPONSE_ID] = safe_str(meta["id"], 256)
        for key, name in _COUNTS:
            number = count(meta.get(name))
            if number is not None:
                attrs[key] = number
        if sc.RL_ENGINE_PREEMPTIONS in attrs:
            attrs[sc.RL_NUM_PREEMPTED] = attrs[sc.RL_ENGINE_PREEMPTIONS]
        for key, name in _DURATIONS:
            duration = seconds(meta.get(name))
            if duration is not None:
                attrs[key] = duration
        _spans(meta, attrs)
        reason = meta.get("finish_reason")
        kind = reason.get("type") if isinstance(reason, Mapping) else None
        if isinstance(kind, str):
            attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] = (safe_str(kind, 256),)
            attrs[sc.RL_ENGINE_FINISH] = sc.ENGINE_ABORTED if kind == ABORT else sc.ENGINE_FINISHED
    except Exception:
        internal_error("sglang.output")
    return attrs


def _spans(meta: Mapping[str, object], attrs: dict[str, AttributeValue]) -> None:
    """Prefill and decode seconds from SGLang's wall times (0 or absent: not reached)."""
    entered = seconds(meta.get("forward_entry_time"))
    prefilled = seconds(meta.get("prefill_finished_time"))
    finished = seconds(meta.get("request_finished_ts"))
    if entered and prefilled and prefilled >= entered:
        attrs[sc.RL_ENGINE_PREFILL_S] = prefilled - entered
    if prefilled and finished and finished >= prefilled:
        attrs[sc.RL_ENGINE_DECODE_S] = finished - prefilled


def record_output(output: object, *, span: Span | None = None) -> None:
    """Put one finished SGLang output's numbers (:func:`output_attributes`) on ``span``, by default the current
    span (the turn). A no-op when that span is not recording; never raises."""
    try:
        target = trace.get_current_span() if span is None else span
        if target.is_recording():
            target.set_attributes(output_attributes(output))
    except Exception:
        internal_error("sglang.record_output")
