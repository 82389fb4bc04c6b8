"""Ray: tracing set up in every worker, the step context carried across actor calls, metrics merged.

Driver::

    handle = otel_agentloop.configure("rollout")
    ray.init(runtime_env=otel_agentloop.integrations.ray.runtime_env(handle))
    with otel_agentloop.step(step):
        refs = [w.generate.remote(chunk, otel_carrier=carrier()) for w, chunk in zip(workers, chunks)]
        ...
    tables = ray.get([w.phase_table.remote(step) for w in workers])   # each calls worker_table(step)
    metrics = merge_metrics(tables)                                    # verl's dict, same code as collect()

Worker: decorate the actor method with :func:`traced_remote` (it adds the keyword ``otel_carrier`` and
declares it in ``__signature__``, which Ray checks after unwrapping decorators); inside, the driver's step
is current, so ``otel_agentloop.sample(...)`` behaves as in the driver. Every worker process configures
itself from the driver's settings (``worker_process_setup_hook``, or lazily on first use).

The carrier is a plain dict (W3C ``traceparent``/``tracestate`` plus step, validate and trace mode), so it
can also travel inside a payload instead of as a keyword.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import inspect
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .. import _context
from .. import semconv as sc
from .._configure import Handle, configure, current_handle
from .._table import PhaseTable, StepMetrics, compute_metrics
from .._tracer import current_tracer

F = TypeVar("F", bound=Callable[..., Any])
CARRIER_KEYWORD = "otel_carrier"
_INSTALL_HINT = "otel_agentloop.integrations.ray needs Ray: pip install 'otel-agentloop[ray]'"
_propagator = TraceContextTextMapPropagator()
_setup_lock = threading.Lock()
_worker_handle: Handle | None = None


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    return ray


def runtime_env(handle: Handle | None = None, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A Ray ``runtime_env`` that makes every worker process configure tracing like ``handle``'s process.

    ``base`` is merged in (its ``env_vars`` too). Pass it to ``ray.init`` (all workers) or to an actor's
    ``.options(runtime_env=...)``.
    """
    _ray()
    handle = handle or current_handle()
    env = dict(handle.worker_env if handle is not None else {})
    out: dict[str, Any] = dict(base or {})
    out["env_vars"] = {**env, **dict(out.get("env_vars") or {})}
    out.setdefault("worker_process_setup_hook", f"{__name__}.setup_worker")
    return out


def setup_worker() -> Handle:
    """Configure tracing in this worker process from the environment (idempotent; safe in the driver too).

    The worker's identity (node, pid, and the actor and job when Ray knows them) goes into the resource.
    Spans are flushed, within 5 s, when the process exits normally; ``ray.kill`` skips that, so
    :func:`traced_remote` also flushes at the end of each call.
    """
    global _worker_handle
    with _setup_lock:
        if _worker_handle is not None:
            return _worker_handle
        existing = current_handle()
        if existing is not None:  # the driver, or a process the user configured by hand
            _worker_handle = existing
            return existing
        attrs: dict[str, Any] = {"process.pid": os.getpid()}
        worker = f"{os.uname().nodename}:{os.getpid()}"
        try:
            ctx = _ray().get_runtime_context()
            attrs["ray.node.id"] = ctx.get_node_id()
            attrs["ray.job.id"] = ctx.get_job_id()
            actor = ctx.get_actor_id()
            if actor:
                attrs["ray.actor.id"] = actor
                worker = f"{worker}:{actor[:8]}"
        except Exception:  # identity is best effort, never a reason to fail setup
            pass
        attrs[sc.RL_WORKER] = worker
        _worker_handle = configure(resource_attributes=attrs, worker=worker)
        atexit.register(_worker_handle.shutdown, 5.0)
        return _worker_handle


def carrier() -> dict[str, Any]:
    """The current trace context and step (driver side), as a small picklable dict."""
    out: dict[str, Any] = {}
    _propagator.inject(out)
    step = _context.current_step()
    if step is not None:
        out[sc.RL_STEP] = step.step
        out[sc.RL_VALIDATE] = step.validate
        out["rl.trace_per"] = step.trace_per
    return out


@contextlib.contextmanager
def remote_step(carrier: Mapping[str, Any] | None, *, worker_span: bool = True) -> Iterator[None]:
    """Re-enter the driver's step below its remote span (worker side).

    With ``worker_span``, a ``rl.worker`` span (child of the driver's current span) groups this call's
    samples: step -> worker call -> samples -> phases. Without a carrier, nothing changes.
    """
    if not carrier:
        yield
        return
    setup_worker()
    parent_ctx = _propagator.extract(dict(carrier))
    token = otel_context.attach(parent_ctx)
    remote = trace.get_current_span(parent_ctx)
    span = None
    step_token = None
    try:
        tracer = current_tracer() if worker_span else None
        if tracer is not None:
            attrs: dict[str, Any] = {sc.RL_WORKER: _context.defaults.worker}
            if sc.RL_STEP in carrier:
                attrs[sc.RL_STEP] = int(carrier[sc.RL_STEP])
                attrs[sc.RL_VALIDATE] = bool(carrier.get(sc.RL_VALIDATE, False))
            span = tracer.start_span(sc.WORKER_SPAN, attributes=attrs)
            otel_context.detach(token)
            token = otel_context.attach(trace.set_span_in_context(span, parent_ctx))
        if sc.RL_STEP in carrier:
            state = _context.StepState(int(carrier[sc.RL_STEP]), bool(carrier.get(sc.RL_VALIDATE, False)),
                                       carrier.get("rl.trace_per") or _context.defaults.trace_per, remote)
            step_token = _context._STEP.set(state)
        yield
    except BaseException as exc:
        if span is not None:
            _context.mark_error(span, exc)
        raise
    finally:
        if step_token is not None:
            _context._STEP.reset(step_token)
        otel_context.detach(token)
        if span is not None:
            span.end()


