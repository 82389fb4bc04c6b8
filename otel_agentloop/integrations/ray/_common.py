"""What every part of the Ray integration shares: Ray itself (imported on demand), the setup hook's name and
this process's handle."""

from __future__ import annotations

from types import ModuleType
from typing import cast

from ...core._state import state
from ...setup import Handle, current_handle

SETUP_HOOK = "otel_agentloop.integrations.ray.setup_worker"
"""The worker setup hook's import path: the package's name, which re-exports :func:`setup_worker` (Ray imports it in
every worker, and the startup hook's ``.pth`` line matches it)."""
_INSTALL_HINT = "otel_agentloop.integrations.ray needs Ray: pip install 'otel-agentloop[ray]'"


def ray_module() -> ModuleType:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(_INSTALL_HINT) from exc
    return ray


def own_handle() -> Handle | None:
    """This process's handle: the worker's own while it is open, else the current one."""
    handle = worker_handle()
    return handle if handle is not None and not handle.closed else current_handle()


def worker_handle() -> Handle | None:
    """This process's Ray-worker handle (``state.worker_handle``), typed: the one reader (core knows no ``Handle``;
    only :func:`~otel_agentloop.integrations.ray.setup_worker` stores one)."""
    return cast("Handle | None", state.worker_handle)
