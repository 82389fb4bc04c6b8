"""vLLM's request outputs read into turn attributes: :class:`OutputReader` (every output of one request's stream),
:func:`engine_attributes` (one output) and :func:`record_engine_output` (onto the turn span).

Contract:

- **Every completion, every token, however vLLM streams.** A stream is read output by output, per completion
  ``index``: with ``output_kind`` ``CUMULATIVE`` (the default) each output carries its completions' tokens so
  far (with ``n > 1`` each output carries one child's completion), with ``DELTA`` only the new tokens (summed
  here), with ``FINAL_ONLY`` one output with every completion. The turn's output tokens are the sum over
  completions, its finish reasons one per completion in index order.
- **One bad field costs one attribute.** Each field is read and checked on its own: ``prompt_token_ids`` that
  is no sequence drops ``gen_ai.usage.input_tokens`` only, ``outputs`` that is no sequence drops the output
  tokens and finish reasons only. A completion whose ``token_ids`` is missing or no sequence makes the output
  token count unknown: the attribute is left out (never 0: no 0 enters the engine metrics or a decode speed).
- ``rl.engine.finish``: ``"aborted"`` when a completion ended with vLLM's ``abort`` reason or the stream ended
  before its finished output (closed, cancelled, failed), ``"finished"`` for a finished output.

vLLM is never imported: outputs are read by attribute. Nothing raises (an error is logged once).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from ... import semconv as sc
from ...core._guard import internal_error, safe_str
from .._engine import count, record_attributes, seconds

__all__ = ["OutputReader", "engine_attributes", "record_engine_output"]

LOAD_FIELD = "otel_agentloop_load"
"""The attribute of a finished ``RequestOutput`` that carries its request's load figures (a dict of
``semconv.ENGINE_LOAD_ATTRIBUTES``) where no turn span is current in the engine's process (a server);
:func:`engine_attributes` adds them."""
ABORT_REASON = "abort"
"""vLLM's ``FinishReason.ABORT`` as text: what a completion of an aborted request ends with."""


def _field(obj: object, name: str) -> Any:
    """``obj.name``, ``None`` when missing or when reading it raises (logged once). Any: a field of the engine's
    output, whose type varies by vLLM version; each is checked where it is read."""
    try:
        return getattr(obj, name, None)
    except Exception:
        internal_error(f"vllm.output.{name}")
        return None


def _length(value: Any) -> int | None:  # Any: ``len()`` is tried, not promised (a list, a tuple, an array)
    """The length of a token id sequence (a list, a tuple, an array); ``None`` for anything else (an int, text,
    a mapping, ``None``)."""
    if value is None or isinstance(value, (str, bytes, Mapping, int, float)):
        return None
    try:
        return len(value)
    except Exception:
        return None


class OutputReader:
    """Reads every ``RequestOutput`` of one request (:meth:`add`, in stream order) into its turn attributes
    (:meth:`attributes`); see the module. Holds one entry per completion index (``n``), nothing per token."""

    __slots__ = ("delta", "engine", "last", "reasons", "tokens", "unknown")

    def __init__(self, *, delta: bool = False, engine: str = "vllm") -> None:
        self.delta = delta
        self.engine = engine
        self.last: object = None
        self.tokens: dict[int, int] = {}
        self.reasons: dict[int, str] = {}
        self.unknown = False  # a completion without countable token ids: the output token count is unknown

    def add(self, output: object) -> None:
        """One output of the stream. Never raises."""
        try:
            self.last = output
            completions = _field(output, "outputs")
            if completions is None or _length(completions) is None:
                self.unknown = self.unknown or completions is not None
                return
            for position, completion in enumerate(completions):
                index = _field(completion, "index")
                key = index if type(index) is int else position
                n = _length(_field(completion, "token_ids"))
                if n is None:
                    self.unknown = True
                else:
                    self.tokens[key] = self.tokens.get(key, 0) + n if self.delta else n
                reason = _field(completion, "finish_reason")
                if reason is not None:
                    self.reasons[key] = safe_str(reason, 256)
        except Exception:
            internal_error("vllm.output.add")

    def attributes(self, *, ended: bool = True) -> dict[str, AttributeValue]:
        """The turn attributes of what was read (``ended``: the stream delivered its finished output)."""
        attrs: dict[str, AttributeValue] = {sc.RL_ENGINE_NAME: self.engine}
        output = self.last
        if output is None:
            attrs[sc.RL_ENGINE_FINISH] = sc.ENGINE_ABORTED
            return attrs
        try:
            request_id = _field(output, "request_id")
            if request_id is not None:
                attrs[sc.GEN_AI_RESPONSE_ID] = safe_str(request_id, 256)
            prompt = _length(_field(output, "prompt_token_ids"))
            if prompt is not None:
                attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] = prompt
            cached = count(_field(output, "num_cached_tokens"))
            if cached is not None:
                attrs[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = cached
            if self.tokens and not self.unknown:
                attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] = sum(self.tokens.values())
            if self.reasons:
                attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] = tuple(self.reasons[k] for k in sorted(self.reasons))
            if not ended or ABORT_REASON in self.reasons.values():
                attrs[sc.RL_ENGINE_FINISH] = sc.ENGINE_ABORTED
            elif _field(output, "finished") is True:
                attrs[sc.RL_ENGINE_FINISH] = sc.ENGINE_FINISHED
            stats = _field(output, "metrics")
            if stats is not None:
                _stats_attributes(stats, attrs)
            _load_attributes(_field(output, LOAD_FIELD), attrs)
        except Exception:
            internal_error("vllm.output.attributes")
        return attrs


