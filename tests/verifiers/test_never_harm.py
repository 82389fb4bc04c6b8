"""No vLLM needed: our wrappers around real verifiers 0.4 objects keep verifiers' behaviour (exception types,
cancellation, patches put back, nothing imported early), and a tool-server process's tool calls become
``execute_tool`` spans below the sample its launcher handed over."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop import testing
from otel_agentloop.integrations import verifiers as oal_verifiers
from otel_agentloop.integrations.verifiers import _tools


@pytest.fixture(autouse=True)
def _isolated() -> Iterator[None]:
    with testing.isolated():
        yield
    oal_verifiers.uninstrument()
    _tools.served.ctx, _tools.served.identity, _tools.served.shared = None, {}, False


def _toolset() -> Any:
    import verifiers.v1 as vf

    class Tools(vf.Toolset[vf.ToolsetConfig, vf.State]):
        @vf.tool
        def boom(self) -> str:
            """Fails."""
            raise KeyError("boom")

        @vf.tool
        async def slow(self) -> str:
            """Waits."""
            await asyncio.sleep(30)
            return "late"

        @vf.tool
        def fine(self) -> str:
            """Works."""
            return "ok"

    return Tools(vf.ToolsetConfig())


def _tools_of(toolset: Any) -> dict[str, Any]:
    from verifiers.v1.utils.decorators import discover_decorated

    return {fn.__name__: toolset._with_state(fn) for fn in discover_decorated(toolset, "tool")}


async def _outcomes(tools: dict[str, Any]) -> list[str]:
    out = [await tools["fine"]()]
    try:
        await tools["boom"]()
    except KeyError as exc:  # the tool's own exception, unchanged
        out.append(f"KeyError:{exc}")
    task = asyncio.ensure_future(tools["slow"]())
    await asyncio.sleep(0.05)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        out.append("cancelled")
    return out


def test_a_tool_server_traces_each_call_below_the_handed_over_sample_and_keeps_its_outcomes() -> None:
    plain = asyncio.run(_outcomes(_tools_of(_toolset())))
    with testing.capture("tools") as captured:
        with oal.step(3), oal.sample(1, rollout_n=2) as sample:
            launch = _tools.launch()
        assert launch is not None and json.loads(launch.carrier)["traceparent"].split("-")[1] == sample.trace_id
        _tools.adopt(launch.carrier)
        oal_verifiers.instrument()
        traced = asyncio.run(_outcomes(_tools_of(_toolset())))
        finished = captured.spans()
    assert traced == plain == ["ok", "KeyError:'boom'", "cancelled"]
    spans = {s.name: s for s in finished if s.name.startswith(sc.TOOL_SPAN_PREFIX)}
    assert sorted(spans) == ["execute_tool boom", "execute_tool fine", "execute_tool slow"]
    root = next(s for s in finished if s.name == sc.SAMPLE_SPAN)
    for span in spans.values():
        assert span.parent is not None and span.parent.span_id == root.context.span_id
        assert (span.attributes[sc.RL_SAMPLE_INDEX], span.attributes[sc.RL_ROLLOUT_N], span.attributes[sc.RL_STEP]) == (
            1,
            2,
            3,
        )
    assert spans["execute_tool boom"].attributes["error.type"] == "KeyError"
    assert spans["execute_tool slow"].status.is_ok  # cancellation is no error
    assert spans["execute_tool fine"].status.is_ok


def test_a_tool_server_not_launched_by_a_traced_sample_is_left_alone() -> None:
    with testing.capture("tools") as captured:
        oal_verifiers.instrument()
        tools = _tools_of(_toolset())
        assert asyncio.run(_outcomes(tools)) == ["ok", "KeyError:'boom'", "cancelled"]
        finished = captured.spans()
    assert not [s for s in finished if s.name.startswith(sc.TOOL_SPAN_PREFIX)]


def test_a_shared_tool_server_traces_each_call_below_the_sample_in_its_query() -> None:
    """An eval-level shared server (launched outside any sample) takes each call's sample from the call's query
    (verifiers keeps it per HTTP request); a call without one stays untraced. Outcomes are verifiers' own."""
    from verifiers.v1.mcp.server import _request_query_params

    with testing.capture("tools") as captured:
        launch = _tools.launch()  # outside a sample: the shared server's launch
        assert launch is not None and json.loads(launch.carrier) == {"shared": True}
        _tools.adopt(launch.carrier)
        with oal.step(4), oal.sample(5, rollout_n=1) as sample:
            carrier = _tools.sample_carrier()
        assert carrier is not None
        oal_verifiers.instrument()
        tools = _tools_of(_toolset())
        token = _request_query_params.set({_tools.QUERY: [carrier]})
        try:
            traced = asyncio.run(_outcomes(tools))
        finally:
            _request_query_params.reset(token)
        untraced = asyncio.run(_outcomes(tools))
        finished = captured.spans()
    assert traced == untraced == ["ok", "KeyError:'boom'", "cancelled"]
    spans = [s for s in finished if s.name.startswith(sc.TOOL_SPAN_PREFIX)]
    assert sorted(s.name for s in spans) == ["execute_tool boom", "execute_tool fine", "execute_tool slow"]
    root = next(s for s in finished if s.name == sc.SAMPLE_SPAN)
    assert root.context.trace_id == int(sample.trace_id or "0", 16)
    for span in spans:
        assert span.parent is not None and span.parent.span_id == root.context.span_id
        assert (span.attributes[sc.RL_SAMPLE_INDEX], span.attributes[sc.RL_ROLLOUT_N], span.attributes[sc.RL_STEP]) == (
            5,
            1,
            4,
        )


