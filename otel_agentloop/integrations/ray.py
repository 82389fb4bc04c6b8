"""Ray: tracing set up in every worker, the step context carried across actor calls, metrics merged.

Driver::

    handle = otel_agentloop.configure("rollout")
    ray.init(runtime_env=otel_agentloop.integrations.ray.runtime_env(handle))
    with otel_agentloop.step(step):
        refs = [w.generate.remote(chunk, otel_carrier=carrier()) for w, chunk in zip(workers, chunks)]
        ...
    tables = ray.get([w.phase_table.remote(step) for w in workers])   # each calls worker_table(step)
    verdicts = ray.get([w.verdict.remote(step) for w in workers])      # each calls worker_verdict(step)
    metrics = merge_metrics(tables, verdicts)   # verl's dict, same code as collect(); writes rl.step.summary

Worker: decorate the actor method with :func:`traced_remote` (it adds the keyword ``otel_carrier`` and
declares it in ``__signature__``, which Ray checks after unwrapping decorators); inside, the driver's step
is current, so ``otel_agentloop.sample(...)`` behaves as in the driver. Every worker process configures
itself from the driver's settings (``worker_process_setup_hook``, or lazily on first use).

The carrier is a plain dict (W3C ``traceparent``/``tracestate`` plus step, validate and trace mode), so it
can also travel inside a payload instead of as a keyword.

One switch for every node: ``opentelemetry-instrument python driver.py`` loads :class:`RayInstrumentor`
(entry point ``ray``), which wraps ``ray.init`` in the driver so that its ``runtime_env`` carries the
driver's settings and the setup hook to every node (:func:`instrument`). A driver whose command line names
the setup hook (verl's ``...worker_process_setup_hook=otel_agentloop.integrations.verl.setup_worker``) gets
the same wrap from the installed ``otel_agentloop_startup.pth``. Settings travel only through
``runtime_env``: a worker never relies on its node's shell, and one that got no settings from its driver
says so once, naming its node, instead of writing a local file nobody reads.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import importlib.util
import inspect
import json
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable, Collection, Generator, Iterable, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .. import semconv as sc
from ..config._environment import DRIVER_VARIABLE
from ..config._otlp import resolve_otlp
from ..config._settings import SPECS, resolve
from ..core import _context
from ..core._guard import internal_error, logger, warn_once
from ..core._instrument import instrument as wrap_callable
from ..core._lifecycle import open_span
from ..core._scope import OpenSpan, Scope, span_of
from ..core._state import state
from ..core._tracer import current_tracer
from ..metrics._table import PhaseTable, StepMetrics, compute_metrics
from ..setup import Handle, configure, current_handle, write_step_summary
from ._instrumentor import Instrumentor

SPECS_BY_NAME = {name: spec for name, spec, _ in SPECS}
CARRIER_KEYWORD = "otel_carrier"
SETUP_HOOK = f"{__name__}.setup_worker"
_INSTALL_HINT = "otel_agentloop.integrations.ray needs Ray: pip install 'otel-agentloop[ray]'"
_propagator = TraceContextTextMapPropagator()
_setup_lock = threading.Lock()


def _reset_after_fork() -> None:
    global _setup_lock, _init_lock
    _setup_lock = threading.Lock()
    _init_lock = threading.RLock()


os.register_at_fork(after_in_child=_reset_after_fork)


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    return ray


def runtime_env(
    handle: Handle | None = None, base: Mapping[str, Any] | None = None, *, setup_hook: str = SETUP_HOOK
) -> dict[str, Any]:
    """A Ray ``runtime_env`` that makes every worker process, on every node, configure tracing like
    ``handle``'s process: its ``env_vars`` carry every setting of ``handle.settings`` that is not the default
    (``handle.worker_env``) and :data:`DRIVER_VARIABLE`, so the worker's ``handle.settings`` equals the
    driver's whatever its node's environment holds (its resource attributes add its identity).

    ``base`` is merged in (its ``env_vars`` win, and its own ``worker_process_setup_hook`` is kept; else
    ``setup_hook`` runs in every worker). Pass it to ``ray.init`` (all workers) or to an actor's
    ``.options(runtime_env=...)``.
    """
    _ray()
    handle = handle or current_handle()
    env = dict(handle.worker_env if handle is not None else {})
    out: dict[str, Any] = dict(base or {})
    env_vars = {**env, **dict(out.get("env_vars") or {})}
    env_vars.pop(DRIVER_VARIABLE, None)
    handed = sorted(k for k in env_vars if k.startswith("OTEL_"))
    env_vars[DRIVER_VARIABLE] = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "env": handed})
    out["env_vars"] = env_vars
    out.setdefault("worker_process_setup_hook", setup_hook)
    return out


def _handle() -> Handle | None:
    """This process's handle: the worker's own while it is open, else the current one."""
    handle: Handle | None = state.worker_handle
    return handle if handle is not None and not handle.closed else current_handle()


def setup_worker() -> Handle:
    """Configure tracing in this process from the environment (idempotent; safe in the driver too).

    In a Ray worker, the settings are the driver's when :func:`runtime_env` handed them over
    (:data:`DRIVER_VARIABLE`). A worker without them and without an OTLP endpoint of its own warns once,
    naming its node and what is missing, and exports nothing (metrics are still recorded): never a silent
    local file on a remote node. A worker on another host than its driver, told to write a file, says where.
    Warnings of this library in a Ray worker go to its stderr, which Ray forwards to the driver.

    The process's identity (node, pid, and the actor and job when Ray knows them) goes into the resource;
    Ray is never initialised here. Spans are flushed, within 5 s, when the process exits normally;
    ``ray.kill`` skips that, so :func:`traced_remote` also flushes at the end of each call.
    """
    with _setup_lock:
        own: Handle | None = state.worker_handle
        if own is not None and not own.closed:
            return own
        existing = current_handle()
        if existing is not None and not existing.closed:  # the driver, or a process the user configured by hand
            state.worker_handle = existing
            return existing
        attrs: dict[str, Any] = {"process.pid": os.getpid()}
        worker = f"{os.uname().nodename}:{os.getpid()}"
        node: tuple[str, str] | None = None
        try:
            ray = sys.modules.get("ray")  # a process that never imported Ray is no Ray worker
            if ray is not None and ray.is_initialized():  # get_runtime_context() would start a local Ray
                ctx = ray.get_runtime_context()
                attrs["ray.node.id"] = ctx.get_node_id()
                attrs["ray.job.id"] = ctx.get_job_id()
                actor = ctx.get_actor_id()
                if actor:
                    attrs["ray.actor.id"] = actor
                    worker = f"{worker}:{actor[:8]}"
                if ctx.worker.mode == ray.WORKER_MODE:
                    node = (str(ray.util.get_node_ip_address()), str(ctx.get_node_id()))
        except Exception:  # identity is best effort, never a reason to fail setup
            pass
        driver = None
        if node is not None:
            route_logs_to_stderr()
            driver = _take_driver_settings(node)
            if driver is None:
                _job_run_identity(str(attrs.get("ray.job.id") or "unknown"))
        attrs[sc.RL_WORKER] = worker
        own = state.worker_handle = configure(resource_attributes=attrs, worker=worker)
        _instrument_engines()
        if node is not None and driver is not None:
            _check_file_on_remote_node(own, driver, node)
        atexit.register(own.shutdown, 5.0)
        return own


def _instrument_engines() -> None:
    """An inference engine installed in this worker is instrumented too (``integrations.vllm``: patched when
    vLLM is imported, so nothing is imported here): the one switch reaches engines started in Ray workers."""
    if importlib.util.find_spec("vllm") is None:
        return
    try:
        from . import vllm

        vllm.instrument()
    except Exception:
        internal_error("ray.instrument_engines")


def _job_run_identity(job: str) -> None:
    """A Ray worker that got no run identity from its driver cannot know the driver's run: unless its node
    sets ``OTEL_AGENTLOOP_RUN_ID``/``_RUN_ATTEMPT``, its spans carry ``ray-job-<job id>`` as both, the same for
    every such worker of the job (never an id of its own per process)."""
    run = resolve(only=("run_id", "run_attempt"))
    for name, value in (("run_id", run.run_id), ("run_attempt", run.run_attempt)):
        if value is None:
            os.environ[SPECS_BY_NAME[name].env] = f"ray-job-{job}"


def _describe(node: tuple[str, str]) -> str:
    return f"{node[0]} (node id {node[1][:12]})"


def _take_driver_settings(node: tuple[str, str]) -> dict[str, Any] | None:
    """In a Ray worker: the driver's hand-off (:data:`DRIVER_VARIABLE`), with this node's own ``OTEL_*``
    variables that the driver did not hand over removed. Without a hand-off, and without an OTLP endpoint or
    an explicit exporter choice of its own, this worker exports nothing and warns once, naming its node."""
    raw = os.environ.get(DRIVER_VARIABLE)
    if raw:
        try:
            driver = json.loads(raw)
            handed = set(driver["env"])
            for key in [k for k in os.environ if k.startswith("OTEL_") and k not in handed]:
                if key != DRIVER_VARIABLE:
                    del os.environ[key]  # the driver left it at its default: so does this worker
            return dict(driver)
        except Exception:
            warn_once(
                "ray.driver_settings", "otel_agentloop: malformed %s in this Ray worker; ignored", DRIVER_VARIABLE
            )
    if resolve_otlp("TRACES").endpoint is not None or any(
        os.environ.get(key, "").strip() for key in ("OTEL_AGENTLOOP_FILE", "OTEL_TRACES_EXPORTER")
    ):
        return None  # this node's environment chose where spans go
    warn_once(
        "ray.no_driver_settings",
        "otel_agentloop: Ray worker on node %s (pid %d) got no tracing settings from its driver (no %s in its "
        "runtime_env) and its node sets no OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT): its spans are not "
        "exported (metrics are still recorded). A setup hook named in a config file (Hydra --config-name) or in "
        "the driver's code runs only in workers: start the driver with `opentelemetry-instrument`, or put the "
        "flag on its command line (verl: +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook="
        "otel_agentloop.integrations.verl.setup_worker), or pass "
        "runtime_env=otel_agentloop.integrations.ray.runtime_env() to ray.init.",
        _describe(node),
        os.getpid(),
        DRIVER_VARIABLE,
    )
    os.environ["OTEL_TRACES_EXPORTER"] = "none"  # no local file on a node nobody looks at
    return None


def _check_file_on_remote_node(handle: Handle, driver: Mapping[str, Any], node: tuple[str, str]) -> None:
    path = handle.settings.file
    if driver.get("host") == socket.gethostname() or not any(
        p.startswith("file ") for p in handle.description.split(", ")
    ):
        return
    warn_once(
        "ray.remote_file",
        "otel_agentloop: Ray worker on node %s: the driver (on host %s) exports to a file, so this worker "
        "writes its spans to %s on this node; set OTEL_EXPORTER_OTLP_ENDPOINT to an endpoint every node can "
        "reach to collect them in one place.",
        _describe(node),
        driver.get("host"),
        path,
    )


def route_logs_to_stderr() -> None:
    """In a Ray worker: this library's warnings go to the process's stderr whatever the logging
    configuration of the libraries it runs (a root logger at ERROR, no handlers), once per line (not also
    through the root logger); Ray forwards the worker's stderr to the driver (``log_to_driver``). Idempotent;
    a handler the user attached to ``otel_agentloop`` is kept and left in charge."""
    if logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)  # Ray's stream: it replaced sys.stderr before any hook runs
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)
    logger.propagate = False


def carrier() -> dict[str, Any]:
    """The current trace context and step (driver side), as a small picklable dict."""
    out: dict[str, Any] = {}
    _propagator.inject(out)
    step = _context.current_step()
    if step is not None:
        out[sc.RL_STEP] = step.step
        out[sc.RL_VALIDATE] = step.validate
        out[sc.RL_TRACE_PER] = step.trace_per
    return out


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
                attrs: dict[str, Any] = {sc.RL_WORKER: state.defaults.worker}
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
        handle = _handle()
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
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
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
    handle = _handle()
    return handle is not None and handle.enabled and any(p.healthy for p in handle.export_processors)


def worker_table(step: int | None, validate: bool = False, *, flush_timeout_s: float = 5.0) -> PhaseTable:
    """This worker's per-sample table of ``step`` (releasing it). Its spans are flushed first, waiting (at most
    ``flush_timeout_s``) only while the backend answers quickly: the table never depends on export, and a dead
    or hung backend must not add the timeout to every step (see :meth:`Handle.request_flush`)."""
    handle = setup_worker()
    handle.request_flush(flush_timeout_s)
    return handle.metrics.take(step, validate)


def merge_metrics(
    tables: Iterable[PhaseTable],
    verdicts: Iterable[Any] | None = None,
    *,
    step: int | None = None,
    validate: bool | None = None,
    log: bool = True,
) -> StepMetrics:
    """verl's metric dict over all workers' tables: the same code as single-process ``collect()``.

    ``verdicts``: the workers' watchdog verdicts (:func:`worker_verdict`), merged in as :func:`add_verdicts`
    does (``log``: its driver warning line). Then the step's ``rl.step.summary`` span is written here (the
    driver), from the merged table and verdicts: the step is ``step``/``validate`` when given, else the one
    the tables were taken for (:func:`worker_table`); no summary when the tables disagree or say none. Pass
    the verdicts here rather than to :func:`add_verdicts` afterwards, so the summary holds them."""
    table = PhaseTable.concat(tables)
    metrics = compute_metrics(table)
    if verdicts is not None:
        add_verdicts(metrics, verdicts, step=step, log=log)
    key = table.step_key
    if step is not None or key is not None:
        summary_step = step if step is not None or key is None else key[0]
        summary_validate = validate if validate is not None else key is not None and key[1]
        write_step_summary(table, metrics, summary_step, summary_validate, handle=_handle())
    return metrics


# -- in-flight samples across workers --------------------------------------------------------------
def inflight(limit: int | None = None) -> list[Any]:
    """This process's running samples (``InflightSample``, oldest first); ``[]`` before ``configure``."""
    handle = _handle()
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
    handle = _handle()
    live = handle.live if handle is not None else None
    if live is None:
        from ..metrics._verdicts import Verdict

        return Verdict()
    return live.verdict(step, validate)


