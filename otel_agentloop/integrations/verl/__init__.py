"""Drop-in instrumentation of verl 0.9.x: ``instrument()`` / ``uninstrument()``, or :class:`VerlInstrumentor`.

One call covers, per installed verl 0.9.x, the V1 trainer (verl's default: sync, colocate-async and
separate-async, validation), the legacy ``AgentLoopManager`` path and ``experimental/fully_async_policy``'s
agent-loop workers (:mod:`._agent_loop`, :mod:`._v1`). Patches reach verl's agent-loop worker actors
whatever process creates them (:mod:`._patching`: wrappers travel to Ray actors by reference and
instrument the actor's process when it unpickles them). Modules not imported yet are patched when
imported, so ``instrument()`` never imports verl itself.

For a stock run on any cluster, prefix the command with ``opentelemetry-instrument``: it loads
:class:`VerlInstrumentor` and the Ray instrumentor (entry points ``verl`` and ``ray``), and the driver's
``ray.init`` (verl's ``run_ppo``) then carries the driver's settings and this module's :func:`setup_worker`
hook to every node through its ``runtime_env``::

    opentelemetry-instrument python -m verl.trainer.main_ppo ...

Ray's setup-hook flag alone (``+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=
otel_agentloop.integrations.verl.setup_worker``) is the same switch: Ray runs the hook only in workers, but
the installed ``otel_agentloop_startup.pth`` sees the flag in the driver's ``sys.argv`` and wraps its
``ray.init`` the same way (``otel_agentloop_startup``; off with ``OTEL_AGENTLOOP_STARTUP_HOOK=false``, then
each worker on a node without an endpoint warns once, naming its node, and exports nothing).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Mapping
from typing import Any

from ...core._guard import logger
from .._instrumentor import Instrumentor
from . import _patching as patching
from ._agent_loop import (
    AGENT_LOOP,
    CARRIER_KEY,
    LLM_SERVER,
    META_KEY,
    POSITION_KEY,
    SINGLE_TURN_LOOP,
    TABLE_KEY,
    TOOL_LOOP,
    apply_agent_loop,
    apply_llm_server,
    apply_single_turn_loop,
    apply_tool_loop,
    uninstrumented_performance_metrics,
)
from ._engine_path import SGLANG_SERVER, VLLM_SERVER, apply_sglang_server, apply_vllm_server
from ._fully_async import ROLLOUTER, TRAINER, apply_rollouter, apply_trainer
from ._run import CONSTANTS_PPO, apply_constants_ppo
from ._v1 import (
    AGENT_LOOP_TQ,
    REPLAY_BUFFER,
    TRAINER_BASE,
    apply_agent_loop_tq,
    apply_replay_buffer,
    apply_trainer_base,
    step_metrics,
)

__all__ = [
    "CARRIER_KEY",
    "META_KEY",
    "POSITION_KEY",
    "SUPPORTED",
    "TABLE_KEY",
    "VerlInstrumentor",
    "instrument",
    "is_instrumented",
    "setup_worker",
    "step_metrics",
    "uninstrument",
    "uninstrumented_performance_metrics",
]

SUPPORTED = ("0.9.",)
_INSTRUMENTS = ("verl >= 0.9, < 0.10",)
MODULES: tuple[tuple[str, Callable[[Any], None]], ...] = (
    (AGENT_LOOP, apply_agent_loop),
    (TOOL_LOOP, apply_tool_loop),
    (SINGLE_TURN_LOOP, apply_single_turn_loop),
    (LLM_SERVER, apply_llm_server),
    (VLLM_SERVER, apply_vllm_server),
    (SGLANG_SERVER, apply_sglang_server),
    (AGENT_LOOP_TQ, apply_agent_loop_tq),
    (REPLAY_BUFFER, apply_replay_buffer),
    (TRAINER_BASE, apply_trainer_base),
    (ROLLOUTER, apply_rollouter),
    (TRAINER, apply_trainer),
    (CONSTANTS_PPO, apply_constants_ppo),
)
"""verl modules we patch, in order (bases before the classes Ray makes remote from them)."""


_installed: list[Any] = []


def is_instrumented() -> bool:
    return patching.state.active


def instrument(tracer_provider: Any = None) -> bool:
    """Patch the installed verl (idempotent). Returns whether verl is instrumented afterwards.

    ``tracer_provider``: spans go there instead of the provider of ``otel_agentloop.configure()`` or the
    global one. An absent or unsupported verl is reported with a warning and left alone.
    """
    with patching.lock:
        if patching.state.active:
            return True
        try:
            version = importlib.metadata.version("verl")
        except importlib.metadata.PackageNotFoundError:
            logger.warning(
                "otel_agentloop: verl is not installed; nothing to instrument (pip install 'otel-agentloop[verl]')"
            )
            return False
        if not version.startswith(SUPPORTED):
            logger.warning(
                "otel_agentloop: verl %s is not supported (supported: %s); not instrumenting",
                version,
                ", ".join(v + "x" for v in SUPPORTED),
            )
            return False
        if tracer_provider is not None:
            from ...core import _tracer

            _installed.append(_tracer.install(tracer_provider))
        patching.state.active = True
        patching.hooks.reset()
        try:
            for module_name, apply in MODULES:
                patching.hooks.on_import(module_name, apply)
        except Exception:
            _uninstrument()
            raise
        return True


def uninstrument() -> None:
    """Put back every patched attribute (the very same objects); idempotent."""
    with patching.lock:
        _uninstrument()


def _uninstrument() -> None:
    patching.state.active = False
    patching.restore()
    patching.hooks.reset()
    if _installed:  # the provider given to instrument() is uninstalled; the one before it comes back
        from ...core import _tracer

        _tracer.install(_installed.pop())


def setup_worker() -> None:
    """Ray ``worker_process_setup_hook``: configure tracing from the driver's settings handed over in the
    ``runtime_env`` (else this node's ``OTEL_*`` and ``OTEL_AGENTLOOP_*`` variables; see
    :func:`otel_agentloop.integrations.ray.setup_worker`) and instrument verl in this worker process.
    Never raises, and never initialises Ray (called in a driver, it leaves ``ray.init`` to verl)."""
    try:
        from ..ray import setup_worker as configure_worker

        configure_worker()
    except Exception:
        logger.warning("otel_agentloop: tracing setup failed in this Ray worker; verl runs untraced", exc_info=True)
        return
    try:
        instrument()
    except Exception:
        logger.warning("otel_agentloop: instrumenting verl failed in this Ray worker", exc_info=True)


class VerlInstrumentor(Instrumentor):
    """OpenTelemetry instrumentor for verl (``opentelemetry_instrumentor`` entry point ``verl``).

    ``VerlInstrumentor().instrument(tracer_provider=...)`` is :func:`instrument`; ``uninstrument()`` is
    :func:`uninstrument`.
    """

    package, dependencies = "verl", _INSTRUMENTS

    def _start(self, kwargs: Mapping[str, object]) -> None:
        instrument(tracer_provider=kwargs.get("tracer_provider"))

    off = staticmethod(uninstrument)
