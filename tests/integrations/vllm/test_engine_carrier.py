"""The engine carrier (issue 28) without an engine: ``trace_headers()`` follows our sampling, the engine's numbers
land on the turn span on both span paths, nothing raises into the caller, and the ``AsyncLLM.generate`` wrapper
forwards the async generator exactly (aclose, athrow, cancellation, exceptions). The real vLLM runs in
``tests/engine`` (``make test-engine``)."""

from __future__ import annotations

import asyncio
import os
import sys
import types
from collections.abc import AsyncGenerator, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.integrations.vllm import engine_attributes, record_engine_output, record_openai_response
from otel_agentloop.integrations.vllm import trace_headers as headers_of_turn
from otel_agentloop.integrations.vllm._wrappers import switch, wrap_generate
from otel_agentloop.testing import capture


def output(request_id: str = "r-1", *, finished: bool = True, preemptions: int = 1) -> SimpleNamespace:
    stats = SimpleNamespace(
        queued_ts=10.0,
        scheduled_ts=10.5,
        first_token_ts=11.0,
        last_token_ts=13.0,
        first_token_latency=1.25,
        num_preemptions=preemptions,
    )
    done = SimpleNamespace(token_ids=[1, 2, 3, 4], finish_reason="length")
    return SimpleNamespace(
        request_id=request_id, prompt_token_ids=[9] * 7, outputs=[done], metrics=stats, finished=finished
    )


EXPECTED = {
    sc.RL_ENGINE_NAME: "vllm",
    sc.GEN_AI_RESPONSE_ID: "r-1",
    sc.GEN_AI_USAGE_INPUT_TOKENS: 7,
    sc.GEN_AI_USAGE_OUTPUT_TOKENS: 4,
    sc.GEN_AI_RESPONSE_FINISH_REASONS: ("length",),
    sc.RL_ENGINE_QUEUE_S: 0.5,
    sc.RL_ENGINE_PREFILL_S: 0.5,
    sc.RL_ENGINE_DECODE_S: 2.0,
    sc.RL_ENGINE_TTFT_S: 1.25,
    sc.RL_ENGINE_PREEMPTIONS: 1,
    sc.RL_NUM_PREEMPTED: 1,
}


@pytest.mark.parametrize("fast_path", [True, False])
def test_trace_headers_carry_the_turn_and_our_sampling_decision(fast_path: bool) -> None:
    assert headers_of_turn() == {}  # outside any span: nothing (the caller's request is unchanged)
    with capture(fast_path=fast_path) as cap:
        with oal.step(0), oal.sample(0), oal.span("generate_sequences"):
            headers = headers_of_turn()
        (turn,) = [s for s in cap.spans() if s.attributes and s.attributes.get(sc.RL_PHASE) == sc.GENERATE]
        ctx = turn.get_span_context()
        assert headers == {"traceparent": f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01"}
    with capture(fast_path=fast_path, sampler=ParentBased(ALWAYS_OFF)):
        with oal.step(0), oal.sample(0) as sample, oal.span("generate_sequences"):
            unsampled = headers_of_turn()
        # flag 00: vLLM records nothing for it (no headers at all would make vLLM start a root span)
        assert unsampled["traceparent"].startswith(f"00-{sample.trace_id}-") and unsampled["traceparent"][-3:] == "-00"
        assert sample.span is not None and not sample.span.get_span_context().trace_flags.sampled


@pytest.mark.parametrize("fast_path", [True, False])
def test_engine_output_lands_on_the_turn_span_on_both_paths(fast_path: bool) -> None:
    with capture(fast_path=fast_path) as cap:
        with oal.step(0), oal.sample(0), oal.span("generate_sequences"):
            record_engine_output(output())
        with oal.step(1), oal.sample(0), oal.span("generate_sequences"):
            record_openai_response(
                {
                    "id": "cmpl-9",
                    "usage": {"prompt_tokens": 5, "completion_tokens": 3},
                    "choices": [{"finish_reason": "stop"}],
                }
            )
        turns = [s for s in cap.spans() if s.attributes and s.attributes.get(sc.RL_PHASE) == sc.GENERATE]
    attrs = dict(turns[0].attributes or {})
    assert {k: attrs[k] for k in EXPECTED} == EXPECTED
    attrs = dict(turns[1].attributes or {})
    assert attrs[sc.GEN_AI_RESPONSE_ID] == "cmpl-9" and attrs[sc.RL_ENGINE_NAME] == "vllm"
    assert (attrs[sc.GEN_AI_USAGE_INPUT_TOKENS], attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS]) == (5, 3)
    assert attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert sc.RL_ENGINE_QUEUE_S not in attrs  # the HTTP response carries no engine timing


