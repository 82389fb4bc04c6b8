"""prime-rl's env-server hop: a rollout served by an ``EnvServer`` continues the caller's step.

verifiers' ``EnvClient`` sends each rollout request (``RunRequest``) as one msgpack map over ZMQ; its
``EnvServer`` (alone, or behind ``EnvServerPool``'s broker, which forwards the payload bytes unchanged) validates
it into ``RunRequest``, whose pydantic model ignores keys it does not declare.

- Client: ``EnvClient._request`` of a ``run`` request inside a traced context sends the map with one more key,
  ``otel_agentloop``: the caller's ``traceparent`` (and ``tracestate``) and its step (``rl.step``,
  ``rl.validate``, ``rl.trace_per``), as the Ray integration's carrier. Any other request, or a call outside a
  step and a valid span, is sent unchanged.
- Server: ``EnvServer._handle`` of a ``run`` request whose payload holds the key runs the request with the
  caller's context attached and its step entered (no span of its own), so each of its rollouts' samples carries
  the step and starts below the caller's span (or, with ``trace_per="sample"``, a trace linked to it).
"""

from __future__ import annotations

import importlib
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ... import semconv as sc
from ...core import _context
from ...core._guard import internal_error
from ...core._state import state
from ...core._tracer import current_tracer
from .._carrier import step_carrier
from .._patching import Args, AsyncOriginal, Kwargs
from ._rollout import ensure_configured

KEY = "otel_agentloop"
"""The key of the carrier in a ``run`` request's map."""
_KEY_BYTES = KEY.encode()
_propagator = TraceContextTextMapPropagator()


def carrier() -> dict[str, object] | None:
    """The caller's trace context and step, or ``None`` outside a step and a valid span (or tracing off)."""
    if current_tracer() is None:
        return None
    return step_carrier() or None


class _Carried:
    """``EnvClient._request``'s view of a ``RunRequest`` with the carrier: ``model_dump`` adds it; every other
    attribute is the request's own."""

    __slots__ = ("_carrier", "_request")

    def __init__(self, request: Any, carried: dict[str, Any]) -> None:
        self._request = request
        self._carrier = carried

    def model_dump(self, *args: object, **kwargs: object) -> object:
        out = self._request.model_dump(*args, **kwargs)
        return {**out, KEY: self._carrier} if isinstance(out, dict) and KEY not in out else out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._request, name)


async def client_request(original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    """``EnvClient._request(request, response_type, ...)``: a ``run`` request carries the caller's context."""
    try:
        request = args[1] if len(args) > 1 else kwargs.get("request")
        if getattr(request, "method", None) == "run" and callable(getattr(request, "model_dump", None)):
            carried = carrier()
            if carried is not None:
                wrapped = _Carried(request, carried)
                if len(args) > 1:
                    args = (args[0], wrapped, *args[2:])
                else:
                    kwargs = {**kwargs, "request": wrapped}
    except Exception:
        internal_error("verifiers.env_client")
    return await original(*args, **kwargs)


def _adopt(payload: object) -> tuple[otel_context.Context, _context.StepState | None] | None:
    """The caller's context and step from a ``run`` payload that carries them (else ``None``)."""
    if not isinstance(payload, bytes) or _KEY_BYTES not in payload:  # the usual request: one substring search
        return None
    raw = importlib.import_module("msgpack").unpackb(payload, raw=False)  # verifiers' own wire format
    carried = raw.get(KEY) if isinstance(raw, dict) else None
    if not isinstance(carried, dict):
        return None
    headers = {k: carried[k] for k in ("traceparent", "tracestate") if isinstance(carried.get(k), str)}
    ctx = _propagator.extract(headers)
    step, validate = sc.step_key(carried)
    if step is None:
        return ctx, None
    trace_per = carried.get(sc.RL_TRACE_PER)
    if trace_per not in ("sample", "step"):
        trace_per = state.defaults.trace_per
    return ctx, _context.StepState(step, validate, trace_per, trace.get_current_span(ctx))


async def server_handle(original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    """``EnvServer._handle(client_id, request_id, method, payload)``: a carried ``run`` request runs in the
    caller's context and step (this handler runs in its own task: what it attaches stays there)."""
    adopted = None
    try:
        ensure_configured()
        method = args[3] if len(args) > 3 else kwargs.get("method")
        if method == b"run" and current_tracer() is not None:
            adopted = _adopt(args[4] if len(args) > 4 else kwargs.get("payload"))
    except Exception:
        internal_error("verifiers.env_server")
    if adopted is None:
        return await original(*args, **kwargs)
    ctx, step = adopted
    token = otel_context.attach(ctx)
    step_token = _context.enter_step_state(step) if step is not None else None
    try:
        return await original(*args, **kwargs)
    finally:
        if step_token is not None:
            _context.leave_step_state(step_token)
        otel_context.detach(token)
