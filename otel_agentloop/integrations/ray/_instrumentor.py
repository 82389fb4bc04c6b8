"""One switch for every node: ``ray.init`` wrapped in the driver so that its ``runtime_env`` carries the driver's
settings and the setup hook (:class:`RayInstrumentor`, what ``opentelemetry-instrument`` loads)."""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ...config._fork import renew_lock
from ...core._guard import internal_error
from .._instrumentor import Instrumentor
from ._common import SETUP_HOOK, ray_module
from ._handover import runtime_env
from ._worker import driver_handle


class _InitPatch:
    __slots__ = ("active", "hooked", "original", "wrapper")

    def __init__(self) -> None:
        self.active = False
        self.original: Callable[..., object] | None = None
        self.wrapper: Callable[..., object] | None = None
        self.hooked = False


_init = _InitPatch()
_init_lock = threading.RLock()
renew_lock(globals(), "_init_lock")


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
                _wrap_init(ray_module())
        return True


def uninstrument() -> None:
    """Put ``ray.init`` back (the very same object); idempotent."""
    with _init_lock:
        _init.active = False
        ray: Any = sys.modules.get("ray")  # Any: the ray module, whose ``init`` is put back
        if ray is not None and _init.wrapper is not None and ray.init is _init.wrapper:
            ray.init = _init.original
        _init.original = _init.wrapper = None


def _wrap_init(ray: Any) -> None:  # Any: the ray module, whose ``init`` is replaced
    with _init_lock:
        if not _init.active or _init.wrapper is not None:
            return
        original = ray.init

        @functools.wraps(original)
        def init(*args: object, **kwargs: Any) -> object:  # Any: ray.init's keywords, passed on
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
    handle = driver_handle()
    verl = sys.modules.get("otel_agentloop.integrations.verl")  # verl's hook also instruments each worker
    verl_on = verl is not None and verl.is_instrumented()
    hook = "otel_agentloop.integrations.verl.setup_worker" if verl_on else SETUP_HOOK
    return runtime_env(handle, base=dict(given or {}), setup_hook=hook)


class RayInstrumentor(Instrumentor):
    """OpenTelemetry instrumentor for Ray (``opentelemetry_instrumentor`` entry point ``ray``), what
    ``opentelemetry-instrument python driver.py`` loads: :func:`instrument` / :func:`uninstrument`."""

    dependencies = ("ray >= 2.40",)
    on, off = staticmethod(instrument), staticmethod(uninstrument)
