"""Patching shared by the framework integrations (verl, verifiers, vLLM, TRL).

- :class:`Switch`: whether an integration's wrappers act (``instrument()`` sets it, ``uninstrument()`` clears
  it); a wrapper handed out before ``uninstrument()`` calls straight through.
- :func:`switched`: a plain function of ``original``'s kind (``async def`` for a coroutine function) calling
  ``impl(original, args, kwargs)`` while the switch is on and ``original`` straight through otherwise. No
  metadata is copied: each integration names its wrappers as its contract says (verl's travel through Ray).
- :class:`Patches`: replaced attributes, put back exactly (the very same objects, newest first; an attribute
  that was inherited is deleted again).
- :func:`on_import`: apply patches to a module now when imported, else when it is (one post-import hook per
  module for the life of the process): ``instrument()`` never imports a framework.
- :class:`Integration`: one integration's switch, lock, patches and hooks; the heart of its ``instrument()``
  (:meth:`~Integration.start`) and ``uninstrument()`` (:meth:`~Integration.stop`).
- :func:`put_back`: an instance attribute we installed, put back when it is still ours.
- :func:`awaited_in`: an original awaited in an open span, which an exception ends (the exception unchanged).
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Awaitable, Callable, Iterable
from types import ModuleType
from typing import Any

from ..config._fork import after_fork_in_child
from ..core._guard import internal_error
from ..core._lifecycle import finish
from ..core._scope import OpenSpan

Impl = Callable[[Callable[..., Any], tuple[object, ...], dict[str, object]], Any]
"""``impl(original, args, kwargs)``. Any: ``original`` is the framework's own callable, and an async original's
impl returns its awaitable (what both return is the framework's)."""

Apply = Callable[[ModuleType], None]
Original = Callable[..., object]
"""A framework's callable an impl calls through (what it returns is only passed on)."""
AsyncOriginal = Callable[..., Awaitable[object]]
Args = tuple[object, ...]
"""The call's positional arguments, as the framework passed them (each read where it is used)."""
Kwargs = dict[str, object]


class Switch:
    """Whether the wrappers act (``instrument()`` sets it, ``uninstrument()`` clears it)."""

    __slots__ = ("active",)

    def __init__(self) -> None:
        self.active = False


def switched(switch: Switch, original: Callable[..., object], impl: Impl) -> Callable[..., object]:
    """A wrapper of ``original``'s kind (sync or ``async def``) calling ``impl`` while ``switch`` is on."""
    if inspect.iscoroutinefunction(original):
        call: Callable[..., Awaitable[object]] = original

        async def async_wrapper(*args: object, **kwargs: object) -> object:
            if not switch.active:
                return await call(*args, **kwargs)
            return await impl(original, args, kwargs)

        return async_wrapper

    def sync_wrapper(*args: object, **kwargs: object) -> object:
        if not switch.active:
            return original(*args, **kwargs)
        return impl(original, args, kwargs)

    return sync_wrapper


_MISSING = object()


class Patches:
    """Attributes replaced by an integration, put back exactly by :meth:`restore`."""

    __slots__ = ("_done",)

    def __init__(self) -> None:
        self._done: list[tuple[object, str, object]] = []  # (owner, attribute, what its __dict__ held)

    def __bool__(self) -> bool:
        return bool(self._done)

    def set(self, owner: object, attr: str, new: object) -> None:
        """``owner.attr = new``, remembering what ``owner``'s own ``__dict__`` held (or that it held nothing)."""
        self._done.append((owner, attr, vars(owner).get(attr, _MISSING)))
        setattr(owner, attr, new)

    def holds(self, owner: object, attr: str) -> bool:
        return any(o is owner and a == attr for o, a, _ in self._done)

    def restore(self) -> None:
        """Put back every replaced attribute, newest first."""
        while self._done:
            owner, attr, original = self._done.pop()
            if original is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, original)


def on_import(module_name: str, apply: Apply, hooked: set[str]) -> None:
    """``apply(module)`` now when ``module_name`` is imported, else when it is: a post-import hook, registered
    once per name in ``hooked`` (the caller's: hooks live as long as the process)."""
    module = sys.modules.get(module_name)
    if module is not None:
        apply(module)
    elif module_name not in hooked:
        import wrapt

        hooked.add(module_name)
        wrapt.register_post_import_hook(apply, module_name)


class Integration:
    """One framework integration: its switch, its lock (new in a forked child), the attributes it patched and
    the modules it hooked. :meth:`start` and :meth:`stop` are the heart of its ``instrument()`` and
    ``uninstrument()``; its own patch functions run under :attr:`lock` and record into :attr:`patches`."""

    __slots__ = ("__weakref__", "hooked", "lock", "patches", "switch")

    def __init__(self, switch: Switch) -> None:
        self.switch = switch
        self.lock = threading.RLock()
        self.patches = Patches()
        self.hooked: set[str] = set()
        after_fork_in_child(self, "_renew")

    def _renew(self) -> None:
        self.lock = threading.RLock()  # a forked child: never a lock held at fork

    def start(self, modules: Iterable[tuple[str, Apply]]) -> None:
        """Switch on and apply each module's patches now when imported, else when it is (idempotent: nothing
        when already on)."""
        with self.lock:
            if self.switch.active:
                return
            self.switch.active = True
            for name, apply in modules:
                on_import(name, apply, self.hooked)

    def stop(self) -> None:
        """Switch off and put back what was patched (idempotent); wrappers handed out call straight through."""
        with self.lock:
            self.switch.active = False
            self.patches.restore()


def put_back(owner: object, attr: str, installed: object, previous: object | None, where: str) -> None:
    """Put ``owner``'s instance attribute ``attr`` back to ``previous`` (``None``: delete it) when it still holds
    ``installed``. Never raises."""
    try:
        if vars(owner).get(attr) is installed:
            if previous is None:
                delattr(owner, attr)
            else:
                setattr(owner, attr, previous)
    except Exception:
        internal_error(where)


async def awaited_in(scope: OpenSpan | None, original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    """Await ``original(*args, **kwargs)``; if it raises, end ``scope`` with the error and re-raise it unchanged."""
    try:
        return await original(*args, **kwargs)
    except BaseException as exc:
        if scope is not None:
            finish(scope, exc)
        raise
