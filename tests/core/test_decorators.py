"""Decorator contract: sync/async/generators, errors, cancellation, misuse, signatures, pickling, off mode."""

from __future__ import annotations

import asyncio
import inspect
import logging
import pickle
import sys
import time

import pytest
from opentelemetry.sdk.trace import SpanProcessor

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.core._tracer import current_tracer


class CustomError(Exception):
    pass


@oal.trace_tool("lookup")
def lookup(key: str, *, default: int = 0) -> int:
    """Look a key up."""
    return len(key) + default


@oal.trace_generate
async def agen_tokens(n: int):
    for i in range(n):
        await asyncio.sleep(0)
        yield i


@oal.phase("tool_calls", tool="gen")
def gen_items(n: int):
    yield from range(n)
    return "done"


class Agent:
    @oal.trace_reward
    async def score(self, x: float) -> float:
        return x * 2


def test_sync_async_and_generators_make_spans(traced) -> None:
    async def main() -> tuple[int, list[int], list[int], float]:
        async with oal.sample(1, 0):
            a = lookup("abc", default=1)
            b = [i async for i in agen_tokens(3)]
            c = list(gen_items(2))
            d = await Agent().score(2.0)
            return a, b, c, d

    assert asyncio.run(main()) == (4, [0, 1, 2], [0, 1], 4.0)
    names = sorted(s.name for s in traced.spans())
    assert names == ["execute_tool gen", "execute_tool lookup", "rl.reward", "rl.sample", "text_completion"]
    tool_span = traced.by_name("execute_tool lookup")[0]
    assert tool_span.attributes[sc.GEN_AI_TOOL_NAME] == "lookup"
    assert tool_span.attributes[sc.GEN_AI_OPERATION_NAME] == "execute_tool"
    assert tool_span.attributes[sc.RL_PHASE] == "tool_calls"
    assert tool_span.attributes[sc.RL_SAMPLE_INDEX] == 1
    root = traced.by_name("rl.sample")[0]
    assert all(s.parent.span_id == root.context.span_id for s in traced.spans() if s is not root)


def test_user_exception_propagates_unchanged_and_is_recorded(traced) -> None:
    err = CustomError("nope")

    @oal.trace_reward
    def bad() -> None:
        raise err

    with pytest.raises(CustomError) as info:
        bad()
    assert info.value is err
    (span,) = traced.spans()
    assert span.status.status_code.name == "ERROR"
    assert span.attributes[sc.ERROR_TYPE] == f"{__name__}.CustomError"
    assert span.events[0].name == "exception"


def test_builtin_error_type_is_unqualified(traced) -> None:
    @oal.trace_reward
    async def bad() -> None:
        raise ValueError("x")

    with pytest.raises(ValueError):
        asyncio.run(bad())
    assert traced.spans()[0].attributes[sc.ERROR_TYPE] == "ValueError"


def test_cancellation_is_not_an_error(traced) -> None:
    @oal.trace_generate
    async def slow() -> None:
        await asyncio.sleep(10)

    async def main() -> None:
        task = asyncio.create_task(slow())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    (span,) = traced.spans()
    assert span.status.status_code.name == "UNSET"
    assert span.attributes[sc.RL_CANCELLED] is True
    assert sc.ERROR_TYPE not in span.attributes


def test_generator_closed_early_ends_its_span(traced) -> None:
    it = gen_items(5)
    next(it)
    it.close()
    (span,) = traced.spans()
    assert span.end_time is not None and span.status.status_code.name == "UNSET"