def test_partial_or_hostile_outputs_never_raise_and_keep_what_is_valid() -> None:
    class Hostile:
        @property
        def request_id(self) -> str:
            raise RuntimeError("boom")

    unscheduled = output()
    unscheduled.metrics.scheduled_ts = unscheduled.metrics.first_token_ts = unscheduled.metrics.last_token_ts = 0.0
    with capture() as cap:
        with oal.step(0), oal.sample(0), oal.span("generate_sequences"):
            record_engine_output(Hostile())  # logged once, swallowed
            record_engine_output(None)
            record_engine_output(unscheduled)  # aborted before it was scheduled: no timing
            record_openai_response("not a mapping")
        (turn,) = [s for s in cap.spans() if s.attributes and s.attributes.get(sc.RL_PHASE) == sc.GENERATE]
    attrs = dict(turn.attributes or {})
    assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 4
    assert not {sc.RL_ENGINE_QUEUE_S, sc.RL_ENGINE_PREFILL_S, sc.RL_ENGINE_DECODE_S} & set(attrs)
    assert engine_attributes(SimpleNamespace(), "sglang") == {sc.RL_ENGINE_NAME: "sglang"}


def test_tracing_off_costs_one_check() -> None:
    with capture(enabled=False), oal.step(0), oal.sample(0), oal.span("generate_sequences"):
        assert headers_of_turn() == {}
        record_engine_output(output())  # a no-op


