"""A rollout's tool phases as the eval process sees them: verl's ``tool_calls`` timer, in ``collect()``.

verifiers' harness runs a turn's tool calls itself (over MCP, in tool-server processes), between two model calls
of the rollout, so the eval process never sees a call run; it sees a model call return tool calls to the harness,
then the harness's next model request (or the harness's end). That wait is the rollout's tool phase as its agent
loop experiences it, as verl's ``tool_calls`` timer (around a turn's ``asyncio.gather`` of its calls) is:

- it starts when a traced turn ends with tool calls handed to the harness (``InterceptionServer.record_call`` of
  a committed turn whose assistant message carries ``tool_calls``, the rollout not stopped);
- it ends when the rollout's next model request reaches the interception server (``RolloutSession.refused``,
  verifiers' check before each model call) or the harness segment ends (``Rollout.step`` returns), whichever
  comes first; the sample's end closes any left open.

Each such wait is one ``rl.tool_calls`` span (phase ``tool_calls``, no ``gen_ai.tool.name``), the sample's child,
as verl's integration records its turns' tool blocks: ``collect()`` sums it into ``agent_loop/tool_calls``, and
the per-call ``execute_tool <name>`` spans stay the tool server's alone (they lie inside the block; the metrics
take the union of a sample's tool-phase spans, so a reader holding both counts each moment once). It covers the
tool calls plus the harness's own handling of them (MCP round trips, building the next request): a bound above
the tool servers' ``execute_tool`` time and below verifiers' harness time (``timing.agent.harness``).
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry import context as otel_context

from ... import semconv as sc
from ...config._fork import renew_lock
from ...core._context import _SAMPLE
from ...core._guard import internal_error
from ...core._lifecycle import finish
from ...core._phase import PhaseSpec, start
from ...core._scope import OpenSpan
from .._patching import Args, AsyncOriginal, Kwargs

SPEC = PhaseSpec(sc.TOOL_CALLS, sc.TOOL_CALLS_SPAN, {sc.RL_PHASE: sc.TOOL_CALLS})
"""The tool block's span: verl's ``rl.tool_calls`` (no tool name: not a tool call of its own)."""
_MAX_OPEN = 65536

_lock = threading.Lock()
renew_lock(globals(), "_lock")  # a forked child: never a lock held at fork
_open: dict[str, OpenSpan] = {}
"""The open tool phase of each rollout, by its verifiers trace id (at most one: a later one lies inside it)."""


def turn_returned(rollout: Any, node: object, found: tuple[otel_context.Context, Any] | None) -> None:
    """After verifiers recorded a traced turn of ``rollout`` (a ``RolloutSession``; ``found``: its sample's context
    and handle): its tool phase starts when the turn committed assistant node ``node`` with tool calls and the
    rollout goes on. Never raises."""
    try:
        trace = getattr(rollout, "trace", None)
        trace_id = getattr(trace, "id", None)
        if type(node) is not int or not isinstance(trace_id, str) or getattr(rollout, "stopped", True):
            return
        nodes = getattr(trace, "nodes", None)
        message = getattr(nodes[node], "message", None) if isinstance(nodes, list) and 0 <= node < len(nodes) else None
        if not getattr(message, "tool_calls", None):
            return
        if found is None:
            return
        with _lock:
            if trace_id in _open or len(_open) >= _MAX_OPEN:
                return
        ctx, handle = found
        token = otel_context.attach(ctx)
        sample_token = _SAMPLE.set(handle)
        try:
            scope = start(SPEC, attach=False)
        finally:
            _SAMPLE.reset(sample_token)
            otel_context.detach(token)
        if scope is not None:
            with _lock:
                stale = _open.get(trace_id)
                _open[trace_id] = scope
            if stale is not None:
                finish(stale)
    except Exception:
        internal_error("verifiers.tool_phase")


def close(trace_id: object) -> None:
    """End the open tool phase of the rollout ``trace_id``, now (none open: nothing). Never raises."""
    if not isinstance(trace_id, str):
        return
    with _lock:
        scope = _open.pop(trace_id, None)
    if scope is not None:
        finish(scope)


def trace_id_of(obj: Any) -> object:
    """``obj.trace.id`` (a ``Rollout``'s or ``RolloutSession``'s verifiers trace id), else ``None``."""
    return getattr(getattr(obj, "trace", None), "id", None)


async def refused(original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    """``RolloutSession.refused()``, run as each model request of the rollout arrives: its tool phase ends."""
    try:
        close(trace_id_of(args[0]))
    except Exception:
        internal_error("verifiers.tool_phase_end")
    return await original(*args, **kwargs)


async def rollout_step(original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    """``Rollout.step(...)``, one harness segment: a tool phase still open when it ends ends with it."""
    try:
        return await original(*args, **kwargs)
    finally:
        try:
            close(trace_id_of(args[0]))
        except Exception:
            internal_error("verifiers.tool_phase_end")
