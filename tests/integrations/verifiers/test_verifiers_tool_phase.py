"""The verifiers integration's eval-side tool phase, fast, in the main venv (no verifiers, no server): the real
wrappers (``Agent.run``, ``Rollout.__init__``, the client's ``get_response``, ``InterceptionServer.record_call``,
``RolloutSession.refused``, ``Rollout.step``) driven with stand-ins shaped like verifiers 0.4's objects, in the
order verifiers calls them. A turn that hands tool calls to the harness opens one ``rl.tool_calls`` span, which
the rollout's next model request (or the harness segment's end) closes; ``collect()`` sums it into
``agent_loop/tool_calls``; no ``execute_tool`` span comes from the eval side. The real run is
``tests/verifiers/test_vllm_eval.py``."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from otel_agentloop import semconv as sc
from otel_agentloop import step
from otel_agentloop.integrations.verifiers import _rollout, _toolphase, _turns
from tests._support.spans import Traced

WAIT_S = 0.05


def _message(tools: bool) -> Any:
    return SimpleNamespace(role="assistant", tool_calls=[SimpleNamespace(id="c0", name="ping")] if tools else None)


class _Session:
    """A ``RolloutSession``: its trace (``id``, ``nodes``, ``calls``) and ``stopped``."""

    def __init__(self, trace_id: str) -> None:
        self.trace = SimpleNamespace(id=trace_id, nodes=[], calls=[], reward=1.0, num_turns=0)
        self.stopped = False


async def _turn(session: _Session, tools: bool) -> None:
    """One model call as verifiers serves it: upstream (``get_response``), then its record (``record_call``)."""

    async def upstream(*args: Any, **kwargs: Any) -> Any:
        return SimpleNamespace(raw=None)

    def record(server: Any, rollout: _Session, *args: Any, **kwargs: Any) -> None:
        now = time.time()
        rollout.trace.calls.append(SimpleNamespace(time=SimpleNamespace(start=now - 0.001, end=now)))

    await _turns.get_response(upstream, (None, None, {"model": "m"}, None), {"session_id": session.trace.id})
    session.trace.nodes.append(SimpleNamespace(message=_message(tools)))
    _turns.record_call(record, (None, session), {"node": len(session.trace.nodes) - 1, "error": None})


async def _refused(session: _Session) -> None:
    async def original(self: Any) -> None:
        return None

    await _toolphase.refused(original, (session,), {})


async def _rollout_run(session: _Session, body: Any) -> None:
    """``Agent.run`` of task 3 whose rollout is ``session``'s, running ``body`` as its harness segment."""

    async def agent(self: Any, task: Any) -> Any:
        _rollout.rollout_init(lambda rollout: None, (SimpleNamespace(trace=session.trace),), {})
        await _toolphase.rollout_step(lambda rollout: body(), (SimpleNamespace(trace=session.trace),), {})
        return session.trace

    await _rollout.agent_run(agent, (None, SimpleNamespace(data=SimpleNamespace(idx=3))), {})


def test_a_turn_handing_tool_calls_opens_the_tool_phase_the_next_request_closes(traced: Traced) -> None:
    session = _Session("vf-1")

    async def harness() -> None:
        await _turn(session, tools=True)
        await asyncio.sleep(WAIT_S)  # the harness runs the tool call
        await _refused(session)  # its next model request arrives
        await _turn(session, tools=False)  # a text reply: no tool phase

    with step(0):
        asyncio.run(_rollout_run(session, harness))
    metrics = traced.handle.metrics.collect(0)
    spans = traced.spans()
    (sample,) = [s for s in spans if s.name == sc.SAMPLE_SPAN]
    blocks = [s for s in spans if s.attributes.get(sc.RL_PHASE) == sc.TOOL_CALLS]
    assert [b.name for b in blocks] == [sc.TOOL_CALLS_SPAN]  # one block, no execute_tool span from this side
    block = blocks[0]
    assert block.parent is not None and block.parent.span_id == sample.context.span_id
    assert sc.GEN_AI_TOOL_NAME not in block.attributes and block.attributes[sc.RL_SAMPLE_INDEX] == 3
    turns = sorted((s for s in spans if s.attributes.get(sc.RL_PHASE) == sc.GENERATE), key=lambda s: s.start_time)
    assert len(turns) == 2 and turns[0].start_time < block.start_time and block.end_time <= turns[1].start_time
    duration = (block.end_time - block.start_time) / 1e9
    assert duration >= WAIT_S
    assert metrics["agent_loop/num_samples"] == 1
    assert abs(metrics["agent_loop/tool_calls/mean"] - duration) < 1e-6


def test_no_tool_phase_after_a_stopped_rollout_and_the_segment_end_closes_an_open_one(traced: Traced) -> None:
    stopped, open_at_end = _Session("vf-2"), _Session("vf-3")

    async def stops() -> None:
        stopped.stopped = True  # e.g. a @stop fired on the response: the harness gets an error, runs no tool
        await _turn(stopped, tools=True)

    async def exits() -> None:
        await _turn(open_at_end, tools=True)
        await asyncio.sleep(WAIT_S)  # the harness runs the tool call, then exits without another model request

    with step(0):
        asyncio.run(_rollout_run(stopped, stops))
    assert not [s for s in traced.spans() if s.name == sc.TOOL_CALLS_SPAN]
    with step(1):
        asyncio.run(_rollout_run(open_at_end, exits))
    blocks = [s for s in traced.spans() if s.name == sc.TOOL_CALLS_SPAN]
    assert len(blocks) == 1 and (blocks[0].end_time - blocks[0].start_time) / 1e9 >= WAIT_S
    assert traced.handle.metrics.collect(1)["agent_loop/tool_calls/max"] >= WAIT_S
    assert not _toolphase._open
