"""The hand-over: what the driver gives every Ray worker (``runtime_env``: its settings and the setup hook) and how
a worker takes it (the driver's ``OTEL_*`` variables applied, its node's own dropped; without them, one warning)."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from typing import Any

from ...config._environment import DRIVER_VARIABLE
from ...config._otlp import resolve_otlp
from ...config._settings import SPECS, resolve
from ...core._guard import warn_once
from ...setup import Handle, current_handle
from ._common import SETUP_HOOK, ray_module

SPECS_BY_NAME = {name: spec for name, spec, _ in SPECS}


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
    ray_module()
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


def job_run_identity(job: str) -> None:
    """A Ray worker that got no run identity from its driver cannot know the driver's run: unless its node
    sets ``OTEL_AGENTLOOP_RUN_ID``/``_RUN_ATTEMPT``, its spans carry ``ray-job-<job id>`` as both, the same for
    every such worker of the job (never an id of its own per process)."""
    run = resolve(only=("run_id", "run_attempt"))
    for name, value in (("run_id", run.run_id), ("run_attempt", run.run_attempt)):
        if value is None:
            os.environ[SPECS_BY_NAME[name].env] = f"ray-job-{job}"


def _describe(node: tuple[str, str]) -> str:
    return f"{node[0]} (node id {node[1][:12]})"


def take_driver_settings(node: tuple[str, str]) -> dict[str, Any] | None:
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


def check_file_on_remote_node(handle: Handle, driver: Mapping[str, Any], node: tuple[str, str]) -> None:
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
