"""One span lifecycle: every wrapper kind x sync/async/generator/async-generator keeps the callable's semantics
and times the real call (issues 12 item 2 and 13 classes 5 and 8)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry import trace

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.integrations import ray as oal_ray

DELAY = 0.12


def _phase() -> Callable[[Any], Any]:
    return oal.phase("tool_calls", tool="t")


def _trainer() -> Callable[[Any], Any]:
    return oal.trainer_phase("gen")


def _remote() -> Callable[[Any], Any]:
    return oal_ray.traced_remote


WRAPPERS = {
    "phase": (_phase, "execute_tool t"),
    "trainer_phase": (_trainer, "rl.train.gen"),
    "traced_remote": (_remote, sc.WORKER_SPAN),
}
CARRIER = {sc.RL_STEP: 3, sc.RL_VALIDATE: False}


def _kwargs(kind: str) -> dict[str, Any]:
    return {"otel_carrier": dict(CARRIER)} if kind == "traced_remote" else {}


def _duration(traced, name: str) -> float:
    spans = traced.by_name(name)
    assert len(spans) == 1, [s.name for s in traced.spans()]
    return (spans[0].end_time - spans[0].start_time) / 1e9


@pytest.mark.parametrize("kind", WRAPPERS)
def test_sync_function_is_timed(traced, kind) -> None:
    make, name = WRAPPERS[kind]

    @make()
    def work(x: int) -> int:
        time.sleep(DELAY)
        return x + 1

    assert work(1, **_kwargs(kind)) == 2
    assert _duration(traced, name) >= DELAY * 0.9


@pytest.mark.parametrize("kind", WRAPPERS)
def test_async_function_is_timed(traced, kind) -> None:
    make, name = WRAPPERS[kind]

    @make()
    async def work(x: int) -> int:
        await asyncio.sleep(DELAY)
        return x + 1

    assert asyncio.run(work(1, **_kwargs(kind))) == 2
    assert _duration(traced, name) >= DELAY * 0.9


@pytest.mark.parametrize("kind", WRAPPERS)
def test_generator_is_timed_and_keeps_send_throw_close(traced, kind) -> None:
    make, name = WRAPPERS[kind]
    log: list[Any] = []

    @make()
    def work() -> Any:
        try:
            got = yield 1
            log.append(("got", got))
            time.sleep(DELAY)
            try:
                yield 2
            except KeyError as exc:
                log.append(("caught", exc.args[0]))
                yield 3
            yield 4
        finally:
            log.append("finally")
        return "done"

    gen = work(**_kwargs(kind))
    assert next(gen) == 1
    assert gen.send("x") == 2
    assert gen.throw(KeyError("k")) == 3
    assert next(gen) == 4
    with pytest.raises(StopIteration) as stop:
        next(gen)
    assert stop.value.value == "done"
    assert log == [("got", "x"), ("caught", "k"), "finally"]
    assert _duration(traced, name) >= DELAY * 0.9

    gen = work(**_kwargs(kind))
    next(gen)
    gen.close()  # runs the generator's finally, ends the span as cancelled
    assert log[-1] == "finally"


@pytest.mark.parametrize("kind", WRAPPERS)
def test_async_generator_is_timed_and_keeps_asend_athrow_aclose(traced, kind) -> None:
    make, name = WRAPPERS[kind]
    log: list[Any] = []

    @make()
    async def work() -> Any:
        try:
            got = yield 1
            log.append(("got", got))
            await asyncio.sleep(DELAY)
            try:
                yield 2
            except KeyError as exc:
                log.append(("caught", exc.args[0]))
                yield 3
            yield 4
        finally:
            log.append("finally")

    async def drive() -> None:
        agen = work(**_kwargs(kind))
        assert await agen.asend(None) == 1
        assert await agen.asend("x") == 2
        assert await agen.athrow(KeyError("k")) == 3
        assert await agen.__anext__() == 4
        with pytest.raises(StopAsyncIteration):
            await agen.__anext__()
        agen = work(**_kwargs(kind))
        assert await agen.__anext__() == 1
        await agen.aclose()

    asyncio.run(drive())
    assert log == [("got", "x"), ("caught", "k"), "finally", "finally"]
    spans = traced.by_name(name)
    assert len(spans) == 2 and all(s.end_time for s in spans)
    assert max((s.end_time - s.start_time) / 1e9 for s in spans) >= DELAY * 0.9


def test_span_block_sync_and_async_is_timed(traced) -> None:
    with oal.span("tool_calls", tool="blk"):
        time.sleep(DELAY)

    async def run() -> None:
        async with oal.span("tool_calls", tool="blk"):
            await asyncio.sleep(DELAY)

    asyncio.run(run())
    spans = traced.by_name("execute_tool blk")
    assert len(spans) == 2 and all((s.end_time - s.start_time) / 1e9 >= DELAY * 0.9 for s in spans)


def test_generator_child_spans_nest_below_the_generator_span_not_the_consumer(traced) -> None:
    @oal.trace_generate(model="m")
    def inner() -> None:
        return None

    @oal.phase("tool_calls", tool="gen")
    def work() -> Any:
        inner()
        yield 1

    with oal.sample(0, step=1):
        assert list(work()) == [1]
        assert trace.get_current_span().name == "rl.sample"  # the generator span never leaks out
    gen_span = traced.by_name("execute_tool gen")[0]
    child = traced.by_name("text_completion m")[0]
    assert child.parent.span_id == gen_span.context.span_id


# -- callables that return awaitables are timed until the awaitable completes (class 8) -----------------
class AsyncTool:
    async def __call__(self, delay: float) -> str:
        await asyncio.sleep(delay)
        return "ok"


def test_object_with_async_call_is_timed(traced) -> None:
    tool = oal.trace_tool("obj")(AsyncTool())
    assert asyncio.run(tool(DELAY)) == "ok"
    assert _duration(traced, "execute_tool obj") >= DELAY * 0.9


def test_plain_def_returning_a_coroutine_is_timed(traced) -> None:
    async def real(delay: float) -> str:
        await asyncio.sleep(delay)
        return "ok"

    @oal.trace_tool("lazy")
    def lazy(delay: float):
        return real(delay)

    assert asyncio.run(lazy(DELAY)) == "ok"
    assert _duration(traced, "execute_tool lazy") >= DELAY * 0.9


def test_plain_def_returning_a_future_keeps_the_future_and_is_timed(traced) -> None:
    @oal.trace_tool("fut")
    def schedule(delay: float) -> asyncio.Future:
        return asyncio.ensure_future(asyncio.sleep(delay, result="ok"))

    async def run() -> None:
        fut = schedule(DELAY)
        assert isinstance(fut, asyncio.Future)  # the user's object, not a wrapper
        assert await fut == "ok"
        await asyncio.sleep(0)

    asyncio.run(run())
    assert _duration(traced, "execute_tool fut") >= DELAY * 0.9


def test_awaitable_failure_is_recorded_and_reraised(traced) -> None:
    async def boom() -> None:
        await asyncio.sleep(0.01)
        raise LookupError("no")

    @oal.trace_tool("bad")
    def lazy():
        return boom()

    with pytest.raises(LookupError):
        asyncio.run(lazy())
    (s,) = traced.by_name("execute_tool bad")
    assert s.attributes[sc.ERROR_TYPE] == "LookupError"