class Engine:
    """A stand-in for ``AsyncLLM``: its ``generate`` is an async generator that records what it was given."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.closed = False
        self.thrown: list[BaseException] = []

    async def generate(self, prompt: str, params: Any, request_id: str, **kwargs: Any) -> AsyncGenerator[Any, None]:
        self.calls.append(kwargs)
        try:
            if prompt == "slow":  # cancelled while vLLM's generator waits for the engine
                await asyncio.sleep(10)
            for i in range(3):
                try:
                    yield SimpleNamespace(step=i, finished=False)
                except ValueError as exc:  # athrow: handled inside vLLM's generator
                    self.thrown.append(exc)
                    yield SimpleNamespace(step="recovered", finished=False)
            if prompt == "fail":
                raise KeyError("engine failed")
            yield output(request_id)
        finally:
            self.closed = True


@pytest.fixture
def wrapped() -> Iterator[Any]:
    switch.active = True
    try:
        yield wrap_generate(Engine.generate)
    finally:
        switch.active = False


def test_generate_wrapper_adds_headers_records_the_final_output_and_forwards_everything(wrapped: Any) -> None:
    async def run() -> None:
        engine = Engine()
        with capture() as cap:
            with oal.step(0), oal.sample(0), oal.span("generate_sequences"):
                outs = [o async for o in wrapped(engine, "p", None, "r-1")]
                expected_headers = headers_of_turn()
                mine = [o async for o in wrapped(engine, "p", None, "r-2", trace_headers={"traceparent": "x"})]
            (turn,) = [s for s in cap.spans() if s.attributes and s.attributes.get(sc.RL_PHASE) == sc.GENERATE]
        assert len(outs) == len(mine) == 4 and engine.closed
        assert engine.calls == [{"trace_headers": expected_headers}, {"trace_headers": {"traceparent": "x"}}]
        assert dict(turn.attributes or {})[sc.GEN_AI_RESPONSE_ID] == "r-2"  # each final output, the last wins

        engine = Engine()  # aclose() closes vLLM's generator (vLLM aborts the request there)
        gen = wrapped(engine, "p", None, "r-3")
        await gen.__anext__()
        await gen.aclose()
        assert engine.closed

        engine = Engine()  # athrow() reaches vLLM's generator and its answer comes back
        gen = wrapped(engine, "p", None, "r-4")
        await gen.__anext__()
        assert (await gen.athrow(ValueError("x"))).step == "recovered"
        assert [type(e) for e in engine.thrown] == [ValueError]
        await gen.aclose()

        engine = Engine()  # the engine's exception reaches the caller unchanged
        with pytest.raises(KeyError, match="engine failed"):
            async for _ in wrapped(engine, "fail", None, "r-5"):
                pass

        engine = Engine()  # cancelled while the engine works: vLLM's generator sees it, CancelledError propagates

        async def consume() -> None:
            async for _ in wrapped(engine, "slow", None, "r-6"):
                pass

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert engine.closed

    asyncio.run(run())


def test_uninstrumented_wrapper_calls_straight_through() -> None:
    async def run() -> list[Any]:
        engine = Engine()
        with oal.step(0), oal.sample(0), oal.span("generate_sequences"):
            outs = [o async for o in wrap_generate(Engine.generate)(engine, "p", None, "r")]
        assert engine.calls == [{}]
        return outs

    with capture():
        assert len(asyncio.run(run())) == 4


def test_instrument_patches_async_llm_and_uninstrument_puts_back_the_very_same_objects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from otel_agentloop.integrations import vllm as oal_vllm

    class AsyncLLM:
        def __init__(self, vllm_config: Any) -> None:
            self.config = vllm_config

        generate = Engine.generate

    module = types.ModuleType(oal_vllm.ASYNC_LLM)
    module.AsyncLLM = AsyncLLM  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, oal_vllm.ASYNC_LLM, module)
    init, generate = AsyncLLM.__dict__["__init__"], AsyncLLM.__dict__["generate"]
    with capture("svc", endpoint="http://127.0.0.1:4317", protocol="grpc"):
        try:
            assert oal_vllm.instrument() and oal_vllm.instrument() and oal_vllm.is_instrumented()
            assert AsyncLLM.__dict__["generate"].__wrapped__ is generate
            config = SimpleNamespace(observability_config=SimpleNamespace(otlp_traces_endpoint=None))
            given = SimpleNamespace(observability_config=SimpleNamespace(otlp_traces_endpoint="127.0.0.1:9"))
            monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
            AsyncLLM(config), AsyncLLM(given)
            # the engine had none: it gets ours and our service name; one it was given is kept
            assert config.observability_config.otlp_traces_endpoint == "http://127.0.0.1:4317"
            assert given.observability_config.otlp_traces_endpoint == "127.0.0.1:9"
            assert os.environ["OTEL_SERVICE_NAME"] == "svc"
        finally:
            oal_vllm.uninstrument()
    assert AsyncLLM.__dict__["__init__"] is init and AsyncLLM.__dict__["generate"] is generate
    assert not oal_vllm.is_instrumented()


def test_an_engine_without_request_stats_gets_no_endpoint_and_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM's tracing reads each finished request's stats: an ``AsyncLLM`` built with ``log_stats=False``
    (``disable_log_stats=True``) given an endpoint would fail on every finished request, so it gets none."""
    from otel_agentloop.integrations import vllm as oal_vllm

    class AsyncLLM:
        def __init__(self, vllm_config: Any, executor_class: Any = None, log_stats: bool = True) -> None:
            self.config = vllm_config

        generate = Engine.generate

    module = types.ModuleType(oal_vllm.ASYNC_LLM)
    module.AsyncLLM = AsyncLLM  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, oal_vllm.ASYNC_LLM, module)

    def config() -> SimpleNamespace:
        return SimpleNamespace(observability_config=SimpleNamespace(otlp_traces_endpoint=None))

    with capture("svc", endpoint="http://127.0.0.1:4317", protocol="grpc"), caplog.at_level("WARNING"):
        try:
            assert oal_vllm.instrument()
            off_kw, off_pos, on = config(), config(), config()
            AsyncLLM(off_kw, None, log_stats=False), AsyncLLM(off_pos, None, False), AsyncLLM(on, None, True)
        finally:
            oal_vllm.uninstrument()
    assert off_kw.observability_config.otlp_traces_endpoint is None
    assert off_pos.observability_config.otlp_traces_endpoint is None
    assert on.observability_config.otlp_traces_endpoint == "http://127.0.0.1:4317"
    warned = [r for r in caplog.records if "disable_log_stats=True" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]


