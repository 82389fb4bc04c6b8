"""How verifiers is patched: lazily, exactly, and put back.

A patch replaces one class attribute (or module function) with a plain function of the same kind (``async def``
for a coroutine function; :func:`..._patching.switched`) that calls ``impl(original, args, kwargs)`` while
instrumented and straight through otherwise. Modules not imported yet are patched by a ``wrapt`` post-import
hook: ``instrument()`` never imports verifiers. :func:`restore` puts back the very same objects, newest first.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from types import ModuleType

from ...config._fork import renew_lock
from ...core._guard import internal_error
from .._patching import Impl, Patches, Switch, on_import, switched

Target = tuple[str, str, str, Impl]  # (module, class name or "", attribute, impl)

state = Switch()
lock = threading.RLock()
renew_lock(globals(), "lock")  # a forked child: never a lock held at fork
_patches = Patches()
_applied: set[str] = set()
_hooked: set[str] = set()


def wrap(original: Callable[..., object], impl: Impl) -> Callable[..., object]:
    """A wrapper of ``original``'s kind (sync or ``async def``) calling ``impl`` while instrumented."""
    return functools.update_wrapper(switched(state, original, impl), original)


def _apply(module: ModuleType, targets: list[Target]) -> None:
    with lock:
        name = module.__name__
        if not state.active or name in _applied:
            return
        _applied.add(name)
        for _, owner_name, attr, impl in targets:
            try:
                owner = getattr(module, owner_name) if owner_name else module
                _patches.set(owner, attr, wrap(vars(owner)[attr], impl))
            except Exception:
                internal_error(f"verifiers.patch {name}.{owner_name}.{attr}")


def install(targets: list[Target]) -> None:
    """Patch each target's module now when imported, else when it is (post-import hook, registered once)."""
    by_module: dict[str, list[Target]] = {}
    for target in targets:
        by_module.setdefault(target[0], []).append(target)
    for name, group in by_module.items():
        on_import(name, functools.partial(_apply, targets=group), _hooked)


def restore() -> None:
    """Put back every original (newest first); a later ``instrument()`` patches again."""
    with lock:
        _patches.restore()
        _applied.clear()