def test_the_mcp_signature_of_a_traced_tool_is_verifiers_own() -> None:
    import inspect

    toolset = _toolset()
    plain = {name: inspect.signature(fn) for name, fn in _tools_of(toolset).items()}
    with testing.capture("tools"):
        with oal.sample(0):
            launch = _tools.launch()
        assert launch is not None
        _tools.adopt(launch.carrier)
        oal_verifiers.instrument()
        traced = _tools_of(toolset)
    assert {name: inspect.signature(fn) for name, fn in traced.items()} == plain
    assert all(fn.__name__ == name for name, fn in traced.items())


def test_instrument_imports_nothing_and_uninstrument_puts_back_verifiers_own_objects() -> None:
    code = """
import sys, json
from otel_agentloop.integrations import verifiers as v
v.instrument()
early = sorted(m for m in sys.modules if m.split('.')[0] == 'verifiers')
from verifiers.v1.agent import Agent
from verifiers.v1.task import Task
from verifiers.v1.mcp.server import ServerBase
from verifiers.v1.clients.eval import EvalClient
def files():
    return [f.__code__.co_filename for f in (Agent.run, Task.score, ServerBase._with_state, EvalClient.relay)]
originals = [f.__wrapped__ for f in (Agent.run, Task.score, ServerBase._with_state, EvalClient.relay)]
patched = files()
v.uninstrument()
after = [Agent.run, Task.score, ServerBase._with_state, EvalClient.relay]
same = [a is b for a, b in zip(after, originals)]
v.instrument()
print(json.dumps([early, patched, same, files()]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    early, patched, same, again = json.loads(out.stdout.strip().splitlines()[-1])
    assert early == []  # instrument() imported no verifiers module: each was patched as it was imported
    assert all("otel_agentloop" in f for f in patched)
    assert same == [True, True, True, True]  # the very same objects put back
    assert all("otel_agentloop" in f for f in again)  # and patched again


def test_an_env_server_run_request_carries_the_callers_step_and_verifiers_reads_it_as_before() -> None:
    """``EnvClient``'s ``run`` request gets the carrier in its map; verifiers' ``RunRequest`` validates it into the
    very same request; ``EnvServer._handle`` runs it in the caller's step and span. Other requests: unchanged."""
    import msgpack
    from opentelemetry import trace
    from verifiers.v1.configs.client import EvalClientConfig
    from verifiers.v1.serve.types import HealthRequest, RunRequest

    from otel_agentloop import current_step
    from otel_agentloop.integrations.verifiers import _envserver

    request = RunRequest(task_data={"idx": 0}, client=EvalClientConfig(base_url="http://x/v1"), model="m", sampling={})
    sent: list[bytes] = []
    methods: list[str] = []

    async def send(self: Any, req: Any, response_type: Any, timeout: Any = None, on_delta: Any = None) -> str:
        sent.append(msgpack.packb(req.model_dump(mode="json"), use_bin_type=True))
        methods.append(req.method)  # the carried request is still the request (its method, ...)
        return "reply"

    seen: list[tuple[Any, int]] = []

    async def handle(self: Any, client_id: bytes, request_id: bytes, method: bytes, payload: bytes) -> None:
        step = current_step()
        seen.append((step.step if step else None, trace.get_current_span().get_span_context().span_id))

    with testing.capture("env"):
        with oal.step(9):
            caller = trace.get_current_span().get_span_context()
            assert asyncio.run(_envserver.client_request(send, (None, request, object), {})) == "reply"
            asyncio.run(_envserver.client_request(send, (None, HealthRequest(), object), {}))
        assert methods == ["run", "health"]
        assert RunRequest.model_validate(msgpack.unpackb(sent[0], raw=False)) == request
        assert msgpack.unpackb(sent[1], raw=False) == {}  # a health request: as verifiers sends it
        for payload in sent:
            asyncio.run(_envserver.server_handle(handle, (None, b"c", b"r", b"run", payload), {}))
    assert seen == [(9, caller.span_id), (None, 0)]