# -- issue 41: the engine's numbers ------------------------------------------------------------------------
def completion(index: int, tokens: Any, reason: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(index=index, token_ids=tokens, finish_reason=reason)


def streamed(outputs: list[Any], *, finished_last: bool = True) -> list[SimpleNamespace]:
    """One request's stream: an output per item (a list of completions), the last one finished."""
    return [
        SimpleNamespace(
            request_id="r-s", prompt_token_ids=[1] * 5, outputs=o, finished=finished_last and i == len(outputs) - 1
        )
        for i, o in enumerate(outputs)
    ]


class Streaming:
    """An ``AsyncLLM`` stand-in whose ``generate`` yields a given stream."""

    def __init__(self, stream: list[Any]) -> None:
        self.stream = stream

    async def generate(self, prompt: Any, params: Any, request_id: str, **kwargs: Any) -> AsyncGenerator[Any, None]:
        for out in self.stream:
            await asyncio.sleep(0)
            yield out


def _turn_attrs(stream: list[Any], params: Any = None) -> dict[str, Any]:
    """The turn span's attributes after one wrapped ``generate`` over ``stream``, consumed to the end."""
    switch.active = True
    try:
        generate = wrap_generate(Streaming.generate)

        async def run() -> None:
            with oal.step(0), oal.sample(0), oal.span("generate_sequences"):
                async for _ in generate(Streaming(stream), "p", params, "r-s"):
                    pass

        with capture() as cap:
            asyncio.run(run())
            (turn,) = [s for s in cap.spans() if s.attributes and s.attributes.get(sc.RL_PHASE) == sc.GENERATE]
        return dict(turn.attributes or {})
    finally:
        switch.active = False


def test_every_completion_and_token_of_a_stream_reaches_the_turn() -> None:
    """vLLM's three output kinds: CUMULATIVE (default; with n=2 each output carries one child's completion so
    far), DELTA (only the new tokens), FINAL_ONLY (one output with every completion)."""
    cumulative = streamed(
        [
            [completion(0, [1])],
            [completion(1, [1])],
            [completion(0, [1, 2, 3, 4, 5, 6], "length")],
            [completion(1, [1, 2, 3, 4, 5, 6], "length")],
        ]
    )
    attrs = _turn_attrs(cumulative, SimpleNamespace(n=2, output_kind=SimpleNamespace(name="CUMULATIVE")))
    assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 12
    assert attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("length", "length")
    assert attrs[sc.RL_ENGINE_FINISH] == sc.ENGINE_FINISHED

    delta = streamed([[completion(0, [7] * k)] for k in (1, 3, 2)] + [[completion(0, [7] * 4, "stop")]])
    attrs = _turn_attrs(delta, SimpleNamespace(output_kind=SimpleNamespace(name="DELTA")))
    assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 10 and attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)

    final = streamed([[completion(1, [1] * 4, "stop"), completion(0, [1] * 6, "length")]])
    attrs = _turn_attrs(final, SimpleNamespace(output_kind=SimpleNamespace(name="FINAL_ONLY")))
    assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 10
    assert attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("length", "stop")  # in completion index order


