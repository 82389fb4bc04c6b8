"""The run's identity: ``rl.run.id`` and ``rl.run.attempt``, generated once per process (a driver launch) or
adopted (a resumed run)."""

from __future__ import annotations

import secrets
import threading
import time

from .. import semconv as sc
from ..config._fork import renew_lock
from ..config._settings import Settings
from ..core._guard import logger
from ._handle import current_handle

__all__ = ["_run_identity", "adopt_run_id", "new_run_id", "process_run_id"]


_run_lock = threading.Lock()
renew_lock(globals(), "_run_lock")  # a forked child keeps the run (the same launch), never a lock held at fork
_generated_run: list[str] = []  # this process's generated (run id, attempt), once: a reconfigure keeps them


def new_run_id() -> str:
    """A readable, sortable id: UTC time to the second + 6 random hex digits (``20261123T221500Z-3f9a1c``)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def process_run_id() -> str:
    """The run id this process uses where none is given (generated once, or adopted)."""
    with _run_lock:
        if not _generated_run:
            _generated_run.extend((new_run_id(), new_run_id()))
        return _generated_run[0]


def adopt_run_id(run_id: str) -> None:
    """Make ``run_id`` this process's run id where none is given (verl's resume from a checkpoint, decided in the
    driver before its workers start): a later :func:`configure` uses it, and the current handle hands it to the
    workers started from now on (``worker_env``). The current handle's own resource cannot change: spans it
    already made, and makes, keep the id it was configured with (said once)."""
    process_run_id()
    with _run_lock:
        _generated_run[0] = run_id
    handle = current_handle()
    if handle is None or handle.closed or not handle.enabled or handle.run_id == run_id:
        return
    handle.worker_env["OTEL_AGENTLOOP_RUN_ID"] = run_id
    logger.warning(
        "otel_agentloop: this process was configured as run %s before the run id %s was known; its workers get "
        "%s, its own spans keep %s",
        handle.run_id,
        run_id,
        run_id,
        handle.run_id,
    )


def _run_identity(s: Settings) -> tuple[str, str]:
    """(rl.run.id, rl.run.attempt) of this process: the settings' (argument, ``OTEL_AGENTLOOP_RUN_ID`` /
    ``_RUN_ATTEMPT``, the driver's hand-off), else ``rl.run.id`` of the resource attributes, else generated once
    per process (a driver launch)."""
    process_run_id()
    given = (s.resource_attributes or {}).get(sc.RL_RUN_ID)
    run_id = s.run_id or (str(given) if given else _generated_run[0])
    return run_id, s.run_attempt or _generated_run[1]
