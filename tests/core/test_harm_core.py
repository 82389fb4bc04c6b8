"""Never harm the user's program, core: decorated ``__main__`` code pickles by value, ``bind`` runs any kind of
callable inside its context, one ``sample()`` object entered by several threads, phase durations that a
wall-clock step cannot bend."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import textwrap
import threading
import time
import types
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk import trace as sdk_trace
from ray import cloudpickle  # what Ray pickles a driver script's functions and classes with

import otel_agentloop as oal
from otel_agentloop import WatchdogSettings, testing
from otel_agentloop import semconv as sc
from tests._support.spans import Traced

# A user's driver script: run as ``__main__``, so cloudpickle ships every function and class of it by value
# (with its closure and the globals its code names), never by reference.
USER_SCRIPT = textwrap.dedent('''
    import asyncio
    import otel_agentloop as oal
    from otel_agentloop.integrations.ray import traced_remote

    @oal.trace_tool("search")
    def search(q):
        return q.upper()

    @oal.trace_generate(model="m")
    async def generate(prompt):
        await asyncio.sleep(0)
        return prompt + "!"

    @oal.trace_reward
    def reward(text):
        return float(len(text))

    @oal.phase("tool_calls", tool="stream", attributes={"user.key": "v"})
    def stream(n):
        for i in range(n):
            yield i

    @oal.trace_generate
    async def tokens(n):
        for i in range(n):
            await asyncio.sleep(0)
            yield i

    @oal.trainer_phase("update_actor")
    def update():
        return "updated"

    class Worker:
        """An actor class with the Ray integration's methods."""

        @traced_remote
        def run(self, i):
            with oal.sample(i, step=7):
                return search("w")

        @traced_remote
        async def run_async(self, i):
            async with oal.sample(i, step=7):
                return await generate("w")

    class Agent:
        """An actor-like class: decorated methods, and methods that call decorated functions."""

        @oal.trace_tool("method_tool")
        def tool(self, x):
            return x * 2

        @oal.trace_generate(model="agent")
        async def think(self, x):
            await asyncio.sleep(0)
            return x

        async def episode(self, i):
            async with oal.sample(i, step=7):
                text = await generate(search("q"))
                streamed = list(stream(2))
                got = [t async for t in tokens(2)]
                return reward(text), self.tool(len(streamed)), await self.think(len(got))
