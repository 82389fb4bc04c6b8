"""The recording fast path gives users the same spans as the SDK path (issue 20): each scenario runs twice, in
fresh configurations with ``OTEL_AGENTLOOP_FAST_PATH`` true then false, and what a user's exporter, a user's
span processor, our OTLP-JSON file and a real OTLP/gRPC receiver got is compared field by field (ids by
position, times by order; see ``tests/_support/fast_path_parity.py``), with the step metrics and the in-flight view."""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import AsyncGenerator, Generator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.core._state import state
from tests._support import REPO_ROOT
from tests._support.fast_path_parity import (
    MODES,
    SOURCES,
    RawReceiver,
    assert_same,
    check_processor_starts,
    check_slowest,
    compare_runs,
    end_order,
    from_proto,
    mask_metrics,
    normalise,
    parse_json_line,
    per_launch,
    run_both,
)
from tests._support.otlp_receiver import start_grpc, wait_for

ROOT = str(REPO_ROOT)

# -- the user's code --------------------------------------------------------------------------------------------


class BoomError(RuntimeError):
    pass


@oal.trace_generate(model="m")
async def generate(delay: float = 0.0, tokens: int | None = None) -> str:
    await asyncio.sleep(delay)
    if tokens is not None:
        oal.record_generation(input_tokens=3, output_tokens=tokens, finish_reason="stop", num_preempted=1)
    return "text"


@oal.trace_tool("search")
def search(q: str, fail: bool = False) -> str:
    if fail:
        raise BoomError("search failed")
    return q.upper()


@oal.trace_reward
def reward(text: str) -> float:
    return float(len(text))


@oal.phase("tool_calls", tool="stream")
def stream(n: int) -> Generator[int, Any, str]:
    total = 0
    try:
        for i in range(n):
            got = yield i
            total += got or 0
    except BoomError:
        yield -1
    return f"sum={total}"


@oal.phase("generate", model="tokens")
async def tokens(n: int) -> AsyncGenerator[int, Any]:
    try:
        for i in range(n):
            got = yield i
            await asyncio.sleep(0)
            if got:
                yield got
    except BoomError:
        yield -1


@oal.trace_tool("later")
def returns_coroutine(x: int) -> Any:
    async def later() -> int:
        await asyncio.sleep(0.001)
        return x + 1

    return later()


@oal.trace_tool("future")
def returns_future(loop: asyncio.AbstractEventLoop, x: int) -> asyncio.Future[int]:
    future: asyncio.Future[int] = loop.create_future()
    loop.call_later(0.001, future.set_result, x)
    return future


