"""How patches are installed so that they survive Ray, and put back exactly.

Contract:

- A patch replaces one attribute (a function, or a module-level name) with a plain function (sync or
  ``async def`` like the original, ``__wrapped__`` set for signature checks). No ``wrapt`` proxies: Ray
  copies every method of a class when it is made remote and cloudpickles the copy, and a proxy ships the
  unwrapped original (the "Ray trap").
- Every wrapper is also an attribute of *this* module under a dot-free name (``__qualname__`` and
  ``__module__`` say so), so cloudpickle ships it **by reference**. The process that unpickles it (an
  agent-loop worker actor) resolves the name through :func:`__getattr__`, which runs
  :func:`otel_agentloop.integrations.verl.instrument` there first: the actor gets its own, single wrapper
  whatever process created it. If instrumenting fails there, the name resolves to the original attribute,
  so an actor never fails to start because of us.
- Patches of modules not imported yet are applied by a post-import hook (nothing imports verl early).
- Wrappers call straight through when not instrumented; :func:`restore` puts back the very same objects,
  newest first. Copies Ray made of a wrapper while instrumented (a verl class made remote after its base
  was patched) cannot be put back: they stay, call straight through, and ship by value, inert.
"""

from __future__ import annotations

import functools
import importlib
import sys
import threading
from collections.abc import Callable
from types import ModuleType

from ...config._fork import renew_lock
from ...core._guard import internal_error, logger
from .._patching import AsyncOriginal, Impl, Switch, switched

state = Switch()
lock = threading.RLock()
renew_lock(globals(), "lock")  # a forked child: never a lock held at fork
_originals: list[tuple[object, str, object, str]] = []  # (owner, attribute, original object, registry name)
_sources: dict[str, tuple[str, str, str]] = {}  # registry name -> (module, owner path, attribute)
_retired: dict[str, Callable[..., object]] = {}  # an earlier instrument()'s wrappers, inert: Ray's copies may hold them
_MARK = "__otel_agentloop_patch__"
fallbacks: dict[tuple[str, str, str], Callable[[AsyncOriginal], Callable[..., object]]] = {}
"""(module, owner path, attribute) -> what an uninstrumentable process runs instead of verl's original, for a
wrapper whose signature differs from it (the engine carrier's keyword must still be removed there)."""


def is_ours(obj: object) -> bool:
    """Whether ``obj`` is one of our wrappers, or wraps one (``__wrapped__`` chain, e.g. Ray's copies)."""
    seen = 0
    while obj is not None and seen < 16:
        if getattr(obj, _MARK, False):
            return True
        obj = getattr(obj, "__wrapped__", None)
        seen += 1
    return False


def registry_name(module: str, owner_path: str, attr: str) -> str:
    return "p__" + "__".join(part.replace(".", "_") for part in (module, owner_path, attr))


def resolve_owner(module: ModuleType, owner_path: str) -> object:
    owner: object = module
    for part in owner_path.split(".") if owner_path else ():
        owner = getattr(owner, part)
    return owner


def patch(module: ModuleType, owner_path: str, attr: str, impl: Impl) -> None:
    """Replace ``owner.attr`` (``owner`` found from ``module`` by ``owner_path``; ``""`` is the module itself)
    with a wrapper calling ``impl(original, args, kwargs)`` while instrumented. Skipped when the attribute
    already routes through one of our wrappers (a class made remote after we patched its base)."""
    owner = resolve_owner(module, owner_path)
    original = vars(owner)[attr] if attr in getattr(owner, "__dict__", {}) else getattr(owner, attr)
    if is_ours(original):
        return
    name = registry_name(module.__name__, owner_path, attr)
    wrapper = make_wrapper(original, impl, name)
    _originals.append((owner, attr, original, name))
    _sources[name] = (module.__name__, owner_path, attr)
    setattr(sys.modules[__name__], name, wrapper)
    setattr(owner, attr, wrapper)


