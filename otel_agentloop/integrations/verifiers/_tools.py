"""Tool calls as ``execute_tool <name>`` spans, in the tool-server process, in the rollout's trace.

verifiers runs a rollout's tools in tool-server processes (``python -m <toolset module>``, launched by
``mcp.launch.serve_in_runtime``); the harness calls them over MCP, so the eval process never sees a call run.

- Launch (eval process): a tool server launched in the local ``subprocess`` runtime inside a traced sample is
  started as ``python -m otel_agentloop.integrations.verifiers._toolserver <module>`` (the same module, run
  as ``__main__`` by :mod:`runpy`) with the sample's ``TRACEPARENT`` and identity and this process's tracing
  settings (``Handle.worker_env``) in its environment. Servers in other runtimes (containers, sandboxes, the
  eval-level shared servers) are launched unchanged: their tool calls are not traced.
- Serve (tool-server process): ``ServerBase._with_state`` (how each ``@vf.tool`` is registered with MCP) is
  wrapped so that each call is one ``execute_tool <name>`` span below the sample, with its identity; the
  span is exported before the call returns (the server may be killed when the rollout ends).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import context as otel_context

from ... import semconv as sc
from ...core._context import current_sample
from ...core._guard import internal_error
from ...core._lifecycle import finish
from ...core._phase import PhaseSpec, start
from .._engine import trace_headers

ENTRY = "otel_agentloop.integrations.verifiers._toolserver"
SAMPLE_VARIABLE = "OTEL_AGENTLOOP_VERIFIERS_SAMPLE"
"""A launched tool server's sample identity (JSON: index, rollout_n, step, validate)."""
FLUSH_S = 2.0

_LAUNCH: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "otel_agentloop_verifiers_launch", default=None
)


def _launch_env() -> dict[str, str] | None:
    """What a tool server launched now needs to continue the current sample's trace, or ``None``."""
    from ...setup import current_handle

    handle = current_handle()
    sample = current_sample()
    if handle is None or not handle.enabled or sample is None or sample.span is None:
        return None
    carrier = trace_headers()
    if "traceparent" not in carrier:
        return None
    env = dict(handle.worker_env)
    env["TRACEPARENT"] = carrier["traceparent"]
    if "tracestate" in carrier:
        env["TRACESTATE"] = carrier["tracestate"]
    identity = {"index": sample.index, "rollout_n": sample.rollout_n, "step": sample.step, "validate": sample.validate}
    env[SAMPLE_VARIABLE] = json.dumps(identity)
    return env


async def serve_in_runtime(original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``serve_in_runtime(server, runtime, ...)``: a local subprocess launch carries the sample's context."""
    env = None
    try:
        runtime = args[1] if len(args) > 1 else kwargs.get("runtime")
        if getattr(runtime, "type", None) == "subprocess":
            env = _launch_env()
    except Exception:
        internal_error("verifiers.tool_launch")
    if env is None:
        return await original(*args, **kwargs)
    token = _LAUNCH.set(env)
    try:
        return await original(*args, **kwargs)
    finally:
        _LAUNCH.reset(token)


async def run_background(original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``SubprocessRuntime.run_background(argv, env, log)``: inside a traced launch, ``python -m <module>``
    becomes ``python -m <ENTRY> <module>`` with the launch's environment added."""
    launch = _LAUNCH.get()
    if launch is not None:
        try:
            self, argv, env, *rest = args
            if isinstance(argv, list) and len(argv) == 3 and argv[0] == sys.executable and argv[1] == "-m":
                args = (self, [argv[0], "-m", ENTRY, argv[2]], {**launch, **dict(env)}, *rest)
        except Exception:
            internal_error("verifiers.tool_argv")
    return await original(*args, **kwargs)


class _Served:
    """This tool-server process's parent context and sample identity (from its launch environment)."""

    __slots__ = ("ctx", "identity")

    def __init__(self) -> None:
        self.ctx: otel_context.Context | None = None
        self.identity: dict[str, Any] = {}


served = _Served()


def adopt_launch_environment(environ: Mapping[str, str]) -> None:
    """In a launched tool server: the sample's context (``TRACEPARENT``) and identity."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {"traceparent": environ.get("TRACEPARENT", "")}
    if environ.get("TRACESTATE"):
        carrier["tracestate"] = environ["TRACESTATE"]
    served.ctx = TraceContextTextMapPropagator().extract(carrier)
    raw = json.loads(environ.get(SAMPLE_VARIABLE) or "{}")
    identity: dict[str, Any] = {}
    for key, name in (("index", sc.RL_SAMPLE_INDEX), ("rollout_n", sc.RL_ROLLOUT_N), ("step", sc.RL_STEP)):
        if type(raw.get(key)) is int:
            identity[name] = raw[key]
    identity[sc.RL_VALIDATE] = bool(raw.get("validate", False))
    served.identity = identity


def with_state(original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``ServerBase._with_state(fn)``: the registered tool, traced when this process continues a sample."""
    wrapper = original(*args, **kwargs)
    if served.ctx is None:
        return wrapper
    try:
        fn = args[1] if len(args) > 1 else kwargs.get("fn")
        name = getattr(fn, "tool_name", None) or getattr(fn, "__name__", None) or "tool"
        return _traced(wrapper, PhaseSpec.build(sc.TOOL_CALLS, tool=str(name)))
    except Exception:
        internal_error("verifiers.tool_register")
        return wrapper


def _traced(wrapper: Callable[..., Any], spec: PhaseSpec) -> Callable[..., Any]:
    @functools.wraps(wrapper)
    async def traced_tool(*args: Any, **kwargs: Any) -> Any:
        ctx = served.ctx
        if ctx is None:
            return await wrapper(*args, **kwargs)
        token = otel_context.attach(ctx)
        try:
            scope = start(spec, extra=served.identity)
        finally:
            otel_context.detach(token)
        if scope is None:
            return await wrapper(*args, **kwargs)
        try:
            result = await wrapper(*args, **kwargs)
        except BaseException as exc:
            finish(scope, exc)
            await _flush()
            raise
        finish(scope)
        await _flush()
        return result

    return traced_tool


async def _flush() -> None:
    """Export this call's span now (bounded; never waits on a dead backend): the server may be killed next."""
    try:
        from ...setup import current_handle

        handle = current_handle()
        if handle is not None and handle.enabled:
            await asyncio.to_thread(handle.request_flush, FLUSH_S)
    except Exception:
        internal_error("verifiers.tool_flush")


def launched() -> bool:
    """Whether this process was launched as a traced tool server."""
    return bool(os.environ.get(SAMPLE_VARIABLE))
