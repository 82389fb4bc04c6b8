"""The setup-hook flag as the one switch: run by ``otel_agentloop_startup.pth`` (installed at the root of
site-packages) only in an interpreter whose command line names our Ray setup hook, e.g.::

    python -m verl.trainer.main_ppo ... \\
        +ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=otel_agentloop.integrations.verl.setup_worker

Ray runs that hook only in workers, which see their node's environment, not the driver's. Here, in the driver,
:func:`install` arranges for ``ray.init`` to be wrapped as ``opentelemetry-instrument`` wraps it
(:func:`otel_agentloop.integrations.ray.instrument`): the driver's settings travel in ``runtime_env`` to every
node. Nothing is imported until Ray is: a one-shot meta-path finder sees ``import ray`` and, once Ray's module
has run, instruments it (or at once, when Ray is already imported).

Every other interpreter pays only the ``.pth`` line's scan of ``sys.argv``: this module is not imported.
Opt out with ``OTEL_AGENTLOOP_STARTUP_HOOK`` set to one of ``otel_agentloop_switch.OFF`` (``false``,
``disable``, ``none``, ...; or ``OTEL_SDK_DISABLED=true``, or ``ray`` in ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS``);
``otel_agentloop_switch.ON`` or unset leaves it on. Any other value turns it off too, with one line on stderr
naming the variable and what it does (``config._environment`` declares the variable with the same ``switch``,
from the leaf module ``otel_agentloop_switch``). Never raises: a failure is one line on stderr.
"""

from __future__ import annotations

import os
import sys

from otel_agentloop_switch import OPT_OUT, reason, switch

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing at startup

if TYPE_CHECKING:  # nothing more is imported at startup
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

TRUE = ("true", "1", "yes", "on")
"""``OTEL_SDK_DISABLED`` is true (as ``config._values.TRUE_TEXT`` reads it)."""
HOOKS = (
    "worker_process_setup_hook=otel_agentloop.integrations.verl.setup_worker",
    "worker_process_setup_hook=otel_agentloop.integrations.ray.setup_worker",
)
"""How a command-line item that names our setup hook ends (Hydra's ``key=value``, with or without ``+``/``++``).
The ``.pth`` line repeats them: keep both in step."""


def wanted(argv: Sequence[str]) -> bool:
    """Whether a command line names our setup hook."""
    return any(a.endswith(HOOKS) for a in argv)


def _off() -> bool:
    raw = os.environ.get(OPT_OUT)
    on = switch(raw)
    if on is None and raw is not None:
        print(f"otel_agentloop: {OPT_OUT}={raw!r} {reason()}; using false", file=sys.stderr)
        os.environ[OPT_OUT] = "false"  # as config's check rewrites it: said once, here, for workers too
    if not on:
        return True
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() in TRUE:
        return True
    disabled = os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "")
    return "ray" in {name.strip() for name in disabled.split(",")}


def _say(what: str, exc: BaseException) -> None:
    print(f"otel_agentloop: {what}: {type(exc).__name__}: {exc}", file=sys.stderr)


def _instrument() -> None:
    try:
        from otel_agentloop.integrations.ray import instrument

        instrument()
    except Exception as exc:
        _say("the setup-hook flag could not instrument ray.init in this driver", exc)


class _Loader:
    """Ray's own loader; after Ray's module has run, ``ray.init`` is instrumented."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader  # Ray sees its own loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _instrument()


class _RayFinder:
    """One shot: takes itself off ``sys.meta_path`` at the first ``import ray`` and wraps Ray's loader."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if fullname != "ray":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            return None
        try:
            from importlib.util import find_spec

            spec = find_spec("ray")
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            spec.loader = _Loader(spec.loader)  # type: ignore[assignment]
            return spec
        except Exception as exc:
            _say("the setup-hook flag could not find Ray", exc)
            return None


def install() -> None:
    """Instrument ``ray.init`` in this process when Ray is (or now, when it already is); idempotent."""
    try:
        if _off():
            return
        if "ray" in sys.modules:
            _instrument()
        elif not any(isinstance(f, _RayFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _RayFinder())
    except Exception as exc:
        _say("the setup-hook flag failed", exc)