def replace(module: ModuleType, owner_path: str, attr: str, new: Callable[..., object]) -> None:
    """Replace ``owner.attr`` with ``new`` as built by the caller (a re-decoration); registered like
    :func:`patch` so that it also travels by reference."""
    owner = resolve_owner(module, owner_path)
    original = vars(owner)[attr]
    if is_ours(original):
        return
    name = registry_name(module.__name__, owner_path, attr)
    new.__module__ = __name__
    new.__qualname__ = name
    setattr(new, _MARK, True)
    _originals.append((owner, attr, original, name))
    _sources[name] = (module.__name__, owner_path, attr)
    setattr(sys.modules[__name__], name, new)
    setattr(owner, attr, new)


def make_wrapper(original: Callable[..., object], impl: Impl, name: str) -> Callable[..., object]:
    """A plain function with ``original``'s kind (async or sync) calling ``impl`` while instrumented."""
    wrapper = switched(state, original, impl)
    functools.update_wrapper(wrapper, original, assigned=("__name__", "__doc__"), updated=())  # sets __wrapped__
    wrapper.__module__ = __name__
    wrapper.__qualname__ = name
    setattr(wrapper, _MARK, True)
    return wrapper


def restore() -> None:
    """Put back every patched attribute (the very same objects), newest first."""
    module = sys.modules[__name__]
    while _originals:
        owner, attr, original, name = _originals.pop()
        try:
            setattr(owner, attr, original)
        except Exception:
            internal_error("verl.restore")
        wrapper = module.__dict__.pop(name, None)
        if wrapper is not None:
            # Copies Ray made while instrumented (a class made remote then) still call it: it now calls
            # straight through, and it no longer resolves by reference, so it ships by value and stays inert.
            wrapper.__qualname__ = "retired." + name
            _retired[name] = wrapper


def patched() -> list[tuple[object, str]]:
    return [(owner, attr) for owner, attr, _, _ in _originals]


def __getattr__(name: str) -> object:
    """Unpickling a wrapper shipped by reference (see the module docstring): instrument this process first."""
    if not name.startswith("p__"):
        raise AttributeError(name)
    if not state.active and name in _retired:  # pickling a copy made while instrumented: no instrument() here
        return _retired[name]
    try:
        from . import instrument

        instrument()
    except Exception:
        internal_error("verl.instrument_on_unpickle")
    found = sys.modules[__name__].__dict__.get(name)
    if found is not None:
        return found
    source = _sources.get(name)
    if source is None:
        source = _parse(name)
    if source is not None:
        module_name, owner_path, attr = source
        logger.warning(
            "otel_agentloop: %s.%s.%s arrived instrumented but could not be instrumented here; "
            "running it uninstrumented",
            module_name,
            owner_path,
            attr,
        )
        found = getattr(resolve_owner(importlib.import_module(module_name), owner_path), attr)
        shim = fallbacks.get((module_name, owner_path, attr))
        return found if shim is None else shim(found)
    raise AttributeError(name)


def _parse(name: str) -> tuple[str, str, str] | None:
    from ._targets import TARGETS

    for module_name, owner_path, attr in TARGETS:
        if registry_name(module_name, owner_path, attr) == name:
            return module_name, owner_path, attr
    return None


class ImportHooks:
    """Post-import hooks per module (``wrapt.register_post_import_hook``); one registration per module for the
    life of the process; each hook applies its patches only while instrumented."""

    def __init__(self) -> None:
        self._registered: set[str] = set()
        self._applied: set[str] = set()

    def on_import(self, module_name: str, apply: Callable[[ModuleType], None]) -> None:
        if module_name in sys.modules and module_name not in self._registered:
            self._run(module_name, apply, sys.modules[module_name])
            return
        if module_name in self._registered:
            if module_name in sys.modules:
                self._run(module_name, apply, sys.modules[module_name])
            return
        import wrapt

        self._registered.add(module_name)
        wrapt.register_post_import_hook(lambda module: self._run(module_name, apply, module), module_name)

    def _run(self, module_name: str, apply: Callable[[ModuleType], None], module: ModuleType) -> None:
        with lock:
            if not state.active or module_name in self._applied:
                return
            self._applied.add(module_name)
            try:
                apply(module)
            except Exception:
                internal_error(f"verl.patch:{module_name}")

    def reset(self) -> None:
        self._applied.clear()


hooks = ImportHooks()