@pytest.mark.parametrize("fast_path", [True, False])
def test_engine_numbers_go_on_the_turn_when_the_user_wraps_the_call_in_a_span_of_their_own(fast_path: bool) -> None:
    """A retry/timeout helper's span around ``engine.generate`` (and around the iteration): the request id,
    tokens and timing are still the turn's, and ``collect()`` has the step's ``agent_loop/engine/*``."""
    switch.active = True
    try:
        generate = wrap_generate(Engine.generate)
        with capture(fast_path=fast_path) as cap:
            tracer = cap.handle.provider.get_tracer("user")

            async def run() -> None:
                with (
                    oal.step(0),
                    oal.sample(0),
                    oal.span("generate_sequences"),
                    tracer.start_as_current_span("retry"),  # the user's own span around the engine call
                ):
                    async for _ in generate(Engine(), "p", None, "r-1"):
                        pass

            asyncio.run(run())
            metrics = cap.handle.metrics.collect(0)
            spans = cap.spans()
    finally:
        switch.active = False
    (turn,) = [s for s in spans if s.attributes and s.attributes.get(sc.RL_PHASE) == sc.GENERATE]
    (retry,) = [s for s in spans if s.name == "retry"]
    attrs = dict(turn.attributes or {})
    assert {k: attrs[k] for k in EXPECTED} == EXPECTED
    assert sc.GEN_AI_RESPONSE_ID not in dict(retry.attributes or {})
    assert metrics[f"{sc.METRIC_PREFIX}/{sc.ENGINE_METRIC}/{sc.ENGINE_QUEUE_S}/max"] == 0.5
    assert metrics[f"{sc.METRIC_PREFIX}/{sc.ENGINE_METRIC}/{sc.ENGINE_OUTPUT_TOKENS}/max"] == 4


def test_one_bad_field_costs_one_attribute() -> None:
    def bad(**fields: Any) -> dict[str, Any]:
        out = output()
        for name, value in fields.items():
            setattr(out, name, value)
        return engine_attributes(out)

    whole = engine_attributes(output())
    assert bad(prompt_token_ids=7) == {k: v for k, v in whole.items() if k != sc.GEN_AI_USAGE_INPUT_TOKENS}
    no_tokens = {k: v for k, v in whole.items() if k != sc.GEN_AI_USAGE_OUTPUT_TOKENS}
    assert bad(outputs=[completion(0, 4, "length")]) == no_tokens  # token_ids an int: the count is unknown
    assert bad(outputs=[completion(0, None, "length")]) == no_tokens  # no token ids: unknown, never 0
    assert bad(outputs=4) == {
        k: v for k, v in whole.items() if k not in (sc.GEN_AI_USAGE_OUTPUT_TOKENS, sc.GEN_AI_RESPONSE_FINISH_REASONS)
    }


def test_a_completion_without_token_ids_puts_no_zero_into_the_engine_metrics() -> None:
    out = output()
    out.outputs = [SimpleNamespace(finish_reason="length")]
    with capture() as cap:
        with oal.step(0), oal.sample(0), oal.span("generate_sequences"):
            record_engine_output(out)
        metrics = cap.handle.metrics.collect(0)
    engine = f"{sc.METRIC_PREFIX}/{sc.ENGINE_METRIC}/"
    assert metrics[engine + f"{sc.ENGINE_DECODE_S}/max"] == 2.0  # the turn's timing is kept
    assert (
        engine + f"{sc.ENGINE_DECODE_TPS}/max" not in metrics
        and engine + f"{sc.ENGINE_OUTPUT_TOKENS}/max" not in metrics
    )
