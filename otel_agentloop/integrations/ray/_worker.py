"""Worker setup: each Ray worker process configures tracing once, from its driver's settings, with its identity
(node, pid, actor, job) in the resource; the driver's own handle when tracing must be configured there."""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import sys
import threading

from opentelemetry.util.types import AttributeValue

from ... import semconv as sc
from ...config._fork import renew_lock
from ...core._guard import internal_error, logger
from ...core._state import state
from ...setup import Handle, configure, current_handle
from ._common import worker_handle
from ._handover import check_file_on_remote_node, job_run_identity, take_driver_settings

_setup_lock = threading.Lock()
renew_lock(globals(), "_setup_lock")


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
        own = worker_handle()
        if own is not None and not own.closed:
            return own
        existing = current_handle()
        if existing is not None and not existing.closed:  # the driver, or a process the user configured by hand
            state.worker_handle = existing
            return existing
        attrs: dict[str, AttributeValue] = {"process.pid": os.getpid()}
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
            driver = take_driver_settings(node)
            if driver is None:
                job_run_identity(str(attrs.get("ray.job.id") or "unknown"))
        attrs[sc.RL_WORKER] = worker
        own = state.worker_handle = configure(resource_attributes=attrs, worker=worker)
        _instrument_engines()
        if node is not None and driver is not None:
            check_file_on_remote_node(own, driver, node)
        atexit.register(own.shutdown, 5.0)
        return own


def _instrument_engines() -> None:
    """An inference engine installed in this worker is instrumented too (``integrations.vllm``: patched when
    vLLM is imported, so nothing is imported here): the one switch reaches engines started in Ray workers."""
    if importlib.util.find_spec("vllm") is None:
        return
    try:
        from .. import vllm

        vllm.instrument()
    except Exception:
        internal_error("ray.instrument_engines")


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


def driver_handle() -> Handle:
    """The driver's open handle, else one configured now from the environment (shut down at exit)."""
    with _setup_lock:
        handle = current_handle()
        if handle is None or handle.closed:
            handle = configure()
            atexit.register(handle.shutdown, 5.0)
        return handle
