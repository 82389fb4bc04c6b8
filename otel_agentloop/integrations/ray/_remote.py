"""Actor calls below the driver's step: the carrier (driver side), :func:`remote_step` and :func:`traced_remote`
(worker side), and the flush at each call's end."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
from collections.abc import Callable, Generator, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from ... import semconv as sc
from ...core import _context
from ...core._guard import internal_error
from ...core._instrument import instrument as wrap_callable
from ...core._lifecycle import open_span
from ...core._scope import OpenSpan, Scope, span_of
from ...core._state import state
from ...core._tracer import current_tracer
from .._carrier import step_carrier
from ._common import own_handle
from ._worker import setup_worker

CARRIER_KEYWORD = "otel_carrier"
_propagator = TraceContextTextMapPropagator()


def carrier() -> dict[str, object]:
    """The current trace context and step (driver side), as a small picklable dict."""
    return step_carrier()


class _RemoteScope(Scope):
    """One actor call below the driver's step: the ``rl.worker`` span and the step context, current while the
    call runs (each resume, for generators); at the end a flush is requested, off the caller's path."""

    __slots__ = ("ctx", "otel_token", "span", "state", "step_token", "wait_s")

    def __init__(self, carrier: Mapping[str, Any] | None, worker_span: bool, wait_s: float) -> None:
        self.ctx: otel_context.Context | None = None
        self.span: OpenSpan | None = None
        self.state: _context.StepState | None = None
        self.otel_token: object = None
        self.step_token: Any = None
        self.wait_s = wait_s
        if not carrier:
            return
        try:
            setup_worker()
            parent_ctx = _propagator.extract(dict(carrier))
            self.ctx = parent_ctx
            tracer = current_tracer() if worker_span else None
            step, validate = sc.step_key(carrier)  # the driver's step (see carrier()), if any
            if tracer is not None:
                attrs: dict[str, AttributeValue] = {sc.RL_WORKER: state.defaults.worker}
                if step is not None:
                    attrs[sc.RL_STEP] = step
                    attrs[sc.RL_VALIDATE] = validate
                self.span = open_span(tracer, sc.WORKER_SPAN, attrs, context=parent_ctx, enter=False)
                if self.span is not None:
                    self.ctx = trace.set_span_in_context(span_of(self.span), parent_ctx)
            if step is not None:
                self.state = _context.StepState(
                    step,
                    validate,
                    carrier.get(sc.RL_TRACE_PER) or state.defaults.trace_per,
                    trace.get_current_span(parent_ctx),
                )
        except Exception:
            internal_error("traced_remote.begin")

    def enter(self) -> None:
        try:
            if self.ctx is not None:
                self.otel_token = otel_context.attach(self.ctx)
            if self.state is not None:
                self.step_token = _context.enter_step_state(self.state)
        except Exception:
            internal_error("traced_remote.enter")

    def leave(self) -> None:
        step_token, self.step_token = self.step_token, None
        otel_token, self.otel_token = self.otel_token, None
        try:
            if step_token is not None:
                _context.leave_step_state(step_token)
            if otel_token is not None:
                otel_context.detach(otel_token)  # type: ignore[arg-type]
        except Exception:
            internal_error("traced_remote.leave")

    def close(self, exc: BaseException | None) -> None:
        span, self.span = self.span, None
        if span is not None:
            span.close(exc)
        _flush(self.wait_s)


@contextlib.contextmanager
def remote_step(carrier: Mapping[str, Any] | None, *, worker_span: bool = True) -> Generator[None, None, None]:
    """Re-enter the driver's step below its remote span (worker side).

    With ``worker_span``, a ``rl.worker`` span (child of the driver's current span) groups this call's
    samples: step -> worker call -> samples -> phases. Without a carrier, nothing changes.
    """
    scope = _RemoteScope(carrier, worker_span, 0.0)
    scope.enter()
    try:
        yield
    except BaseException as exc:
        scope.exit(exc)
        raise
    scope.exit(None)


def _flush(wait_s: float) -> None:
    """Ask this process's exporters to export now. Waits (at most ``wait_s``) only while the export path is
    healthy: once an export failed or a wait timed out, calls never wait until an export succeeds again, so
    a dead or hung backend costs the caller nothing (spans queue, and drops are counted)."""
    try:
        handle = own_handle()
        if handle is not None and handle.enabled:
            handle.request_flush(wait_s)
    except Exception:
        internal_error("traced_remote.flush")


def traced_remote(
    fn: Callable[..., Any] | None = None, *, flush_timeout_s: float = 5.0, worker_span: bool = True
) -> Any:
    """Decorate an actor method: it accepts ``otel_carrier=`` and runs inside :func:`remote_step`.

    The keyword is declared in the wrapper's ``__signature__`` (Ray validates calls against it). When each call
    ends its spans are handed to the export thread at once; a sync or async method also waits for that export
    (an async one on a thread, never blocking its event loop), at most ``flush_timeout_s``, but only while the
    backend answers quickly (see :func:`_flush`), so ``ray.kill`` right after a call loses nothing with a live
    backend and a dead, hung or slow one never slows the calls. Generator methods only hand their spans over.
    Sync, async, generator and async-generator methods keep their semantics (the library's one lifecycle).
    """
    if fn is None:
        return functools.partial(traced_remote, flush_timeout_s=flush_timeout_s, worker_span=worker_span)
    if not (isinstance(flush_timeout_s, (int, float)) and 0 <= flush_timeout_s < float("inf")):
        raise ValueError(f"flush_timeout_s must be a finite number >= 0, not {flush_timeout_s!r}")
    sig = inspect.signature(fn)
    if CARRIER_KEYWORD in sig.parameters:
        raise TypeError(f"{fn.__qualname__} already has a parameter named {CARRIER_KEYWORD!r}")
    params = list(sig.parameters.values())
    extra = inspect.Parameter(CARRIER_KEYWORD, inspect.Parameter.KEYWORD_ONLY, default=None)
    insert_at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
    new_sig = sig.replace(parameters=[*params[:insert_at], extra, *params[insert_at:]])
    # only a plain sync call may wait (briefly, while healthy): never block an event loop or a generator
    wait_s = (
        flush_timeout_s
        if not (inspect.iscoroutinefunction(fn) or inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn))
        else 0.0
    )

    def begin(kwargs: dict[str, Any]) -> _RemoteScope:
        scope = _RemoteScope(kwargs.pop(CARRIER_KEYWORD, None), worker_span, wait_s)
        scope.enter()
        return scope

    wrapper: Any = wrap_callable(fn, begin)
    if inspect.iscoroutinefunction(fn) and flush_timeout_s > 0:
        traced = wrapper

        @functools.wraps(fn)
        async def async_wrapper(*args: object, **kwargs: object) -> object:
            try:
                return await traced(*args, **kwargs)
            finally:
                if _flush_would_wait():  # the same health-gated wait as a sync call, off the event loop
                    await asyncio.to_thread(_flush, flush_timeout_s)

        wrapper = async_wrapper
    wrapper.__signature__ = new_sig
    del wrapper.__wrapped__  # Ray unwraps to check calls: it must see the carrier keyword
    return wrapper


def _flush_would_wait() -> bool:
    handle = own_handle()
    return handle is not None and handle.enabled and any(p.healthy for p in handle.export_processors)
