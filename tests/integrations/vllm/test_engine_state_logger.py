"""The engine's load (issue 36) without an engine: per-request figures exact against a brute force, memory
bounded, the load windows' points and spans, our stat logger added next to the user's, and a stream closed
early keeping its partial numbers. The real vLLM runs in ``tests/engine/test_load.py``."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

import pytest

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.integrations.vllm import _load
from otel_agentloop.integrations.vllm._load import EngineLoad, LoadWindow, Series
from otel_agentloop.integrations.vllm._logger import logger_class
from otel_agentloop.integrations.vllm._wrappers import LOAD_ATTR, switch, wrap_generate, wrap_init
from otel_agentloop.testing import capture


def test_per_request_figures_equal_a_brute_force_over_the_iterations() -> None:
    rng = random.Random(7)
    series = Series()
    states: list[tuple[int, int, float]] = []
    marks: list[tuple[int, tuple[int, float]]] = []
    for _ in range(3000):
        if rng.random() < 0.05:
            marks.append((len(states), series.mark()))
        state = (rng.randint(0, 64), rng.randint(0, 500), rng.randint(0, 1000) / 1000)
        states.append(state)
        series.push(*state)
    assert len(marks) > 50
    for start, mark in marks:
        window = states[start:]
        assert series.summary(mark) == {
            sc.RL_ENGINE_ITERATIONS: len(window),
            sc.RL_ENGINE_BATCH_RUNNING_MEAN: pytest.approx(sum(s[0] for s in window) / len(window)),
            sc.RL_ENGINE_BATCH_RUNNING_MAX: max(s[0] for s in window),
            sc.RL_ENGINE_BATCH_WAITING_MAX: max(s[1] for s in window),
            sc.RL_ENGINE_KV_CACHE_USAGE_MAX: max(s[2] for s in window),
        }
    assert series.summary(series.mark()) == {}  # no iteration yet: no figures


def test_memory_stays_bounded_however_long_the_run() -> None:
    series = Series()
    for i in range(200_000):  # strictly decreasing values: the worst case of a suffix-maximum stack
        series.push(10**6 - i, 10**6 - i, 1.0 - i / 10**6)
    assert all(len(s.its) <= _load.MAX_STACK for s in (series.running, series.waiting, series.kv))
    window = LoadWindow(0)
    for i in range(100_000):  # tracing off: each closed window is dropped, counted
        window.add(1000.0 + i * 0.05, 1, 0, 0.5, 0)
    assert len(window.times) <= _load.MAX_POINTS and window.dropped > 0


def test_load_windows_keep_one_point_per_100_ms_and_close_into_load_spans() -> None:
    with capture() as cap:
        load = EngineLoad()
        stats = SimpleNamespace
        t0 = 1_000_000.0
        load.see_step(3)
        for k, (dt, running, waiting, kv, preempted) in enumerate(
            [(0.00, 2, 0, 0.1, 0), (0.03, 5, 1, 0.4, 1), (0.06, 3, 4, 0.2, 2), (0.25, 1, 0, 0.9, 0)]
        ):
            load.record(
                stats(num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=kv),
                stats(num_preempted_reqs=preempted, iteration_timestamp=t0 + dt + k * 1e-6),
            )
        load.record(stats(num_running_reqs=1), None, engine_idx=1)  # no iteration stats: a point at "now"
        load.see_step(2)  # an older step (fully async): no new window
        load.see_step(4)  # a newer one: the windows close
        load.record(stats(num_running_reqs=7, kv_cache_usage="full"), stats(iteration_timestamp=t0 + 20))
        load.close()
        spans = cap.by_name(sc.ENGINE_LOAD_SPAN)
    assert len(spans) == 3
    first = next(s for s in spans if s.attributes[sc.RL_ENGINE_ID].endswith(":0") and s.attributes[sc.RL_STEP] == 3)
    a = first.attributes
    assert list(a[sc.RL_ENGINE_LOAD_OFFSET_MS]) == [0, 250]
    assert list(a[sc.RL_ENGINE_LOAD_RUNNING]) == [5, 1] and list(a[sc.RL_ENGINE_LOAD_WAITING]) == [4, 0]
    assert list(a[sc.RL_ENGINE_LOAD_KV_CACHE_USAGE]) == [0.4, 0.9]
    assert list(a[sc.RL_ENGINE_LOAD_PREEMPTIONS]) == [3, 0]
    assert first.start_time == int(t0 * 1e9) and first.parent is None
    last = next(s for s in spans if s.attributes[sc.RL_STEP] == 4)
    assert list(last.attributes[sc.RL_ENGINE_LOAD_KV_CACHE_USAGE]) == [0.0]  # not a number: absent, 0


def test_a_collect_and_a_flush_close_the_open_window() -> None:
    with capture() as cap:
        load = EngineLoad()
        load.record(SimpleNamespace(num_running_reqs=2), None)
        assert cap.handle.force_flush(5)
        assert len(cap.exporter.get_finished_spans()) == 1 and load.windows[0].times == []
        load.record(SimpleNamespace(num_running_reqs=3), None)
        cap.handle.metrics.collect(0)
        assert len(cap.by_name(sc.ENGINE_LOAD_SPAN)) == 2 and load.windows[0].times == []


class Engine:
    """An ``AsyncLLM`` stand-in: ``__init__`` takes ``stat_loggers`` as vLLM's does; ``generate`` streams
    cumulative outputs, one engine iteration recorded before each."""

    def __init__(  # vLLM 0.32's positional order up to stat_loggers
        self, vllm_config: Any, executor_class: Any = None, log_stats: bool = True, usage_context: Any = None,
        mm_registry: Any = None, log_requests: bool = True, start_engine_loop: bool = True,
        stat_loggers: list[Any] | None = None,
    ) -> None:  # fmt: skip
        self.loggers = [factory(vllm_config, 0) for factory in stat_loggers or ()]

    async def generate(self, prompt: Any, params: Any, request_id: str, **kwargs: Any) -> AsyncGenerator[Any, None]:
        for k in range(1, 4):
            for logger in self.loggers:
                logger.record(SimpleNamespace(num_running_reqs=k, kv_cache_usage=0.25 * k), None)
            await asyncio.sleep(0)
            done = SimpleNamespace(index=0, token_ids=[1] * k, finish_reason="length" if k == 3 else None)
            yield SimpleNamespace(request_id=request_id, prompt_token_ids=[1, 2], outputs=[done], finished=k == 3)


class UserLogger:
    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.records = 0

    def record(
        self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
    ) -> None:
        self.records += 1


def test_our_logger_joins_the_users_and_the_turn_gets_the_engines_load() -> None:
    init, generate = wrap_init(Engine.__init__, lambda: None), wrap_generate(Engine.generate)
    switch.active = True
    try:
        mine = [UserLogger]
        engine = Engine.__new__(Engine)
        init(engine, SimpleNamespace(observability_config=None), None, True, stat_loggers=mine)
        positional = Engine.__new__(Engine)
        init(positional, SimpleNamespace(observability_config=None), None, True, 0, 0, True, True, mine)
        assert mine == [UserLogger]  # the caller's list is not changed
        assert [type(x) for x in engine.loggers] == [UserLogger, logger_class()]  # vLLM's StatLoggerBase if there
        assert len(positional.loggers) == 2 and isinstance(getattr(engine, LOAD_ATTR), EngineLoad)

        async def run() -> None:
            with oal.step(0), oal.sample(0), oal.span("generate_sequences"):
                async for _ in generate(engine, "p", None, "r-1"):
                    pass
            with oal.step(0), oal.sample(1), oal.span("generate_sequences"):
                async with contextlib.aclosing(generate(engine, "p", None, "r-2")) as stream:
                    async for _ in stream:
                        break  # the caller closes the stream early (vLLM aborts the request): partial numbers kept

        with capture() as cap:
            asyncio.run(run())
            turns = [s for s in cap.spans() if s.attributes and s.attributes.get(sc.RL_PHASE) == sc.GENERATE]
    finally:
        switch.active = False
    assert engine.loggers[0].records == 4  # the user's logger saw every iteration
    done, closed = (dict(t.attributes or {}) for t in turns)
    assert {k: done[k] for k in sc.ENGINE_LOAD_ATTRIBUTES} == {
        sc.RL_ENGINE_ITERATIONS: 3,
        sc.RL_ENGINE_BATCH_RUNNING_MEAN: 2.0,
        sc.RL_ENGINE_BATCH_RUNNING_MAX: 3,
        sc.RL_ENGINE_BATCH_WAITING_MAX: 0,
        sc.RL_ENGINE_KV_CACHE_USAGE_MAX: 0.75,
    }
    assert done[sc.RL_ENGINE_FINISH] == sc.ENGINE_FINISHED and done[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 3
    assert closed[sc.RL_ENGINE_FINISH] == sc.ENGINE_ABORTED and closed[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 1
    assert closed[sc.GEN_AI_RESPONSE_ID] == "r-2" and closed[sc.RL_ENGINE_ITERATIONS] == 1


def test_in_a_server_process_the_load_rides_on_the_final_output_to_whoever_carries_it() -> None:
    """No turn span in the engine's process (verl's ``vLLMHttpServer``: the turn is the caller's, in another
    process): the request's load figures go on its final output, and ``engine_attributes`` (what verl's server
    path sends back to the turn) carries them."""
    from otel_agentloop.integrations.vllm import engine_attributes

    init, generate = wrap_init(Engine.__init__, lambda: None), wrap_generate(Engine.generate)
    switch.active = True
    try:
        engine = Engine.__new__(Engine)
        init(engine, SimpleNamespace(observability_config=None), None, True)

        async def run() -> list[Any]:
            return [o async for o in generate(engine, "p", None, "r-1")]

        with capture():
            outs = asyncio.run(run())
    finally:
        switch.active = False
    attrs = engine_attributes(outs[-1])
    assert attrs[sc.RL_ENGINE_ITERATIONS] == 3 and attrs[sc.RL_ENGINE_BATCH_RUNNING_MAX] == 3
    assert attrs[sc.RL_ENGINE_KV_CACHE_USAGE_MAX] == 0.75 and attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 3


class Resumable:
    """An engine whose first request of a turn is aborted after 2 tokens (vLLM's ``abort`` finish reason) and
    whose next one finishes with 3 more; records the ``trace_headers`` each call got."""

    def __init__(self) -> None:
        self.headers: list[Any] = []

    async def generate(self, prompt: Any, params: Any, request_id: str, **kwargs: Any) -> AsyncGenerator[Any, None]:
        self.headers.append(kwargs.get("trace_headers"))
        aborted = request_id.endswith("a")
        tokens, reason = ([1, 2], "abort") if aborted else ([1, 2, 3], "length")
        done = SimpleNamespace(index=0, token_ids=tokens, finish_reason=reason)
        stats = SimpleNamespace(num_preemptions=1)
        yield SimpleNamespace(request_id=request_id, prompt_token_ids=[1], outputs=[done], finished=True, metrics=stats)


@pytest.mark.parametrize("fast_path", [True, False])
def test_an_aborted_and_resumed_turn_has_a_segment_per_attempt(fast_path: bool) -> None:
    generate = wrap_generate(Resumable.generate)
    engine = Resumable()
    switch.active = True
    try:

        async def run() -> None:
            with oal.step(0), oal.sample(0), oal.span("generate_sequences"):
                for request_id in ("r-1a", "r-1b"):
                    async for _ in generate(engine, "p", None, request_id):
                        pass
            with oal.step(0), oal.sample(1), oal.span("generate_sequences"):  # one attempt, finished
                async for _ in generate(engine, "p", None, "r-2"):
                    pass

        with capture(fast_path=fast_path) as cap:
            asyncio.run(run())
            spans = cap.spans()
    finally:
        switch.active = False
    turns = [s for s in spans if s.attributes and s.attributes.get(sc.RL_PHASE) == sc.GENERATE]
    segments = sorted(cap.by_name(sc.ENGINE_SEGMENT_SPAN), key=lambda s: s.attributes[sc.RL_ENGINE_SEGMENT_INDEX])
    resumed, single = (t for t in turns if t.attributes[sc.GEN_AI_RESPONSE_ID] in ("r-1b", "r-2"))
    assert [s.parent.span_id for s in segments] == [resumed.context.span_id] * 2  # none for the single turn
    first, second = (dict(s.attributes) for s in segments)
    assert (first[sc.RL_ENGINE_FINISH], first[sc.GEN_AI_USAGE_OUTPUT_TOKENS], first[sc.GEN_AI_RESPONSE_ID]) == (
        sc.ENGINE_ABORTED,
        2,
        "r-1a",
    )
    assert (second[sc.RL_ENGINE_FINISH], second[sc.GEN_AI_USAGE_OUTPUT_TOKENS]) == (sc.ENGINE_FINISHED, 3)
    # the resumed attempt's engine request was sent the segment's traceparent
    assert engine.headers[1]["traceparent"].split("-")[2] == f"{segments[1].context.span_id:016x}"
    assert engine.headers[0]["traceparent"].split("-")[2] == f"{resumed.context.span_id:016x}"
    t = resumed.attributes
    assert (t[sc.RL_ENGINE_SEGMENTS], t[sc.GEN_AI_USAGE_OUTPUT_TOKENS], t[sc.RL_ENGINE_PREEMPTIONS]) == (2, 5, 2)
    assert sc.RL_ENGINE_SEGMENTS not in single.attributes and single.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 3