def add_verdicts(
    metrics: StepMetrics, verdicts: Iterable[Any], *, step: int | None = None, log: bool = True
) -> StepMetrics:
    """``agent_loop/watchdog/{slow,hung}`` and their trace ids over all workers' verdicts, into ``metrics``;
    when the watchdog reported samples (and ``log``), one warning line in this process (the driver) names them
    (at most :data:`MAX_LISTED`): Ray folds similar lines from different workers into one
    (``[repeated Nx across cluster]``), so the merged verdict is said where nothing folds it. Pass
    ``log=False`` when the caller prints the verdict itself."""
    from ..metrics._verdicts import apply_verdicts

    verdicts = list(verdicts)
    apply_verdicts(metrics, verdicts)
    try:
        if log:
            _log_verdict(metrics, len(verdicts), step)
    except Exception:
        internal_error("ray.add_verdicts")
    return metrics


MAX_LISTED = 20
"""Samples named in the driver's verdict line (the metrics carry every trace id)."""


def _log_verdict(metrics: StepMetrics, workers: int, step: int | None) -> None:
    slow, hung = metrics.slow_samples, metrics.hung_samples
    if not (slow or hung):
        return
    listed = [(s, "hung") for s in hung] + [(s, "slow") for s in slow]
    names = "; ".join(
        f"sample {s.sample_index}{'' if s.rollout_n is None else f'/{s.rollout_n}'} {kind} in {s.phase}"
        f"{f' (tool {s.tool})' if s.tool else ''}, trace {s.trace_id}"
        for s, kind in listed[:MAX_LISTED]
    )
    more = f"; and {len(listed) - MAX_LISTED} more" if len(listed) > MAX_LISTED else ""
    logger.warning(
        "otel_agentloop: watchdog verdict%s over %d workers: %d hung, %d slow: %s%s",
        "" if step is None else f" for step {step}",
        workers,
        len(hung),
        len(slow),
        names,
        more,
    )