@oal.trace_tool("pool")
def returns_concurrent(pool: concurrent.futures.Executor, x: int) -> concurrent.futures.Future[int]:
    return pool.submit(time.sleep, 0.001)


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def check(runs: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Every destination compared across the two modes; the processor calls as each mode promises; the order in
    which spans ended the same."""
    spans = compare_runs(runs, **kwargs)
    check_processor_starts(runs)
    if kwargs.get("timeline", True):
        assert end_order(runs["fast"]) == end_order(runs["sdk"])
    return spans


def names(spans: list[dict[str, Any]]) -> list[str]:
    return [s["name"] for s in spans]


def attr(span: dict[str, Any], key: str) -> Any:
    return dict(span["attributes"])[key][1]


# -- every wrapper kind ---------------------------------------------------------------------------------------


def test_sync_and_async_phases_in_a_sample_with_metrics_and_inflight(tmp_path, monkeypatch) -> None:
    def scenario(handle: oal.Handle) -> Any:
        seen: dict[str, Any] = {}

        async def main() -> None:
            with oal.step(1):

                async def one(i: int) -> None:
                    async with oal.sample(i, rollout_n=0):
                        await generate(0.05 if i == 1 else 0.005, tokens=4)
                        if i == 0:
                            seen["inflight"] = [
                                (s.step, s.validate, s.sample_index, s.rollout_n, s.phase, s.tool, s.overdue, s.worker)
                                for s in handle.inflight()
                            ]
                        search("q")
                        reward("abc")
                        oal.record_sample(reward=1.5, prompt_length=7, response_length=9, turns=1)

                await asyncio.gather(*(one(i) for i in range(3)))

        _run(main())
        seen["metrics"] = handle.metrics.collect(1)
        return seen

    runs = run_both(scenario, tmp_path, monkeypatch)
    spans = check(runs)
    sample = ["rl.sample", "text_completion m", "execute_tool search", "rl.reward"]
    assert sorted(names(spans["exporter"])) == sorted(["rl.step", *sample, *sample, *sample, "rl.step.summary"])
    fast, sdk = runs["fast"].result, runs["sdk"].result
    assert fast["inflight"] == sdk["inflight"]
    assert sorted(x[2] for x in fast["inflight"]) == [0, 1, 2]  # every sample running, sample 1 still generating
    assert mask_metrics(fast["metrics"]) == mask_metrics(sdk["metrics"])
    # which sample was the slowest (sample 1's slow generation, unless load makes another one slower): in each
    # run, the one whose spans took longest, named by its metrics too
    for mode, run in runs.items():
        assert check_slowest(run.canonical("exporter"), mode) == 1, mode
        summary = next(s for s in run.exported if s.name == "rl.step.summary")
        which = json.loads(str((summary.attributes or {})["rl.step.summary"]))["slowest"][0]
        assert run.result["metrics"]["agent_loop/slowest/sample_index"] == which, mode
    assert fast["metrics"]["agent_loop/num_samples"] == 3.0


def test_generators_with_send_throw_close(tmp_path, monkeypatch) -> None:
    def scenario(handle: oal.Handle) -> Any:
        out: list[Any] = []
        with oal.sample(0, step=2):
            gen = stream(5)
            out.append(next(gen))
            out.append(gen.send(10))
            out.append(gen.throw(BoomError("stop")))
            gen.close()
            gen2 = stream(2)
            out.append(list(gen2))
            gen3 = stream(3)
            out.append(next(gen3))
            try:
                gen3.throw(ValueError("user"))
            except ValueError as exc:
                out.append(repr(exc))

        async def agen() -> None:
            async with oal.sample(1, step=2):
                g = tokens(4)
                out.append(await g.__anext__())
                out.append(await g.asend(7))
                out.append(await g.athrow(BoomError("x")))
                await g.aclose()
                out.append([x async for x in tokens(2)])
                g2 = tokens(3)
                out.append(await g2.__anext__())
                try:
                    await g2.athrow(ValueError("async user"))
                except ValueError as exc:
                    out.append(repr(exc))

        _run(agen())
        return out

    runs = run_both(scenario, tmp_path, monkeypatch)
    spans = check(runs)
    assert runs["fast"].result == runs["sdk"].result
    statuses = [
        (s["name"], s["status"][0], attr(s, sc.RL_SAMPLE_INDEX)) for s in spans["exporter"] if s["name"] != "rl.sample"
    ]
    assert statuses.count(("execute_tool stream", "ERROR", 0)) == 1
    assert statuses.count(("text_completion tokens", "ERROR", 1)) == 1
    assert len(statuses) == 6


def test_sync_calls_returning_a_coroutine_or_futures(tmp_path, monkeypatch) -> None:
    def scenario(handle: oal.Handle) -> Any:
        async def main() -> list[Any]:
            loop = asyncio.get_running_loop()
            async with oal.sample(0, step=1):
                a = await returns_coroutine(1)
                b = await returns_future(loop, 2)
                with concurrent.futures.ThreadPoolExecutor(1) as pool:
                    fut = returns_concurrent(pool, 3)
                    fut.result(5)
                    await asyncio.sleep(0.01)  # the done callback has ended the span
                return [a, b]

        return _run(main())

    runs = run_both(scenario, tmp_path, monkeypatch)
    spans = check(runs, timeline=False)  # the concurrent future's done callback runs on the pool's thread
    assert runs["fast"].result == runs["sdk"].result == [2, 2]
    assert sorted(names(spans["exporter"])) == [
        "execute_tool future",
        "execute_tool later",
        "execute_tool pool",
        "rl.sample",
    ]
    assert all(s["status"][0] == "UNSET" for s in spans["exporter"])


def test_span_blocks_sync_and_async(tmp_path, monkeypatch) -> None:
    def scenario(handle: oal.Handle) -> Any:
        with oal.sample(3, rollout_n=1, step=4):
            with oal.span("tool_calls", tool="block", attributes={"user.key": "v", "user.n": 2}) as s:
                s.set_attribute("inside", True)

            async def inner() -> None:
                async with oal.span("generate", model="blk", operation="chat") as s2:
                    s2.set_attribute("inside.async", 1.5)
                    search("nested")  # a phase inside a phase
                    with oal.span("reward"):
                        pass
                async with oal.span("reward"):
                    pass

            _run(inner())
        with oal.span("tool_calls", tool="outside"):  # outside any sample
            pass

    runs = run_both(scenario, tmp_path, monkeypatch)
    spans = check(runs)
    assert names(spans["exporter"]) == [
        "rl.sample",
        "execute_tool block",
        "chat blk",
        "execute_tool search",
        "rl.reward",
        "rl.reward",
        "execute_tool outside",
    ]
    chat = spans["exporter"][2]
    assert [s["parent_id"] for s in spans["exporter"][3:5]] == [chat["span_id"]] * 2  # phases inside a phase


def test_trainer_phases_block_decorator_nested_with_timing_raw(tmp_path, monkeypatch) -> None:
    def scenario(handle: oal.Handle) -> Any:
        timing: dict[str, float] = {}

        @oal.trainer_phase("update_actor", timing)
        def update() -> int:
            with oal.trainer_phase("inner", timing):
                time.sleep(0.002)
            return 1

        @oal.trainer_phase("adv", timing)
        async def adv() -> int:
            await asyncio.sleep(0.001)
            return 2

        with oal.step(5):
            with oal.trainer_phase("gen", timing) as s:
                s.set_attribute("user.gen", "x")
                with oal.trainer_phase("reward"):
                    pass
            update()
            _run(adv())
        with oal.trainer_phase("testing", timing):  # outside a step
            pass
        return sorted(timing)

    runs = run_both(scenario, tmp_path, monkeypatch)
    spans = check(runs)
    assert runs["fast"].result == runs["sdk"].result == ["adv", "gen", "inner", "testing", "update_actor"]
    assert names(spans["exporter"]) == [
        "rl.step",
        "rl.train.gen",
        "rl.train.reward",
        "rl.train.update_actor",
        "rl.train.inner",
        "rl.train.adv",
        "rl.train.testing",
    ]


@pytest.mark.parametrize("trace_per", ["sample", "step"])
def test_step_and_samples_by_trace_mode(tmp_path, monkeypatch, trace_per) -> None:
    def scenario(handle: oal.Handle) -> Any:
        async def main() -> None:
            async with oal.step(7, trace_per=trace_per, attributes={"user.step": "s"}):

                async def one(i: int) -> None:
                    async with oal.sample(i, rollout_n=i % 2, worker="w1", attributes={"user.s": i}):
                        await generate(0.03 if i == 2 else 0.001)  # the slowest: deterministic

                await asyncio.gather(*(one(i) for i in range(3)))
            with oal.step(8, validate=True, trace_per=trace_per), oal.sample(0):
                search("v")

        _run(main())
        return mask_metrics(handle.metrics.collect(7)), mask_metrics(handle.metrics.collect(8, validate=True))

    runs = run_both(scenario, tmp_path, monkeypatch)
    spans = check(runs)
    assert runs["fast"].result == runs["sdk"].result
    samples = [s for s in spans["exporter"] if s["name"] == "rl.sample"]
    traces = {s["trace_id"] for s in spans["exporter"] if s["name"] in ("rl.step", "rl.sample")}
    assert len(traces) == (6 if trace_per == "sample" else 2)
    assert all(bool(s["links"]) is (trace_per == "sample") for s in samples)


def test_bind_into_threads_and_executors(tmp_path, monkeypatch) -> None:
    def scenario(handle: oal.Handle) -> Any:
        with oal.sample(0, step=1):
            t = threading.Thread(target=oal.bind(search), args=("thread",))
            t.start()
            t.join()
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                assert pool.submit(oal.bind(reward), "pool").result() == 4.0

            async def main() -> str:
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(None, oal.bind(search), "loop")

            assert _run(main()) == "LOOP"

    runs = run_both(scenario, tmp_path, monkeypatch)
    spans = check(runs)
    sample = spans["exporter"][0]
    assert sample["name"] == "rl.sample"
    assert all(
        s["parent_id"] == sample["span_id"] and s["trace_id"] == sample["trace_id"] for s in spans["exporter"][1:]
    )


def test_user_exception_and_cancellation(tmp_path, monkeypatch) -> None:
    def scenario(handle: oal.Handle) -> Any:
        out = []
        with oal.step(1):
            try:
                with oal.sample(0):
                    search("ok")
                    search("bad", fail=True)
            except BoomError as exc:
                out.append(("raised", str(exc), type(exc).__name__))

            async def main() -> None:
                async with oal.sample(1):
                    task = asyncio.create_task(generate(10))
                    await asyncio.sleep(0.01)
                    task.cancel()
                    try:
                        await task
                    except asyncio.CancelledError:
                        out.append(("cancelled",))

            _run(main())
        out.append(mask_metrics(handle.metrics.collect(1)))
        return out

    runs = run_both(scenario, tmp_path, monkeypatch)
    spans = check(runs)
    assert runs["fast"].result == runs["sdk"].result
    assert runs["fast"].result[0] == ("raised", "search failed", "BoomError")
    by_name = {(s["name"], s["status"][0]) for s in spans["exporter"]}
    assert ("execute_tool search", "ERROR") in by_name and ("text_completion m", "UNSET") in by_name
    failed = next(s for s in spans["exporter"] if s["status"][0] == "ERROR" and s["name"] == "execute_tool search")
    assert attr(failed, sc.ERROR_TYPE) == "tests.core.test_fast_path_parity.BoomError"
    assert [e[0] for e in failed["events"]] == ["exception"]


def test_a_users_sdk_span_inside_a_phase_is_its_child(tmp_path, monkeypatch) -> None:
    def scenario(handle: oal.Handle) -> Any:
        tracer = handle.provider.get_tracer("user.lib", "1.0")
        out = {}

        @oal.trace_tool("calls_http")
        def tool() -> None:
            phase = trace.get_current_span().get_span_context()
            with tracer.start_as_current_span(
                "GET /x", kind=trace.SpanKind.CLIENT, attributes={"http.method": "GET"}
            ) as s:
                ctx = s.get_span_context()
                out["same_trace"] = ctx.trace_id == phase.trace_id
                out["parent_is_phase"] = s.parent.span_id == phase.span_id  # type: ignore[attr-defined]
                with tracer.start_as_current_span("inner") as s2:
                    s2.add_event("e", {"k": 1})

        with oal.step(1), oal.sample(0):
            tool()
            time.sleep(0.002)  # siblings on two clocks' anchors (the SDK path's can be ~50 us apart)
            with tracer.start_as_current_span("user.in.sample"):
                search("x")
        return out

    runs = run_both(scenario, tmp_path, monkeypatch)
    spans = check(runs)  # also: on the fast path every child lies within its parent (see compare_runs)
    assert runs["fast"].result == runs["sdk"].result == {"same_trace": True, "parent_is_phase": True}
    by_name = {s["name"]: s for s in spans["exporter"]}
    assert by_name["GET /x"]["parent_id"] == by_name["execute_tool calls_http"]["span_id"]
    assert by_name["GET /x"]["kind"] == "CLIENT" and by_name["GET /x"]["scope"][0] == "user.lib"
    assert by_name["execute_tool search"]["parent_id"] == by_name["user.in.sample"]["span_id"]


def test_record_generation_sample_and_content(tmp_path, monkeypatch) -> None:
    def scenario(handle: oal.Handle) -> Any:
        state.content.truncated = 0  # a process-wide counter: each run counts its own

        async def main() -> None:
            async with oal.sample(2, rollout_n=1, step=3) as s:
                await generate(tokens=5)
                await generate(tokens=6)
                s.record_content(prompt="the prompt", response="x" * 50)
                oal.record_sample(reward=0.5, num_preempted=4, turns=2, prompt_length=10, response_length=20)

        _run(main())
        return mask_metrics(handle.metrics.collect(3))

    runs = run_both(scenario, tmp_path, monkeypatch, capture_content=True, max_content_chars=16)
    spans = check(runs)
    assert runs["fast"].result == runs["sdk"].result
    root = next(s for s in spans["exporter"] if s["name"] == sc.SAMPLE_SPAN)
    assert attr(root, sc.RL_PROMPT_CONTENT) == "the prompt" and attr(root, sc.RL_NUM_PREEMPTED) == 4
    assert runs["fast"].result["agent_loop/telemetry/content_truncated"] == 1.0


def test_span_api_on_the_current_span_inside_a_phase(tmp_path, monkeypatch) -> None:
    def scenario(handle: oal.Handle) -> Any:
        @oal.trace_tool("api")
        def tool() -> None:
            span = trace.get_current_span()
            span.set_attribute("user.str", "s")
            span.set_attribute("user.int", 3)
            span.set_attribute("user.float", 2.5)
            span.set_attribute("user.bool", False)
            span.set_attribute("user.list", ["a", "b"])
            span.set_attribute("user.tuple", (1, 2))
            span.set_attribute("user.str", "re-set")
            span.set_attributes({"user.many.1": 1, "user.many.2": "2"})
            span.add_event("checkpoint", {"n": 1, "tags": ("x",)})
            span.add_event("bare")
            span.record_exception(ValueError("handled"), {"extra": "e"})
            span.update_name("renamed tool")
            span.set_status(Status(StatusCode.ERROR, "user said so"))
            span.set_status(StatusCode.OK)  # allowed after ERROR
            span.set_status(StatusCode.ERROR, "ignored after OK")
            span.set_attribute(sc.RL_SAMPLE_INDEX, 99)  # the user overwrites our identity

        @oal.trace_reward
        def scored() -> None:
            trace.get_current_span().set_status(StatusCode.ERROR, "bad reward")

        with oal.sample(1, step=1):
            tool()
            scored()

    runs = run_both(scenario, tmp_path, monkeypatch)
    spans = check(runs)
    tool = next(s for s in spans["exporter"] if s["name"] == "renamed tool")
    assert tool["status"] == ("OK", None) or tool["status"][0] == "OK"
    assert [e[0] for e in tool["events"]] == ["checkpoint", "bare", "exception"]


def test_trace_flags_match_the_sdk_with_the_random_trace_id_flag(tmp_path, monkeypatch) -> None:
    """The SDK (1.45) sets W3C level 2's random-trace-id flag (0x02) on every trace it starts with its random id
    generator, and children inherit it: the span flags exported, and the ``traceparent`` a user's HTTP client
    sends from inside a phase, are ``03``. The fast path must give the same."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    def scenario(handle: oal.Handle) -> Any:
        carriers: dict[str, str] = {}
        tracer = handle.provider.get_tracer("user.http")

        @oal.trace_tool("http")
        def tool() -> None:
            carrier: dict[str, str] = {}
            TraceContextTextMapPropagator().inject(carrier)
            carriers["phase"] = carrier["traceparent"][-2:]
            with tracer.start_as_current_span("GET"):
                carrier = {}
                TraceContextTextMapPropagator().inject(carrier)
                carriers["user_span"] = carrier["traceparent"][-2:]

        with oal.step(1), oal.sample(0):
            tool()
        return carriers

    runs = run_both(scenario, tmp_path, monkeypatch)
    check(runs, ignore=())  # the flag compared too, at every destination
    assert runs["fast"].result == runs["sdk"].result == {"phase": "03", "user_span": "03"}


# -- limits and sampling ----------------------------------------------------------------------------------------


def test_attribute_count_and_length_limits_keep_identity(tmp_path, monkeypatch) -> None:
    def scenario(handle: oal.Handle) -> Any:
        @oal.phase("tool_calls", tool="wide", attributes={f"user.static.{i}": i for i in range(3)})
        def wide() -> None:
            span = trace.get_current_span()
            for i in range(30):
                span.set_attribute(f"user.dyn.{i}", "y" * 40)
            span.add_event("ev", {f"k{i}": "z" * 40 for i in range(30)})

        step_attrs = {f"user.step.{i}": "w" * 40 for i in range(25)}
        with oal.step(1, attributes=step_attrs), oal.sample(0, attributes={f"user.sample.{i}": i for i in range(25)}):
            wide()
            search("a" * 40)

    env = {"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "4", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "8"}
    runs = run_both(scenario, tmp_path, monkeypatch, env=env)
    spans = check(runs, ignore=())  # dropped_attributes compared too: both count each eviction when it happens
    dropped = {
        mode: {(s["name"], s["dropped_attributes"]) for s in run.canonical(source)}
        for mode, run in runs.items()
        for source in SOURCES
    }
    # the SDK path counts one more eviction per identity attribute it writes back (rl.phase, rl.sample.index,
    # rl.validate, rl.step); the fast path bounds as it is written and writes the identity back the same way
    wide = {mode: {n for name, n in pairs if name == "execute_tool wide"} for mode, pairs in dropped.items()}
    assert wide == {"fast": {23}, "sdk": {23}}, wide
    for s in spans["exporter"]:
        keys = dict(s["attributes"])
        if s["name"] in ("rl.sample", "execute_tool wide", "execute_tool search"):
            assert sc.RL_SAMPLE_INDEX in keys and sc.RL_STEP in keys, (s["name"], keys)
        if s["name"] == "execute_tool wide":
            assert all(len(v[1]) <= 8 for _, v in s["attributes"] if isinstance(v[1], str))


def test_attributes_over_the_limit_set_again_keep_identity(tmp_path, monkeypatch) -> None:
    """More attributes than the limit, some set twice: the kept set and ``dropped_attributes`` are the same (both
    paths evict as each attribute is set)."""

    def scenario(handle: oal.Handle) -> Any:
        @oal.trace_tool("again")
        def again() -> None:
            span = trace.get_current_span()
            for round_ in range(2):
                for i in range(24):
                    span.set_attribute(f"user.k{i}", round_)

        with oal.sample(0, step=1):
            again()

    runs = run_both(scenario, tmp_path, monkeypatch, env={"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "2"})
    spans = check(runs, ignore=["random_trace_id"])
    dropped = {
        mode: {s["dropped_attributes"] for s in run.canonical(source) if s["name"] == "execute_tool again"}
        for mode, run in runs.items()
        for source in SOURCES
    }
    # 24 user keys set twice + 6 of ours over a limit of 2 + 16 (the library's room): an eviction per set over
    # the limit, on both paths
    assert dropped == {"fast": {40}, "sdk": {40}}, dropped
    again = next(s for s in spans["exporter"] if s["name"] == "execute_tool again")
    assert sc.RL_SAMPLE_INDEX in dict(again["attributes"])


def _many_samples(n: int, slow: int | None = None) -> Any:
    def scenario(handle: oal.Handle) -> Any:
        async def main() -> None:
            with oal.step(1):

                async def one(i: int) -> None:
                    async with oal.sample(i):
                        await generate(0.03 if i == slow else 0.0)
                        search("q", fail=(i == 3))

                await asyncio.gather(*(one(i) for i in range(n)), return_exceptions=True)

        _run(main())
        metrics = handle.metrics.collect(1)
        return {"metrics": mask_metrics(metrics), "which": metrics["agent_loop/slowest/sample_index"]}

    return scenario


@pytest.mark.parametrize(
    ("env", "kwargs"),
    [
        ({"OTEL_TRACES_SAMPLER": "always_off"}, {}),
        ({}, {"max_exported_samples_per_step": 2}),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.0"}, {"keep_slowest": 1}),
    ],
    ids=["always_off", "budget", "ratio_zero"],
)
def test_samplers_and_budget_export_the_same_samples(tmp_path, monkeypatch, env, kwargs) -> None:
    runs = run_both(_many_samples(6, slow=4), tmp_path, monkeypatch, env=env, **kwargs)
    check(runs, timeline=False)  # the samples that are not exported are released at collection
    # the slowest (sample 4's slow generation, unless load makes another one slower in a run) is kept in each run
    which = {mode: int(run.result.pop("which")) for mode, run in runs.items()}
    assert runs["fast"].result == runs["sdk"].result
    assert runs["fast"].result["metrics"]["agent_loop/num_samples"] == 6.0  # every sample recorded, exported or not
    for mode, run in runs.items():
        exported = {(s.attributes or {})[sc.RL_SAMPLE_INDEX] for s in run.exported if s.name == "rl.sample"}
        assert {3, which[mode]} <= exported, (mode, exported, which)  # the error and the slowest, in every mode


def test_trace_id_ratio_samples_the_configured_fraction(tmp_path, monkeypatch) -> None:
    """``traceidratio`` 0.5: the share of samples exported is 0.5 in both modes (binomial, 400 samples: 5 sigma
    is +-50), whatever happens to a sample the sampler drops."""

    def scenario(handle: oal.Handle) -> Any:
        with oal.step(1):
            for i in range(400):
                with oal.sample(i):
                    search("q")

    env = {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"}
    runs = run_both(scenario, tmp_path, monkeypatch, env=env, keep_slowest=0, keep_errors=False)
    exported = {mode: sum(1 for s in run.exported if s.name == "rl.sample") for mode, run in runs.items()}
    assert 150 <= exported["sdk"] <= 250, exported
    assert 150 <= exported["fast"] <= 250, exported


# -- the watchdog -----------------------------------------------------------------------------------------------


@oal.trace_tool("hang")
async def hang(release: asyncio.Event) -> None:
    await release.wait()


def test_watchdog_snapshot_of_a_hung_phase(tmp_path, monkeypatch) -> None:
    def scenario(handle: oal.Handle) -> Any:
        out: dict[str, Any] = {}

        async def main() -> None:
            release = asyncio.Event()
            with oal.step(3):

                async def hung() -> None:
                    async with oal.sample(5, rollout_n=2):
                        await generate(0.001)
                        await hang(release)

                task = asyncio.create_task(hung())
                deadline = time.monotonic() + 10
                while not handle.stats.get("watchdog_snapshots") and not any(s.overdue for s in handle.inflight()):
                    assert time.monotonic() < deadline, "no report"
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.05)
                out["inflight"] = [(s.sample_index, s.phase, s.tool, s.overdue) for s in handle.inflight()]
                out["metrics"] = mask_metrics(handle.metrics.collect(3))
                release.set()
                await task

        _run(main())
        return out

    watchdog = oal.WatchdogSettings(interval_s=0.1, thresholds_s={"tool:hang": 0.3})
    runs = run_both(scenario, tmp_path, monkeypatch, watchdog=watchdog)
    spans = check(runs, masked=[sc.RL_SNAPSHOT_PHASE_AGE])
    assert runs["fast"].result == runs["sdk"].result
    assert runs["fast"].result["inflight"] == [(5, sc.TOOL_CALLS, "hang", True)]
    snaps = [s for s in spans["exporter"] if s["name"].endswith(sc.SNAPSHOT_SUFFIX)]
    assert len(snaps) == 1


# -- Ray: a driver script's code, in __main__, on a real local cluster --------------------------------------------

RAY_DRIVER = textwrap.dedent('''
    """A user's Ray driver: decorated code in __main__, a task and an actor, the step carried across."""
    import asyncio
    import json
    import os
    import sys

    import ray

    import otel_agentloop as oal
    from otel_agentloop.integrations import ray as oal_ray


    @oal.trace_tool("search")
    def search(q):
        return q.upper()


    @oal.trace_generate(model="m")
    async def generate(prompt):
        await asyncio.sleep(0.001)
        oal.record_generation(output_tokens=len(prompt), finish_reason="stop")
        return prompt + "!"


    @oal.phase("tool_calls", tool="stream")
    def stream(n):
        for i in range(n):
            yield i


    @oal.trace_reward
    def reward(text):
        if text == "BAD!":
            raise ValueError("no reward for " + text)
        return float(len(text))


    def flush():
        assert oal.current_handle().force_flush(10)


    def fast_path():
        from otel_agentloop.core import _tracer

        return [os.environ.get("OTEL_AGENTLOOP_FAST_PATH"), _tracer.current_recorder() is not None]


    @ray.remote
    def task(i, carrier):
        with oal_ray.remote_step(carrier):
            with oal.sample(i, rollout_n=0):
                text = asyncio.run(generate(search("q")))
                parts = list(stream(2))
                score = reward(text)
                oal.record_sample(reward=score, turns=1)
        flush()
        return text, parts, score, fast_path()


    @ray.remote
    class Agent:
        @oal_ray.traced_remote
        async def episode(self, i, bad):
            async with oal.sample(i):
                text = await generate(search("bad" if bad else "a"))
                with oal.trainer_phase("inner"):
                    pass
                try:
                    score = reward(text)
                except ValueError as exc:
                    score = str(exc)
            return text, score, fast_path()

        def done(self):
            flush()


    if __name__ == "__main__":
        endpoint, root, path = sys.argv[1:4]
        handle = oal.configure("ray-parity", endpoint=endpoint, protocol="grpc", file=path, schedule_delay_s=0.05)
        # until the setting is declared, a worker drops an OTEL_* variable its driver's handle does not hand over
        handle.worker_env["OTEL_AGENTLOOP_FAST_PATH"] = os.environ["OTEL_AGENTLOOP_FAST_PATH"]
        base = {"env_vars": {"PYTHONPATH": root}}
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            runtime_env=oal_ray.runtime_env(handle, base=base),
        )
        try:
            with oal.step(3, trace_per="step"):
                carrier = oal_ray.carrier()
                tasks = [ray.get(task.remote(i, carrier), timeout=120) for i in range(2)]
            agent = Agent.remote()
            with oal.step(4):
                episodes = [
                    ray.get(agent.episode.remote(i, i == 11, otel_carrier=oal_ray.carrier()), timeout=120)
                    for i in (10, 11)
                ]
            ray.get(agent.done.remote(), timeout=60)
        finally:
            ray.shutdown()
        handle.shutdown(5)
        print(json.dumps({"tasks": tasks, "episodes": episodes, "driver": fast_path()}))
''')


def _ray_run(mode: str, tmp_path: Path) -> tuple[Any, list[Any], list[str]]:
    receiver = RawReceiver()
    server, endpoint = start_grpc(receiver)
    script = tmp_path / "driver.py"
    script.write_text(RAY_DRIVER)
    path = tmp_path / f"ray-{mode}.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        PYTHONPATH=ROOT, OTEL_AGENTLOOP_FAST_PATH="true" if mode == "fast" else "false", OTEL_METRICS_EXPORTER="none"
    )
    try:
        out = subprocess.run(
            [sys.executable, str(script), endpoint, ROOT, str(path)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-4000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
        expected = 2 * 5 + 2 + 2 * 5 + 2 + 2  # 2 task samples of 5 spans, 2 episodes of 5, 4 worker spans, 2 steps
        assert wait_for(lambda: len(receiver.records) >= expected, 30), Counter(r.name for r in receiver.records)
        time.sleep(0.5)  # anything late
    finally:
        server.stop(0)
    lines = path.read_text().splitlines()
    return result, list(receiver.requests), lines


@pytest.mark.e2e  # a local Ray cluster, a driver script in a subprocess
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_ray_task_and_actor_from_a_driver_script(tmp_path) -> None:
    """A driver script (code in ``__main__``) on a real local cluster: a task re-entering the driver's step and
    an actor's ``traced_remote`` method; the workers' spans over OTLP/gRPC and into the shared file."""
    runs = {mode: _ray_run(mode, tmp_path) for mode in MODES}
    for mode, (result, _, _) in runs.items():  # each process recorded on the path it was asked to
        used = [result["driver"], *(t[-1] for t in result["tasks"]), *(e[-1] for e in result["episodes"])]
        assert used == [["true", True] if mode == "fast" else ["false", False]] * 5, (mode, used)
    strip = lambda result: {k: [x[:-1] for x in v] for k, v in result.items() if k != "driver"}  # noqa: E731
    assert strip(runs["fast"][0]) == strip(runs["sdk"][0])
    assert runs["fast"][0]["episodes"][1][:2] == ["BAD!", "no reward for BAD!"]
    failures = []
    for source in ("grpc", "file"):
        per_mode = {}
        for mode, (_, requests, lines) in runs.items():
            if source == "grpc":
                spans = [s for r in requests for s in from_proto(r)]
            else:
                spans = [s for line in lines for s in from_proto(parse_json_line(line))]
            per_mode[mode] = [
                {k: v for k, v in s.items() if k != "random_trace_id"} for s in normalise(per_launch(spans))
            ]
            if source == "file":
                per_mode[mode] = [{**s, "parent_remote": None} for s in per_mode[mode]]
        try:
            assert_same(per_mode["fast"], per_mode["sdk"], f"ray {source}: fast vs sdk")
        except AssertionError as exc:
            failures.append(str(exc))
    assert not failures, "\n".join(failures)
    spans = normalise(per_launch([s for r in runs["fast"][1] for s in from_proto(r)]))
    workers = [s for s in spans if s["name"] == sc.WORKER_SPAN]
    assert len(workers) == 4 and all(s["parent_remote"] is True for s in workers)  # below the driver's step
    assert sum(1 for s in spans if s["name"] == sc.SAMPLE_SPAN) == 4
    assert [s["status"][0] for s in spans if s["name"] == sc.REWARD_SPAN].count("ERROR") == 1
