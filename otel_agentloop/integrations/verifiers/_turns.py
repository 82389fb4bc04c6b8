"""Each model call of a rollout as a generation turn, in the sample's trace.

verifiers serves a harness's model call in its interception server's own request task, where the rollout's
context is absent: the call's ``session_id`` (the rollout's trace id, sent upstream as ``X-Session-ID``) finds
the sample (:func:`._rollout.session`). The turn span (``chat <model>``) starts when the client sends the
request upstream and its ``traceparent`` goes out with it (unless the request already carries one), so a vLLM
OpenAI server's ``llm_request`` is its child.

- ``get_response`` (a buffered call, eval or training client): usage tokens, id and finish reasons from the
  response body (:func:`record_openai_response`).
- ``relay`` (a streamed call): the response streams on after the call returns.
- Either ends in ``InterceptionServer.record_call``, verifiers' own per-call record, lasting the duration
  verifiers measured for the call (as verl's turns take verl's timer), with its usage, finish reason and
  error; or at the end of the request task, whichever comes first.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from ... import semconv as sc
from ...core._context import _SAMPLE
from ...core._guard import internal_error
from ...core._lifecycle import finish
from ...core._phase import PhaseSpec, start
from ...core._scope import OpenSpan, span_of
from .._engine import record_openai_response, trace_headers
from .._patching import Args, AsyncOriginal, Kwargs, Original, awaited_in
from . import _toolphase
from ._rollout import session

_specs: dict[str, PhaseSpec] = {}
_open: weakref.WeakKeyDictionary[asyncio.Task[Any], OpenSpan] = weakref.WeakKeyDictionary()


def _spec(model: object) -> PhaseSpec:
    name = model if isinstance(model, str) and model else ""
    spec = _specs.get(name)
    if spec is None:
        spec = PhaseSpec.build(sc.GENERATE, model=name or None, operation="chat")
        if len(_specs) < 256:
            _specs[name] = spec
    return spec


def _begin(args: Args, kwargs: Kwargs) -> tuple[OpenSpan | None, dict[str, Any]]:
    """Open the turn below the rollout's sample; ``kwargs`` with the ``traceparent`` header added."""
    try:
        found = session(kwargs.get("session_id"))
        if found is None:
            return None, kwargs
        ctx, handle = found
        body = args[2] if len(args) > 2 else kwargs.get("body")
        model = body.get("model") if isinstance(body, Mapping) else None
        token = otel_context.attach(ctx)
        sample_token = _SAMPLE.set(handle)
        try:
            scope = start(_spec(model), attach=False)
            if scope is None:
                return None, kwargs
            with trace.use_span(span_of(scope), end_on_exit=False):
                carrier = trace_headers()
        finally:
            _SAMPLE.reset(sample_token)
            otel_context.detach(token)
        headers = kwargs.get("headers")
        given = {str(k).lower() for k in headers} if isinstance(headers, Mapping) else set()
        positional = len(args) > 4  # past (self, dialect, body, sampling): headers may be positional, left as given
        if (
            carrier
            and not positional
            and "traceparent" not in given
            and (headers is None or isinstance(headers, Mapping))
        ):
            kwargs = {**kwargs, "headers": {**(headers or {}), **carrier}}
        return scope, kwargs
    except Exception:
        internal_error("verifiers.turn_begin")
        return None, kwargs


async def get_response(original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    """``Client.get_response(dialect, body, sampling, session_id=..., headers=...)`` as one turn; the response's
    usage, id and finish reasons go on it now, and it ends in ``record_call`` (see :func:`record_call`)."""
    return await _turn(original, args, kwargs, True)


async def relay(original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    """``EvalClient.relay(...)``: the turn stays open while the stream is read, and ends in ``record_call``."""
    return await _turn(original, args, kwargs, False)


async def _turn(original: AsyncOriginal, args: Args, kwargs: Kwargs, response: bool) -> object:
    scope, kwargs = _begin(args, kwargs)
    if scope is None:
        return await original(*args, **kwargs)
    reply = await awaited_in(scope, original, args, kwargs)
    if response:  # usage, id and finish reasons of the OpenAI-compatible body
        record_openai_response(getattr(reply, "raw", None), span=span_of(scope))
    _hold(scope)
    return reply


def _hold(scope: OpenSpan) -> None:
    """Keep the turn open until this request task's ``record_call`` (or its end, whichever comes first)."""
    try:
        task = asyncio.current_task()
        if task is None:
            finish(scope)
            return
        _open[task] = scope
        task.add_done_callback(_task_done)
    except Exception:
        internal_error("verifiers.turn_hold")
        finish(scope)


def _task_done(task: asyncio.Task[Any]) -> None:
    scope = _open.pop(task, None)
    if scope is not None:
        finish(scope)


def record_call(original: Original, args: Args, kwargs: Kwargs) -> object:
    """``InterceptionServer.record_call(session, ...)``, verifiers' own record of the call: ends this request
    task's turn with the duration verifiers measured (so the two agree), its usage, finish reason and error."""
    scope = None
    calls = None
    try:
        task = asyncio.current_task()
        scope = _open.pop(task, None) if task is not None else None
        if scope is not None:
            calls = getattr(getattr(args[1] if len(args) > 1 else kwargs.get("session"), "trace", None), "calls", None)
    except Exception:
        internal_error("verifiers.record_call")
    before = len(calls) if isinstance(calls, list) else -1
    result = original(*args, **kwargs)
    if scope is not None:
        rollout = args[1] if len(args) > 1 else kwargs.get("session")
        try:
            measured = calls[-1] if isinstance(calls, list) and 0 <= before < len(calls) else None
            _end(scope, kwargs, measured)
        except Exception:
            internal_error("verifiers.record_call")
            finish(scope)
        if kwargs.get("error") is None:  # tool calls handed to the harness: its tool phase starts
            _toolphase.turn_returned(rollout, kwargs.get("node"), session(_toolphase.trace_id_of(rollout)))
    return result


def _end(scope: OpenSpan, kwargs: dict[str, Any], measured: Any) -> None:
    span = span_of(scope)
    usage = kwargs.get("usage")
    for key, name in (
        (sc.GEN_AI_USAGE_INPUT_TOKENS, "prompt_tokens"),
        (sc.GEN_AI_USAGE_OUTPUT_TOKENS, "completion_tokens"),
    ):
        value = getattr(usage, name, None)
        if type(value) is int and value >= 0:
            span.set_attribute(key, value)
    reason = kwargs.get("finish_reason")
    if isinstance(reason, str) and reason:
        span.set_attribute(sc.GEN_AI_RESPONSE_FINISH_REASONS, (reason,))
    error = kwargs.get("error")
    exc = error if isinstance(error, BaseException) else None
    end_time = None
    timed = getattr(measured, "time", None)
    begin = getattr(span, "start_time", None)
    if exc is None and timed is not None and isinstance(begin, int) and begin:
        elapsed = float(timed.end) - float(timed.start)
        end_time = begin + int(elapsed * 1e9) if elapsed > 0 else None
    finish(scope, exc, end_time)