def _stats_attributes(stats: object, attrs: dict[str, AttributeValue]) -> None:
    """vLLM v1's ``RequestStateStats``, as its ``do_tracing`` turns them into ``gen_ai.latency.*``."""
    queued = seconds(_field(stats, "queued_ts"))
    scheduled = seconds(_field(stats, "scheduled_ts"))
    first = seconds(_field(stats, "first_token_ts"))
    last = seconds(_field(stats, "last_token_ts"))
    if queued and scheduled:
        _put(attrs, sc.RL_ENGINE_QUEUE_S, scheduled - queued)
    if scheduled and first:
        _put(attrs, sc.RL_ENGINE_PREFILL_S, first - scheduled)
    if first and last:
        _put(attrs, sc.RL_ENGINE_DECODE_S, last - first)
    ttft = seconds(_field(stats, "first_token_latency"))
    if ttft:
        attrs[sc.RL_ENGINE_TTFT_S] = ttft
    preemptions = count(_field(stats, "num_preemptions"))
    if preemptions is not None:
        attrs[sc.RL_ENGINE_PREEMPTIONS] = preemptions
        attrs[sc.RL_NUM_PREEMPTED] = preemptions  # summed over the sample's turns, like record_generation


def _load_attributes(load: object, attrs: dict[str, AttributeValue]) -> None:
    """The load figures the instrumented engine left on the output (:data:`LOAD_FIELD`), checked."""
    if isinstance(load, dict):
        for key in sc.ENGINE_LOAD_ATTRIBUTES:
            value = load.get(key)
            if (type(value) is int or type(value) is float) and value >= 0:
                attrs[key] = value


def _put(attrs: dict[str, AttributeValue], key: str, value: float) -> None:
    if value >= 0.0:
        attrs[key] = value


def engine_attributes(output: object, engine: str = "vllm") -> dict[str, AttributeValue]:
    """The turn attributes of one finished engine output (vLLM ``RequestOutput``-shaped: ``request_id``,
    ``prompt_token_ids``, ``num_cached_tokens``, ``outputs[i].token_ids``/``.finish_reason``, ``metrics`` with
    ``queued_ts``/``scheduled_ts``/``first_token_ts``/``last_token_ts``/``first_token_latency``/
    ``num_preemptions``). What is missing or not a number is left out, one attribute per bad field."""
    reader = OutputReader(engine=engine)
    reader.add(output)
    return reader.attributes()


def record_engine_output(output: object, *, engine: str = "vllm", span: Span | None = None) -> None:
    """Put one finished engine output's numbers (:func:`engine_attributes`) on ``span``, by default the turn
    (``integrations._engine.turn_span``). A no-op when that span is not recording; never raises."""
    record_attributes(engine_attributes(output, engine), span)