''')


def _user_module() -> types.ModuleType:
    """``USER_SCRIPT`` compiled as ``__main__`` into a module no import can find."""
    module = types.ModuleType("__main__")
    exec(compile(USER_SCRIPT, "<driver script>", "exec"), module.__dict__)
    return module


def test_decorated_main_functions_and_classes_pickle_by_value_and_work_once_loaded(traced: Traced) -> None:
    user = _user_module()
    names = ("search", "generate", "reward", "stream", "tokens", "update", "Worker", "Agent")
    payload = cloudpickle.dumps([getattr(user, name) for name in names])
    loaded = dict(zip(names, cloudpickle.loads(payload), strict=True))
    for name in names[:-2]:  # by value: new functions (cloudpickle keeps one copy of a class per process)
        assert loaded[name] is not getattr(user, name)
    del user
    search, agent = loaded["search"], loaded["Agent"]()
    assert search.__wrapped__("a") == "A" and str(inspect.signature(search)) == "(q)"
    assert inspect.iscoroutinefunction(loaded["generate"]) and inspect.isasyncgenfunction(loaded["tokens"])
    assert inspect.isgeneratorfunction(loaded["stream"])

    assert asyncio.run(agent.episode(3)) == (2.0, 4, 2)
    with oal.sample(4, step=7):
        assert loaded["update"]() == "updated"
    worker = loaded["Worker"]()
    assert worker.run(5, otel_carrier=None) == "W" and asyncio.run(worker.run_async(6, otel_carrier=None)) == "w!"

    spans = traced.spans()
    by_name: dict[str, list[Any]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    (root,) = [s for s in by_name[sc.SAMPLE_SPAN] if s.attributes[sc.RL_SAMPLE_INDEX] == 3]
    expected = {
        "execute_tool search": sc.TOOL_CALLS,
        "execute_tool stream": sc.TOOL_CALLS,
        "execute_tool method_tool": sc.TOOL_CALLS,
        "text_completion m": sc.GENERATE,
        "text_completion": sc.GENERATE,
        "text_completion agent": sc.GENERATE,
        sc.REWARD_SPAN: sc.COMPUTE_SCORE,
    }
    for name, phase in expected.items():
        (span,) = [s for s in by_name[name] if s.attributes[sc.RL_SAMPLE_INDEX] == 3]
        assert span.attributes[sc.RL_PHASE] == phase and span.attributes[sc.RL_STEP] == 7
        assert span.parent is not None and span.parent.span_id == root.context.span_id
    assert by_name["execute_tool stream"][0].attributes["user.key"] == "v"
    for index, name in ((5, "execute_tool search"), (6, "text_completion m")):  # through traced_remote
        (span,) = [s for s in spans if s.attributes.get(sc.RL_SAMPLE_INDEX) == index and s.name == name]
        assert span.attributes[sc.RL_STEP] == 7
    (train,) = by_name[sc.TRAINER_PHASE_SPAN_PREFIX + "update_actor"]
    assert train.attributes[sc.RL_PHASE_TRAIN] == "update_actor"


def test_pickled_copies_run_untraced_when_tracing_is_off() -> None:
    user = _user_module()
    search, stream, agent_cls = cloudpickle.loads(cloudpickle.dumps([user.search, user.stream, user.Agent]))
    assert search("x") == "X" and list(stream(3)) == [0, 1, 2]
    assert asyncio.run(agent_cls().episode(0)) == (2.0, 4, 2)


def test_one_sample_object_entered_by_two_threads_at_once(traced: Traced, caplog) -> None:
    """Each thread sees its own sample only while inside it; leaving restores each thread's context, in
    whatever order the threads leave."""
    shared = oal.sample(5, step=1)
    both_in, first_left = threading.Barrier(2, timeout=10), threading.Event()
    seen: dict[str, Any] = {}

    @oal.trace_tool("probe")
    def probe() -> None:
        return None

    def run(name: str) -> None:
        try:
            with shared as handle:
                both_in.wait()  # both threads inside the same object at once
                seen[name + ".inside"] = oal.current_sample() is handle
                probe()
                if name == "second":
                    assert first_left.wait(10)  # the first thread leaves while this one is still inside
                    seen["second.after_first_left"] = oal.current_sample() is handle
                    probe()
            seen[name + ".after"] = (oal.current_sample(), trace.get_current_span().get_span_context().is_valid)
            seen[name + ".handle"] = handle
            if name == "first":
                first_left.set()
        except BaseException as exc:  # pragma: no cover - reported by the asserts below
            seen[name + ".error"] = exc
            first_left.set()

    threads = [threading.Thread(target=run, args=(name,)) for name in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not any(key.endswith(".error") for key in seen), seen
    assert seen["first.inside"] and seen["second.inside"] and seen["second.after_first_left"]
    assert seen["first.after"] == (None, False) and seen["second.after"] == (None, False)
    assert seen["first.handle"] is not seen["second.handle"]
    assert "internal error" not in caplog.text

    roots = traced.by_name(sc.SAMPLE_SPAN)
    assert len(roots) == 2 and all(r.end_time is not None and r.attributes[sc.RL_SAMPLE_INDEX] == 5 for r in roots)
    root_ids = {r.context.span_id for r in roots}
    probes = traced.by_name("execute_tool probe")
    assert len(probes) == 3 and all(p.parent is not None and p.parent.span_id in root_ids for p in probes)
    for handle in (seen["first.handle"], seen["second.handle"]):  # each thread's probes below its own sample
        own = handle.span.get_span_context().span_id
        assert any(p.parent.span_id == own for p in probes)


def test_one_step_object_entered_by_two_threads_at_once(traced: Traced) -> None:
    shared = oal.step(3)
    both_in = threading.Barrier(2, timeout=10)
    after: list[Any] = []

    def run() -> None:
        with shared as state:
            both_in.wait()
            assert oal.current_step() is state
            both_in.wait()
        after.append(oal.current_step())

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert after == [None, None]
    assert len(traced.by_name(sc.STEP_SPAN)) == 2


_PROBE: contextvars.ContextVar[str] = contextvars.ContextVar("probe", default="outside")


def test_bind_runs_async_generator_and_async_generator_bodies_in_the_bound_context(traced: Traced) -> None:
    """``bind`` captured inside a sample: called outside it, every step of the body still runs inside."""
    seen: list[tuple[str, Any, str]] = []

    @oal.trace_tool("inner")
    def inner() -> None:
        return None

    def look(where: str) -> None:
        seen.append((where, oal.current_sample(), _PROBE.get()))

    async def coro(x: int) -> int:
        look("async.start")
        await asyncio.sleep(0)
        look("async.resumed")
        inner()
        _PROBE.set("changed by the body")
        return x + 1

    def gen(n: int):
        look("gen.start")
        total = 0
        for i in range(n):
            try:
                total += yield i
            except KeyError:
                look("gen.thrown")
                total += 100
        look("gen.end")
        inner()
        return total

    async def agen(n: int):
        try:
            for i in range(n):
                await asyncio.sleep(0)
                look("agen.step")
                got = yield i
                if got is not None:
                    look("agen.sent")
        finally:
            look("agen.finally")
            inner()

    def returns_coro(x: int) -> Any:
        return coro(x)

    token = _PROBE.set("bound")
    with oal.sample(9, step=2) as handle:
        b_coro, b_gen, b_agen, b_returns = oal.bind(coro), oal.bind(gen), oal.bind(agen), oal.bind(returns_coro)
    _PROBE.reset(token)

    async def consume() -> tuple[int, int, list[int]]:
        a = await b_coro(1)
        c = await b_returns(2)
        items = []
        stream = b_agen(5)
        items.append(await stream.__anext__())
        items.append(await stream.asend("x"))
        await stream.aclose()  # closed early: its finally runs in the bound context too
        return a, c, items

    assert asyncio.run(consume()) == (2, 3, [0, 1])
    g = b_gen(3)
    assert next(g) == 0 and g.send(5) == 1 and g.throw(KeyError("k")) == 2
    with pytest.raises(StopIteration) as stop:
        g.send(1)
    assert stop.value.value == 106
    assert _PROBE.get() == "outside" and oal.current_sample() is None

    wheres = [w for w, _, _ in seen]
    assert wheres.count("async.start") == 2 and "gen.thrown" in wheres and "agen.finally" in wheres
    assert "agen.sent" in wheres
    for where, sample, probe in seen:
        assert sample is handle and probe == "bound", where
    root = traced.by_name(sc.SAMPLE_SPAN)[0]
    spans = traced.by_name("execute_tool inner")
    assert len(spans) == 4
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in spans)
    assert all(s.attributes[sc.RL_SAMPLE_INDEX] == 9 for s in spans)
    assert inspect.iscoroutinefunction(b_coro)  # the kind is kept and inspect.isasyncgenfunction(b_agen)
    assert inspect.isgeneratorfunction(b_gen) and b_coro.__wrapped__ is coro


def test_bind_keeps_generator_close_and_async_cancellation() -> None:
    closed: list[str] = []

    def gen():
        try:
            yield 1
            yield 2
        finally:
            closed.append(_PROBE.get())

    async def slow() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            closed.append("cancelled:" + _PROBE.get())
            raise

    token = _PROBE.set("bound")
    b_gen, b_slow = oal.bind(gen), oal.bind(slow)
    _PROBE.reset(token)
    g = b_gen()
    assert next(g) == 1
    g.close()

    async def main() -> None:
        task = asyncio.ensure_future(b_slow())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert closed == ["bound", "cancelled:bound"]


class SteppedWallClock:
    """The wall clock as the SDK (``opentelemetry.sdk.trace.time_ns``) and ``time`` read it, stepped by hand
    like an NTP step or an operator's ``date -s``; the monotonic clock runs on untouched."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.offset_ns = 0
        self._real = time.time_ns
        monkeypatch.setattr(sdk_trace, "time_ns", self.time_ns)
        monkeypatch.setattr(time, "time_ns", self.time_ns)
        monkeypatch.setattr(time, "time", lambda: self.time_ns() / 1e9)

    def time_ns(self) -> int:
        return self._real() + self.offset_ns

    def step(self, seconds: float) -> None:
        self.offset_ns += int(seconds * 1e9)


@pytest.mark.parametrize("step_s", [-10.0, 3600.0])
def test_phase_durations_ignore_a_wall_clock_step_and_timestamps_stay_wall_clock(monkeypatch, step_s) -> None:
    clock = SteppedWallClock(monkeypatch)
    clock.step(-step_s / 2)  # timestamps are the (stepped) wall clock, not a monotonic reading
    with testing.capture(watchdog=False) as captured:

        @oal.trace_tool("sleepy")
        def sleepy() -> None:
            clock.step(step_s)  # mid-phase
            time.sleep(0.1)

        @oal.trace_generate
        async def generate() -> None:
            await asyncio.sleep(0.05)

        wall_before = clock.time_ns()
        t0 = time.perf_counter()
        with oal.step(1), oal.sample(0):
            asyncio.run(generate())
            t1 = time.perf_counter()
            sleepy()
            t2 = time.perf_counter()
        wall_after = clock.time_ns()
        metrics = captured.handle.metrics.collect(1)
        spans = {s.name: s for s in captured.spans()}

    tool_s, generate_s = metrics["agent_loop/tool_calls/max"], metrics["agent_loop/generate_sequences/max"]
    assert 0.1 <= tool_s <= t2 - t1, tool_s  # the real duration: between the sleep and the caller's bracket
    assert 0.05 <= generate_s <= t1 - t0, generate_s
    tool, root = spans["execute_tool sleepy"], spans[sc.SAMPLE_SPAN]
    assert 0.1e9 <= tool.end_time - tool.start_time <= (t2 - t1) * 1e9
    assert 0.15e9 <= root.end_time - root.start_time <= (t2 - t0) * 1e9
    assert wall_before <= root.start_time <= wall_before + (t1 - t0) * 1e9  # started on the wall clock
    assert root.start_time <= tool.start_time and tool.end_time <= root.end_time  # one timeline per sample
    assert abs((wall_after - wall_before) / 1e9 - (t2 - t0) - step_s) < 1.0


def test_a_wall_clock_step_forward_reports_no_hung_phase(monkeypatch) -> None:
    """+3600 s on the wall clock while a tool runs: ages come from the monotonic clock, so the watchdog (a
    5 s threshold, checking every 50 ms, the shortest interval allowed) stays quiet
    and the live view shows the real age."""
    clock = SteppedWallClock(monkeypatch)
    settings = WatchdogSettings(interval_s=0.05, default_s=5.0, min_s=5.0)
    with testing.capture(watchdog=settings) as captured:
        handle = captured.handle
        ages: list[tuple[float, float]] = []

        @oal.trace_tool("sleepy")
        def sleepy() -> None:
            checks = handle.live.checks
            clock.step(3600)
            deadline = time.monotonic() + 5
            while handle.live.checks < checks + 5 and time.monotonic() < deadline:  # the watchdog ran meanwhile
                time.sleep(0.02)
            assert handle.live.checks >= checks + 5
            (running,) = handle.inflight()
            ages.append((running.phase_age_s, running.sample_age_s))

        with oal.step(1), oal.sample(0):
            sleepy()
        metrics = handle.metrics.collect(1)
        assert handle.live.reports == 0
        assert "agent_loop/watchdog/slow" not in metrics and "agent_loop/watchdog/hung" not in metrics
        assert not captured.by_name(sc.SAMPLE_SPAN + sc.SNAPSHOT_SUFFIX)
    ((phase_age, sample_age),) = ages
    assert 0 <= phase_age <= sample_age < 5
