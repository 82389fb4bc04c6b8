"""How verifiers is patched: lazily, exactly, and put back.

A patch replaces one class attribute (or module function) with a plain function of the same kind (``async def``
for a coroutine function) that calls ``impl(original, args, kwargs)`` while instrumented and straight through
otherwise. Modules not imported yet are patched by a ``wrapt`` post-import hook: ``instrument()`` never imports
verifiers. :func:`restore` puts back the very same objects, newest first.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from collections.abc import Callable
from typing import Any

from ...config._fork import renew_lock
from ...core._guard import internal_error

Impl = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]
Target = tuple[str, str, str, Impl]  # (module, class name or "", attribute, impl)


class _State:
    """Whether the wrappers act (``instrument()`` ran and ``uninstrument()`` did not)."""

    __slots__ = ("active",)

    def __init__(self) -> None:
        self.active = False


state = _State()
lock = threading.RLock()
renew_lock(globals(), "lock")  # a forked child: never a lock held at fork
_originals: list[tuple[Any, str, Any]] = []
_applied: set[str] = set()
_hooked: set[str] = set()


def wrap(original: Callable[..., Any], impl: Impl) -> Callable[..., Any]:
    """A wrapper of ``original``'s kind (sync or ``async def``) calling ``impl`` while instrumented."""
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            if not state.active:
                return await original(*args, **kwargs)
            return await impl(original, args, kwargs)

        return async_wrapper

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not state.active:
            return original(*args, **kwargs)
        return impl(original, args, kwargs)

    return wrapper


def _apply(module: Any, targets: list[Target]) -> None:
    with lock:
        name = module.__name__
        if not state.active or name in _applied:
            return
        _applied.add(name)
        for _, owner_name, attr, impl in targets:
            try:
                owner = getattr(module, owner_name) if owner_name else module
                original = owner.__dict__[attr]
                setattr(owner, attr, wrap(original, impl))
                _originals.append((owner, attr, original))
            except Exception:
                internal_error(f"verifiers.patch {name}.{owner_name}.{attr}")


def install(targets: list[Target]) -> None:
    """Patch each target's module now when imported, else when it is (post-import hook, registered once)."""
    import wrapt

    by_module: dict[str, list[Target]] = {}
    for target in targets:
        by_module.setdefault(target[0], []).append(target)
    for name, group in by_module.items():
        module = sys.modules.get(name)
        if module is not None:
            _apply(module, group)
        elif name not in _hooked:
            _hooked.add(name)
            wrapt.register_post_import_hook(functools.partial(_apply, targets=group), name)


def restore() -> None:
    """Put back every original (newest first); a later ``instrument()`` patches again."""
    with lock:
        while _originals:
            owner, attr, original = _originals.pop()
            setattr(owner, attr, original)
        _applied.clear()
