"""Fork safety, in one place: the package's only ``os.register_at_fork`` call, and what every module registers.

A forked child has one thread, the one that called ``fork``; every lock another thread held at that moment
stays held in the child for good, and none of our threads runs there. So each lock and thread this library owns
is renewed in the child through this module, in one of four ways:

- :func:`renew_lock` (a module's own lock, for the process's life): ``renew_lock(globals(), "_lock")``, at
  import, right below the lock (read through the module where used, never imported by value);
- :func:`renew_in_child` (module state, for the process's life): any other renewal, at import;
- :func:`after_fork_in_child` (an object's state, while the object lives): a processor's, exporter's or
  monitor's locks, buffers and worker thread, when it is made;
- :func:`hold_across_fork` (a lock that must not be taken from under its holder): acquired in the parent just
  before the fork, so the fork waits for a holder to finish, and released after it in parent and child.

The contract, in order:

1. Before the fork, in the parent: the held locks are acquired, in the order they were registered.
2. In the child, before anything else of ours runs there: this module's own lock is new, the held locks are
   released (last acquired first), then every hook runs once, in the order it was registered, whichever
   function registered it. A module registers at import and imports point down the layers, so a lower layer's
   state is renewed before a higher layer's hook runs (the warn-once lock before any hook that may log), and an
   object's hook runs after those of the modules and objects it was built from (a handle's after its
   processors'). A hook that raises is logged, with its traceback, and the next hook still runs.
3. After the fork, in the parent: the held locks are released (last acquired first).

Hooks run on the child's one thread and must not wait for another thread: they make new locks, empty buffers
and start new threads. A thread a hook starts runs while the later hooks still run: its first work must not
need them (the library's threads first wait for work or for their interval). Standard library only: the
lowest layer that needs it is ``config`` (``config._values`` registers first, at import).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable, MutableMapping
from typing import Protocol

__all__ = ["after_fork_in_child", "hold_across_fork", "renew_in_child", "renew_lock"]


class Lockable(Protocol):
    """A lock :func:`hold_across_fork` can hold (``threading.Lock`` or ``RLock``)."""

    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...

    def release(self) -> None: ...


_Hook = Callable[[], object]
_hooks: list[_Hook | weakref.WeakMethod[_Hook]] = []  # in registration order; weak: an object's method
_held: list[Lockable] = []
_holding: list[Lockable] = []  # what the parent acquired for the fork in progress
_lock = threading.Lock()
_MAX_DEAD = 256  # hooks kept before the ones of objects that are gone are forgotten
_prune_at = _MAX_DEAD  # twice the hooks left by the last prune (at least _MAX_DEAD): pruning stays amortised O(1)
_RLOCK = type(threading.RLock())


def renew_in_child(hook: _Hook) -> None:
    """Call ``hook()`` in every forked child of this process, for the process's life (a module's state)."""
    with _lock:
        _hooks.append(hook)


def renew_lock(namespace: MutableMapping[str, object], name: str) -> None:
    """In every forked child, ``namespace[name]`` (a module's ``threading.Lock`` or ``RLock``) is a new lock of
    the same kind (a module's own lock: ``renew_lock(globals(), "_lock")``)."""
    reentrant = isinstance(namespace[name], _RLOCK)

    def renew() -> None:
        namespace[name] = threading.RLock() if reentrant else threading.Lock()

    renew_in_child(renew)


def after_fork_in_child(owner: object, method: str) -> None:
    """Call ``owner.<method>()`` in every forked child while ``owner`` lives (held weakly: registering never
    keeps an object alive). The hooks of objects that are gone are forgotten once the hooks have doubled since
    the last prune: at most ``max(256, 2 * live)`` are kept."""
    global _prune_at
    ref: weakref.WeakMethod[_Hook] = weakref.WeakMethod(getattr(owner, method))
    with _lock:
        if len(_hooks) >= _prune_at:
            _hooks[:] = [hook for hook in _hooks if not isinstance(hook, weakref.WeakMethod) or hook() is not None]
            _prune_at = max(_MAX_DEAD, 2 * len(_hooks))
        _hooks.append(ref)


def hold_across_fork(lock: Lockable) -> None:
    """Acquire ``lock`` in the parent just before every fork and release it after, in parent and child (for the
    process's life). For a lock held briefly whose holder must finish first (an import in progress): the fork
    waits for it. An ``RLock`` lets the holder itself fork."""
    with _lock:
        _held.append(lock)


def _before() -> None:
    held = list(_held)  # one C-level copy, without our lock: the fork never waits for a thread registering
    for lock in held:
        lock.acquire()
    _holding[:] = held


def _after_in_parent() -> None:
    _release_held()


def _after_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _release_held()
    alive: list[_Hook | weakref.WeakMethod[_Hook]] = []
    for entry in _hooks:
        hook = entry() if isinstance(entry, weakref.WeakMethod) else entry
        if hook is None:
            continue
        alive.append(entry)
        try:
            hook()
        except Exception:  # the user's fork goes on; the other hooks still run
            logging.getLogger("otel_agentloop").warning(
                "otel_agentloop: internal error in after_fork (suppressed; training continues)", exc_info=True
            )
    _hooks[:] = alive


def _release_held() -> None:
    for lock in reversed(_holding):
        lock.release()
    _holding.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before, after_in_parent=_after_in_parent, after_in_child=_after_in_child)
