"""The carrier against vLLM 0.32's own classes, no engine started: a real ``RequestOutput`` (with its
``CompletionOutput`` list and ``RequestStateStats``) gives the turn attributes, n > 1 completions summed, and
``instrument()`` patches the real ``AsyncLLM`` (an async generator stays one) and ``uninstrument()`` puts the
very same functions back."""

from __future__ import annotations

import inspect

from vllm.outputs import CompletionOutput, RequestOutput
from vllm.v1.engine import async_llm
from vllm.v1.metrics.stats import RequestStateStats

from otel_agentloop import semconv as sc
from otel_agentloop.integrations import vllm as oal_vllm


def test_a_real_request_output_gives_the_turn_attributes() -> None:
    stats = RequestStateStats(arrival_time=1.0)
    stats.queued_ts, stats.scheduled_ts, stats.first_token_ts, stats.last_token_ts = 5.0, 5.5, 6.0, 9.0
    stats.first_token_latency, stats.num_preemptions, stats.num_generation_tokens = 1.5, 2, 7
    outputs = [
        CompletionOutput(index=i, text="", token_ids=list(range(3 + i)), cumulative_logprob=None, logprobs=None,
                         finish_reason=reason)
        for i, reason in enumerate(("stop", "length"))
    ]  # fmt: skip
    out = RequestOutput("req-7", None, [1] * 11, None, outputs, True, metrics=stats, num_cached_tokens=4)
    assert oal_vllm.engine_attributes(out) == {
        sc.RL_ENGINE_NAME: "vllm",
        sc.GEN_AI_RESPONSE_ID: "req-7",
        sc.GEN_AI_USAGE_INPUT_TOKENS: 11,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 3 + 4,
        sc.GEN_AI_RESPONSE_FINISH_REASONS: ("stop", "length"),
        sc.RL_ENGINE_QUEUE_S: 0.5,
        sc.RL_ENGINE_PREFILL_S: 0.5,
        sc.RL_ENGINE_DECODE_S: 3.0,
        sc.RL_ENGINE_TTFT_S: 1.5,
        sc.RL_ENGINE_PREEMPTIONS: 2,
        sc.RL_NUM_PREEMPTED: 2,
        sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 4,
        sc.RL_ENGINE_FINISH: sc.ENGINE_FINISHED,
    }
    # stats off (disable_log_stats=True): tokens, id and reasons only
    bare = RequestOutput("req-8", None, [1, 2], None, outputs[:1], True)
    assert set(oal_vllm.engine_attributes(bare)) == {
        sc.RL_ENGINE_NAME, sc.GEN_AI_RESPONSE_ID, sc.GEN_AI_USAGE_INPUT_TOKENS, sc.GEN_AI_USAGE_OUTPUT_TOKENS,
        sc.GEN_AI_RESPONSE_FINISH_REASONS, sc.RL_ENGINE_FINISH,
    }  # fmt: skip


def test_one_bad_field_of_a_real_request_output_costs_one_attribute() -> None:
    """Issue 41: a real ``RequestOutput`` with one field of the wrong type keeps every other attribute; a
    completion without token ids is an unknown count, never 0."""

    def make() -> RequestOutput:
        stats = RequestStateStats(arrival_time=1.0)
        stats.queued_ts, stats.scheduled_ts, stats.first_token_ts, stats.last_token_ts = 5.0, 5.5, 6.0, 9.0
        done = CompletionOutput(index=0, text="", token_ids=[1, 2, 3], cumulative_logprob=None, logprobs=None,
                                finish_reason="length")  # fmt: skip
        return RequestOutput("req-9", None, [1] * 5, None, [done], True, metrics=stats, num_cached_tokens=0)

    whole = oal_vllm.engine_attributes(make())
    assert whole[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 3 and whole[sc.GEN_AI_USAGE_INPUT_TOKENS] == 5
    out = make()
    out.prompt_token_ids = 5  # type: ignore[assignment]
    assert oal_vllm.engine_attributes(out) == {k: v for k, v in whole.items() if k != sc.GEN_AI_USAGE_INPUT_TOKENS}
    for bad in (3, None):
        out = make()
        out.outputs[0].token_ids = bad  # type: ignore[assignment]
        assert oal_vllm.engine_attributes(out) == {k: v for k, v in whole.items() if k != sc.GEN_AI_USAGE_OUTPUT_TOKENS}
    out = make()
    out.outputs = 2  # type: ignore[assignment]
    dropped = (sc.GEN_AI_USAGE_OUTPUT_TOKENS, sc.GEN_AI_RESPONSE_FINISH_REASONS)
    assert oal_vllm.engine_attributes(out) == {k: v for k, v in whole.items() if k not in dropped}


def test_instrument_patches_the_real_async_llm_and_uninstrument_restores_it() -> None:
    cls = async_llm.AsyncLLM
    generate, init = cls.__dict__["generate"], cls.__dict__["__init__"]
    try:
        assert oal_vllm.instrument()
        assert cls.__dict__["generate"] is not generate and cls.__dict__["generate"].__wrapped__ is generate
        assert inspect.isasyncgenfunction(cls.generate)
        assert inspect.signature(cls.generate) == inspect.signature(generate)
    finally:
        oal_vllm.uninstrument()
    assert cls.__dict__["generate"] is generate and cls.__dict__["__init__"] is init