# -- one switch: ray.init in the driver carries the settings to every node ------------------------------
class _InitPatch:
    __slots__ = ("active", "hooked", "original", "wrapper")

    def __init__(self) -> None:
        self.active = False
        self.original: Any = None
        self.wrapper: Any = None
        self.hooked = False


_init = _InitPatch()
_init_lock = threading.RLock()


def is_instrumented() -> bool:
    return _init.active


def instrument() -> bool:
    """Wrap ``ray.init`` (idempotent; Ray is not imported for it: the wrap happens when Ray is).

    A ``ray.init`` that starts or joins a cluster then gets, in its ``runtime_env``, this process's tracing
    settings and the worker setup hook (:func:`runtime_env`; verl's hook when verl is instrumented here, and a
    hook the caller set is kept), so workers on every node export like this process. Tracing is configured
    here from the environment at that moment, unless ``configure()`` already was. Returns whether Ray is
    (or will be, when imported) instrumented; ``False`` when Ray is not installed.
    """
    import importlib.util

    with _init_lock:
        if _init.active:
            return True
        if "ray" not in sys.modules and importlib.util.find_spec("ray") is None:
            return False
        _init.active = True
        if "ray" in sys.modules:
            _wrap_init(sys.modules["ray"])
        elif not _init.hooked:
            try:
                import wrapt  # opentelemetry-instrumentation's own dependency

                wrapt.register_post_import_hook(_wrap_init, "ray")
                _init.hooked = True
            except ImportError:
                _wrap_init(_ray())
        return True