def test_misuse_fails_at_decoration_time() -> None:
    with pytest.raises(ValueError, match="unknown phase 'generation'"):
        oal.phase("generation")
    with pytest.raises(TypeError, match="must be a str"):
        oal.phase(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must decorate a function"):
        oal.phase("tool_calls")(42)  # type: ignore[type-var]
    with pytest.raises(TypeError, match="below @staticmethod"):
        oal.trace_reward(staticmethod(lambda: 1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tool's name"):
        oal.trace_tool(lambda: 1)  # type: ignore[arg-type]


def test_signature_name_and_pickling_are_preserved() -> None:
    sig = inspect.signature(lookup)
    assert list(sig.parameters) == ["key", "default"]
    assert sig.parameters["default"].kind is inspect.Parameter.KEYWORD_ONLY
    assert sig.parameters["default"].default == 0
    assert lookup.__name__ == "lookup" and lookup.__doc__ == "Look a key up."
    assert inspect.iscoroutinefunction(Agent.score)
    assert inspect.isasyncgenfunction(agen_tokens)
    assert pickle.loads(pickle.dumps(lookup)) is lookup
    assert pickle.loads(pickle.dumps(Agent())).__class__ is Agent


def test_decorated_functions_and_classes_pickle_by_value(traced) -> None:
    """What Ray does with a driver script's code (``__main__``): cloudpickle ships it by value, closures and
    the globals it names included; the copies trace like the originals."""
    from ray import cloudpickle

    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)
    try:
        payload = cloudpickle.dumps((lookup, agen_tokens, gen_items, Agent))
    finally:
        cloudpickle.unregister_pickle_by_value(module)
    copies = cloudpickle.loads(payload)
    assert all(
        copy is not original for copy, original in zip(copies[:3], (lookup, agen_tokens, gen_items), strict=True)
    )
    lookup_copy, agen_copy, gen_copy, agent_copy = copies

    async def main() -> tuple[int, list[int], list[int], float]:
        async with oal.sample(2, 1):
            return (
                lookup_copy("ab"),
                [i async for i in agen_copy(2)],
                list(gen_copy(2)),
                await agent_copy().score(1.5),
            )

    assert asyncio.run(main()) == (2, [0, 1], [0, 1], 3.0)
    names = sorted(s.name for s in traced.spans())
    assert names == ["execute_tool gen", "execute_tool lookup", "rl.reward", "rl.sample", "text_completion"]
    assert all(s.attributes[sc.RL_SAMPLE_INDEX] == 2 for s in traced.spans())


@pytest.mark.parametrize("how", ["env", "argument", "no-provider"])
def test_off_mode_runs_the_bare_function_and_makes_no_span(how, monkeypatch) -> None:
    handle = None
    if how == "env":
        monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
        handle = oal.configure("off")
    elif how == "argument":
        handle = oal.configure("off", enabled=False)
    if handle is not None:
        assert not handle.enabled and handle.force_flush(1)
    assert current_tracer() is None

    async def main() -> int:
        with oal.step(1):
            async with oal.sample(0) as s:
                assert s.span is None and s.trace_id is None
                s.record(prompt_length=3)
                oal.record_generation(output_tokens=3)
                return lookup("ab") + await Agent().score(1)

    assert asyncio.run(main()) == 4
    if handle is not None:
        assert handle.metrics.collect(1)["agent_loop/num_samples"] == 0


class _ExplodingProcessor(SpanProcessor):
    def on_start(self, span, parent_context=None) -> None:
        raise RuntimeError("instrumentation bug")


def test_internal_errors_are_logged_once_and_swallowed(caplog) -> None:
    handle = oal.configure("boom", processors=[_ExplodingProcessor()], set_global=False, exporters=[])
    try:
        with caplog.at_level(logging.WARNING, logger="otel_agentloop"):
            assert [lookup("x") for _ in range(3)] == [1, 1, 1]
            assert handle.force_flush(5)  # a user's processor runs on the export pipeline's thread
        internal = [r for r in caplog.records if "internal error" in r.getMessage()]
        assert len(internal) == 1
    finally:
        handle.shutdown(2)


def test_span_context_manager_times_a_block(traced) -> None:
    async def main() -> float:
        t0 = time.perf_counter()
        async with oal.sample(2), oal.span("tool_calls", tool="batch"):
            await asyncio.gather(asyncio.sleep(0.01), asyncio.sleep(0.02))
        return time.perf_counter() - t0

    around = asyncio.run(main())
    (tool_span,) = traced.by_name("execute_tool batch")
    assert tool_span.attributes[sc.RL_SAMPLE_INDEX] == 2
    # the block's time: at least its longer sleep, at most a timer around it (bounds that hold under any load)
    assert 0.02 <= (tool_span.end_time - tool_span.start_time) / 1e9 <= around
