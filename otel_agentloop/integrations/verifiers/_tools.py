"""Tool calls as ``execute_tool <name>`` spans, in the tool-server process, in the rollout's trace.

verifiers runs a rollout's tools in tool-server processes (``python -m <toolset module>``, launched by
``mcp.launch.serve_in_runtime``); the harness calls them over MCP, so the eval process never sees a call run.

- Launch (eval process): a tool server launched in the local ``subprocess`` runtime inside a traced sample is
  started as ``python -m otel_agentloop.integrations.verifiers._toolserver <carrier> <module>`` (the same
  module, run as ``__main__`` by :mod:`runpy`) with the sample's ``traceparent`` and identity (``<carrier>``)
  on its command line and this process's tracing settings (``Handle.worker_env``) in its environment. An
  eval-level shared tool server (launched once, outside any sample, serving every rollout) launched in the
  local ``subprocess`` runtime is started the same way with a carrier that says only ``shared``; each rollout's
  URL of it (``mcp.launch._shared_url_for_rollout``, inside the sample) then gets one more query parameter,
  ``otel_agentloop``: the sample's carrier, which travels with each MCP call the harness makes to it. Servers in
  other runtimes (containers, sandboxes) are launched unchanged: their tool calls are not traced.
- Serve (tool-server process): ``ServerBase._with_state`` (how each ``@vf.tool`` is registered with MCP) is
  wrapped so that each call is one ``execute_tool <name>`` span below the sample, with its identity (a shared
  server's: the sample's carrier in the call's query, which verifiers keeps per HTTP request); the span is
  exported before the call returns (the server may be killed when the rollout ends).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from opentelemetry import context as otel_context

from ... import semconv as sc
from ...core._context import current_sample
from ...core._guard import internal_error
from ...core._lifecycle import finish
from ...core._phase import PhaseSpec, start
from .._engine import trace_headers
from .._patching import Args, AsyncOriginal, Kwargs, Original
from ._rollout import ensure_configured

ENTRY = "otel_agentloop.integrations.verifiers._toolserver"
QUERY = "otel_agentloop"
"""The query parameter of a shared tool server's per-rollout URL that carries the sample."""
FLUSH_S = 2.0

_LAUNCH: contextvars.ContextVar[Launch | None] = contextvars.ContextVar("otel_agentloop_verifiers_launch", default=None)


class Launch:
    """What a tool server launched now needs: this process's tracing settings (``env``, ``Handle.worker_env``)
    and the sample's context and identity (``carrier``, JSON on its command line)."""

    __slots__ = ("carrier", "env")

    def __init__(self, env: dict[str, str], carrier: str) -> None:
        self.env = env
        self.carrier = carrier


def sample_carrier() -> str | None:
    """The current sample's ``traceparent`` and identity (JSON), or ``None`` outside a traced sample."""
    sample = current_sample()
    if sample is None or sample.span is None:
        return None
    carrier: dict[str, Any] = dict(trace_headers())
    if "traceparent" not in carrier:
        return None
    carrier["sample"] = {
        "index": sample.index,
        "rollout_n": sample.rollout_n,
        "step": sample.step,
        "validate": sample.validate,
    }
    return json.dumps(carrier)


def launch() -> Launch | None:
    """The current sample's :class:`Launch`; outside a sample, an eval-level shared server's (carrier
    ``{"shared": true}``); ``None`` when tracing is off."""
    from ...setup import current_handle

    handle = current_handle()
    if handle is None or not handle.enabled:
        return None
    if current_sample() is None:
        return Launch(dict(handle.worker_env), json.dumps({"shared": True}))
    carrier = sample_carrier()
    return None if carrier is None else Launch(dict(handle.worker_env), carrier)


def shared_url(original: Original, args: Args, kwargs: Kwargs) -> object:
    """``_shared_url_for_rollout(server, url, ...)``, inside the rollout's sample: the URL also carries the
    sample's carrier (query parameter :data:`QUERY`), for a shared server launched by :func:`run_background`."""
    url = original(*args, **kwargs)
    try:
        server = args[0] if args else kwargs.get("server")
        carrier = sample_carrier() if getattr(getattr(server, "runtime", None), "type", None) == "subprocess" else None
        if carrier is not None and isinstance(url, str):
            parts = urlsplit(url)
            query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != QUERY]
            return urlunsplit(parts._replace(query=urlencode([*query, (QUERY, carrier)])))
    except Exception:
        internal_error("verifiers.shared_url")
    return url