def uninstrument() -> None:
    """Put ``ray.init`` back (the very same object); idempotent."""
    with _init_lock:
        _init.active = False
        ray: Any = sys.modules.get("ray")
        if ray is not None and _init.wrapper is not None and ray.init is _init.wrapper:
            ray.init = _init.original
        _init.original = _init.wrapper = None


def _wrap_init(ray: Any) -> None:
    with _init_lock:
        if not _init.active or _init.wrapper is not None:
            return
        original = ray.init

        @functools.wraps(original)
        def init(*args: Any, **kwargs: Any) -> Any:
            if _init.active and not ray.is_initialized():
                try:
                    kwargs["runtime_env"] = traced_runtime_env(kwargs.get("runtime_env"))
                except Exception:
                    internal_error("ray.init")
            return original(*args, **kwargs)

        _init.original, _init.wrapper = original, init
        ray.init = init


def traced_runtime_env(given: Mapping[str, Any] | None) -> dict[str, Any]:
    """``given`` (a ``ray.init`` runtime_env, or ``None``) plus this process's tracing settings and setup hook
    (:func:`runtime_env`); tracing is configured here first when it is not yet."""
    handle = _driver_handle()
    verl = sys.modules.get("otel_agentloop.integrations.verl")  # verl's hook also instruments each worker
    verl_on = verl is not None and verl.is_instrumented()
    hook = "otel_agentloop.integrations.verl.setup_worker" if verl_on else SETUP_HOOK
    return runtime_env(handle, base=dict(given or {}), setup_hook=hook)


def _driver_handle() -> Handle:
    """The driver's open handle, else one configured now from the environment (shut down at exit)."""
    with _setup_lock:
        handle = current_handle()
        if handle is None or handle.closed:
            handle = configure()
            atexit.register(handle.shutdown, 5.0)
        return handle


class RayInstrumentor(Instrumentor):
    """OpenTelemetry instrumentor for Ray (``opentelemetry_instrumentor`` entry point ``ray``), what
    ``opentelemetry-instrument python driver.py`` loads: :func:`instrument` / :func:`uninstrument`."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("ray >= 2.40",)

    def _instrument(self, **kwargs: Any) -> None:
        instrument()

    def _uninstrument(self, **kwargs: Any) -> None:
        uninstrument()