def _flush(timeout_s: float) -> None:
    handle = _worker_handle or current_handle()
    if handle is not None:
        handle.force_flush(timeout_s)


def traced_remote(fn: F | None = None, *, flush_timeout_s: float = 5.0, worker_span: bool = True) -> Any:
    """Decorate an actor method: it accepts ``otel_carrier=`` and runs inside :func:`remote_step`.

    The keyword is declared in the wrapper's ``__signature__`` (Ray validates calls against it). Spans are
    flushed (at most ``flush_timeout_s``) when each call ends, so killed actors lose nothing already ended.
    """
    if fn is None:
        return functools.partial(traced_remote, flush_timeout_s=flush_timeout_s, worker_span=worker_span)
    sig = inspect.signature(fn)
    if CARRIER_KEYWORD in sig.parameters:
        raise TypeError(f"{fn.__qualname__} already has a parameter named {CARRIER_KEYWORD!r}")
    params = list(sig.parameters.values())
    extra = inspect.Parameter(CARRIER_KEYWORD, inspect.Parameter.KEYWORD_ONLY, default=None)
    insert_at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
    new_sig = sig.replace(parameters=[*params[:insert_at], extra, *params[insert_at:]])

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def async_wrapper(*args: Any, otel_carrier: Mapping[str, Any] | None = None, **kwargs: Any) -> Any:
            try:
                with remote_step(otel_carrier, worker_span=worker_span):
                    return await fn(*args, **kwargs)
            finally:
                await asyncio.to_thread(_flush, flush_timeout_s)

        wrapper: Any = async_wrapper
    else:
        @functools.wraps(fn)
        def sync_wrapper(*args: Any, otel_carrier: Mapping[str, Any] | None = None, **kwargs: Any) -> Any:
            try:
                with remote_step(otel_carrier, worker_span=worker_span):
                    return fn(*args, **kwargs)
            finally:
                _flush(flush_timeout_s)

        wrapper = sync_wrapper
    wrapper.__signature__ = new_sig
    del wrapper.__wrapped__  # Ray unwraps to check calls: it must see the carrier keyword
    return wrapper


def worker_table(step: int | None, validate: bool = False, *, flush_timeout_s: float = 5.0) -> PhaseTable:
    """This worker's per-sample table of ``step`` (releasing it), after a bounded flush of its spans."""
    handle = setup_worker()
    handle.force_flush(flush_timeout_s)
    return handle.metrics.take(step, validate)


def merge_metrics(tables: Iterable[PhaseTable]) -> StepMetrics:
    """verl's metric dict over all workers' tables: the same code as single-process ``collect()``."""
    return compute_metrics(PhaseTable.concat(tables))


# -- in-flight samples across workers --------------------------------------------------------------
def inflight(limit: int | None = None) -> list[Any]:
    """This process's running samples (``InflightSample``, oldest first); ``[]`` before ``configure``."""
    handle = _worker_handle or current_handle()
    return handle.inflight(limit) if handle is not None else []


def _inflight_in_actor(actor: Any, limit: int | None) -> list[Any]:
    return inflight(limit)


def gather_inflight(actors: Iterable[Any], *, limit: int | None = None, timeout_s: float = 5.0) -> list[Any]:
    """Running samples of every actor's process, oldest first (driver side; at most ``limit`` per actor).

    Runs a function in each actor through Ray's ``__ray_call__``: an async actor (verl's agent-loop workers)
    answers at once even while its samples run; a sync actor answers between calls. Actors that do not
    answer within ``timeout_s`` (in total) are left out. Nothing is added to the actor class.
    """
    ray = _ray()
    refs = [actor.__ray_call__.remote(_inflight_in_actor, limit) for actor in actors]
    if not refs:
        return []
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    out: dict[tuple[int, str], Any] = {}
    for ref in ready:
        try:
            for item in ray.get(ref):
                out[(item.pid, item.span_id)] = item  # two actors in one process report it once
        except Exception:  # an actor that died or failed: its samples are not running anywhere we can see
            continue
    return sorted(out.values(), key=lambda s: -s.sample_age_s)


def worker_verdict(step: int | None, validate: bool = False) -> Any:
    """This worker's watchdog verdict for ``step`` (call after :func:`worker_table`, which classifies)."""
    handle = _worker_handle or current_handle()
    live = handle.live if handle is not None else None
    if live is None:
        from .._watchdog import Verdict

        return Verdict()
    return live.verdict(step, validate)


def add_verdicts(metrics: StepMetrics, verdicts: Iterable[Any]) -> StepMetrics:
    """``agent_loop/watchdog/{slow,hung}`` and their trace ids over all workers' verdicts, into ``metrics``."""
    from .._watchdog import apply_verdicts

    apply_verdicts(metrics, list(verdicts))
    return metrics