async def serve_in_runtime(original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    """``serve_in_runtime(server, runtime, ...)``: a local subprocess launch carries the sample's context (outside
    a sample: an eval-level shared server, whose calls each carry theirs)."""
    found = None
    try:
        ensure_configured()  # an env server launches its shared servers before its first rollout
        runtime = args[1] if len(args) > 1 else kwargs.get("runtime")
        if getattr(runtime, "type", None) == "subprocess":
            found = launch()
    except Exception:
        internal_error("verifiers.tool_launch")
    if found is None:
        return await original(*args, **kwargs)
    token = _LAUNCH.set(found)
    try:
        return await original(*args, **kwargs)
    finally:
        _LAUNCH.reset(token)


async def run_background(original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    """``SubprocessRuntime.run_background(argv, env, log)``: inside a traced launch, ``python -m <module>``
    becomes ``python -m <ENTRY> <carrier> <module>`` with the launch's settings added to its environment."""
    found = _LAUNCH.get()
    if found is not None:
        try:
            self, argv, env, *rest = args
            if isinstance(argv, list) and len(argv) == 3 and argv[0] == sys.executable and argv[1] == "-m":
                args = (
                    self,
                    [argv[0], "-m", ENTRY, found.carrier, argv[2]],
                    {**found.env, **dict(cast("Mapping[str, str]", env))},
                    *rest,
                )
        except Exception:
            internal_error("verifiers.tool_argv")
    return await original(*args, **kwargs)


class _Served:
    """This tool-server process's parent context and sample identity (from its launch carrier); ``shared``: an
    eval-level shared server, whose calls each carry their sample's (in their query)."""

    __slots__ = ("ctx", "identity", "shared")

    def __init__(self) -> None:
        self.ctx: otel_context.Context | None = None
        self.identity: dict[str, Any] = {}
        self.shared = False


served = _Served()


def parse(carrier: str) -> tuple[otel_context.Context, dict[str, Any]]:
    """A sample's context and identity attributes from its carrier (JSON, :func:`sample_carrier`)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    loaded = json.loads(carrier)
    raw: dict[str, Any] = loaded if isinstance(loaded, dict) else {}
    headers = {k: raw[k] for k in ("traceparent", "tracestate") if isinstance(raw.get(k), str)}
    ctx = TraceContextTextMapPropagator().extract(headers)
    given = raw.get("sample")
    sample: dict[str, Any] = given if isinstance(given, dict) else {}
    identity: dict[str, Any] = {}
    for key, name in (("index", sc.RL_SAMPLE_INDEX), ("rollout_n", sc.RL_ROLLOUT_N), ("step", sc.RL_STEP)):
        if type(sample.get(key)) is int:
            identity[name] = sample[key]
    identity[sc.RL_VALIDATE] = bool(sample.get("validate", False))
    return ctx, identity


def adopt(carrier: str) -> None:
    """In a launched tool server: the sample's context and identity, from the launcher's carrier (JSON); a
    shared server's carrier says only ``shared``."""
    if json.loads(carrier) == {"shared": True}:
        served.shared = True
        return
    served.ctx, served.identity = parse(carrier)


def _call_sample() -> tuple[otel_context.Context | None, dict[str, Any]]:
    """The parent context and identity of the call being served: the process's, or in a shared server the
    call's own (its ``otel_agentloop`` query parameter; none: untraced)."""
    if not served.shared:
        return served.ctx, served.identity
    carrier = importlib.import_module("verifiers.v1.mcp.server")._request_query(QUERY)  # verifiers' per request
    return parse(carrier) if carrier else (None, {})


def with_state(original: Callable[..., AsyncOriginal], args: Args, kwargs: Kwargs) -> object:
    """``ServerBase._with_state(fn)``: the registered tool, traced when this process continues a sample."""
    wrapper = original(*args, **kwargs)
    if served.ctx is None and not served.shared:
        return wrapper
    try:
        fn = args[1] if len(args) > 1 else kwargs.get("fn")
        name = getattr(fn, "tool_name", None) or getattr(fn, "__name__", None) or "tool"
        return _traced(wrapper, PhaseSpec.build(sc.TOOL_CALLS, tool=str(name)))
    except Exception:
        internal_error("verifiers.tool_register")
        return wrapper


def _traced(wrapper: AsyncOriginal, spec: PhaseSpec) -> AsyncOriginal:
    @functools.wraps(wrapper)
    async def traced_tool(*args: object, **kwargs: object) -> object:
        try:
            ctx, identity = _call_sample()
        except Exception:
            internal_error("verifiers.tool_carrier")
            ctx, identity = None, {}
        if ctx is None:
            return await wrapper(*args, **kwargs)
        token = otel_context.attach(ctx)
        try:
            scope = start(spec, extra=identity)
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
