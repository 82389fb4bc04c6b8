"""The process environment made safe for the OpenTelemetry SDK: :func:`sanitize_environment`.

The SDK reads many ``OTEL_*`` variables itself, some at import (``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT``), some in
constructors whatever their arguments say (``float(OTEL_EXPORTER_OTLP_TRACES_TIMEOUT)``), and raises on a bad
value or kills a thread with it. No argument can keep it from reading them, so this module checks every
variable that the SDK or this library reads, before any SDK module is imported (``otel_agentloop/__init__``)
and again at each ``configure()``: a bad value is **removed from this process's environment** (the SDK then
uses its default), an out-of-range one is **rewritten to the nearest bound**, each with one warning naming
the variable, the value and what is used instead. Valid values are left exactly as they are.

Declared here: :data:`LIBRARY_VARIABLES` (ours that are not settings), :data:`CLI_VARIABLES` and
:data:`TOOL_VARIABLES`; ``_sdk_variables`` declares the SDK's that are not settings (``SDK_VARIABLES``, each with
its parser and default, and ``WORKER_VARIABLES``, those handed to Ray workers; re-exported here) and
``Settings`` the rest. The rest of the library reads a variable only through :func:`variable` (a
declared name), or takes it from resolved ``Settings`` or ``_otlp`` (the OTLP exporters' settings). An unknown
``OTEL_AGENTLOOP_*`` name (a typo) warns once with the closest real name.
"""

from __future__ import annotations

import difflib
import os
import threading

from . import _local_stack
from ._fork import renew_lock
from ._sdk_variables import SDK_VARIABLES as SDK_VARIABLES  # the SDK's own, checked here with the rest
from ._sdk_variables import WORKER_VARIABLES as WORKER_VARIABLES
from ._sdk_variables import SdkVariable
from ._settings import SPECS
from ._values import AdjustedError, env_str, logger, warn_once

TOOL_VARIABLES = tuple(f"OTEL_AGENTLOOP_{n}" for n in ("CACHE", "DATA", "RUN_DIR", "STOP_TIMEOUT"))
"""``OTEL_AGENTLOOP_*`` variables read by the repository's scripts and tests, not by the library."""

DRIVER_VARIABLE = "OTEL_AGENTLOOP_DRIVER"
"""Set by ``integrations.ray.runtime_env`` in every Ray worker's environment: JSON ``{"host", "pid", "env"}``,
the driver's host and pid and the names of the ``OTEL_*`` variables it handed over. Its presence means "these
are the driver's settings": a worker then ignores ``OTEL_*`` variables of its own node that the driver did not
hand over (a driver left them at their defaults)."""

STARTUP_VARIABLE = "OTEL_AGENTLOOP_STARTUP_HOOK"
"""Turns off the setup-hook flag as the one switch (``otel_agentloop_startup``, at interpreter start, reads it with
the :func:`~otel_agentloop_switch.switch` the check here uses)."""


def _startup_switch(raw: str) -> str:
    """As ``otel_agentloop_startup`` reads it: an unrecognised value turns the startup hook off."""
    try:
        import otel_agentloop_switch as startup
    except ImportError:  # the package shipped alone (Ray's ``py_modules``): no .pth runs, nothing to switch
        return raw
    if startup.switch(raw) is None:
        raise AdjustedError(startup.reason(), "false")
    return raw


LIBRARY_VARIABLES = (SdkVariable(STARTUP_VARIABLE, _startup_switch, "true"),)
"""This library's own variables that are not :class:`~.Settings` fields (never handed to workers)."""
CLI_VARIABLES = (SdkVariable(_local_stack.VARIABLE, _local_stack.check_name, "the default stack"),)
"""Read by the command line (``report --jaeger`` without a URL reads the local stack's Jaeger) and the scripts
(``scripts/stack.py``): which local stack (``config._local_stack``)."""
_CHECKED = (*SDK_VARIABLES, *LIBRARY_VARIABLES, *CLI_VARIABLES)


def known_agentloop_names() -> set[str]:
    """Every ``OTEL_AGENTLOOP_*`` name something reads."""
    names = {var for _, spec, _ in SPECS for var in (spec.env, *spec.read)} | {
        *TOOL_VARIABLES,
        *(v.name for v in CLI_VARIABLES),
        DRIVER_VARIABLE,
        STARTUP_VARIABLE,
    }
    return {n for n in names if n.startswith("OTEL_AGENTLOOP_")}


_lock = threading.Lock()
renew_lock(globals(), "_lock")  # a forked child: never a lock held at fork


def sanitize_environment() -> None:
    """Check every variable this library or the SDK reads in ``os.environ`` (see the module docstring):
    remove a bad value, rewrite an out-of-range one to its bound, warn about each, naming the variable and
    what is used instead; warn once about an unknown ``OTEL_AGENTLOOP_*`` name. Never raises."""
    try:
        with _lock:
            _sanitize()
    except Exception:  # the check must never cost the user's program
        logger.warning("otel_agentloop: checking the OTEL_* environment failed", exc_info=True)


def _replace(var: str, raw: str, reason: object, used: str, new: str | None) -> None:
    logger.warning("otel_agentloop: %s=%r %s; using %s", var, raw, reason, used)
    if new is None:
        os.environ.pop(var, None)
    else:
        os.environ[var] = new


def _sanitize() -> None:
    for _, spec, default in SPECS:
        chain = (*spec.read, spec.env)
        for i, var in enumerate(chain):
            raw = env_str(var)
            if raw is None:
                continue
            try:
                spec.parse(raw)
            except AdjustedError as exc:
                new = None if exc.value is None else spec.show(exc.value)
                _replace(var, raw, exc, spec.describe(exc.value), new)
            except ValueError as exc:
                later = [v for v in chain[i + 1 :] if env_str(v) is not None]
                _replace(var, raw, exc, later[0] if later else spec.describe(default), None)
    for variable in _CHECKED:
        raw = env_str(variable.name)
        if raw is None:
            continue
        try:
            variable.parse(raw)
        except AdjustedError as exc:
            _replace(variable.name, raw, exc, str(exc.value or variable.default), exc.value)
        except ValueError as exc:
            fallback = variable.fallback if variable.fallback and env_str(variable.fallback) else None
            _replace(variable.name, raw, exc, fallback or variable.default, None)
    known = known_agentloop_names()
    for name in sorted(os.environ):
        if name.startswith("OTEL_AGENTLOOP_") and name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            warn_once(f"unknown:{name}", "otel_agentloop: %s is not a variable otel_agentloop reads%s", name, hint)


_DECLARED = frozenset({var for _, spec, _ in SPECS for var in (spec.env, *spec.read)} | {v.name for v in _CHECKED})


def variable(name: str) -> str | None:
    """The stripped value of ``name``, a variable declared here or in ``Settings`` (``None`` when unset or
    empty): the library reads the environment only through this module and ``_settings``. ``KeyError`` for an
    undeclared name (a bug of ours, caught by the tests)."""
    if name not in _DECLARED:
        raise KeyError(f"{name} is not a declared variable (config._settings.Settings or SDK_VARIABLES)")
    return env_str(name)


def handed_over() -> dict[str, str]:
    """The :data:`WORKER_VARIABLES` set in this process, as they are."""
    return {name: value for name in WORKER_VARIABLES if (value := variable(name)) is not None}
