"""Everything otel_agentloop holds per process, in one object: :data:`state`.

The tracer the decorators resolve, the content policy, the defaults new samples take, the handle of the last
``configure()`` and a Ray worker's own handle live here and nowhere else. ``configure()`` swaps them with
:meth:`ProcessState.save` / :meth:`ProcessState.restore`; :meth:`ProcessState.reset` returns the process to
how it was at import (tests use it through :mod:`otel_agentloop.testing`).
"""

from __future__ import annotations

import os
import socket
import threading
import weakref
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol

from opentelemetry.trace import Tracer, TracerProvider

from ..config._fork import after_fork_in_child
from ._content import ContentPolicy, Redactor
from ._guard import forget_warnings, internal_error

if TYPE_CHECKING:  # typed here, imported where they are made (neither imports this module)
    from ._inflight import InflightRegistry
    from ._recorder import Recorder

TracePer = Literal["sample", "step"]


class TracerState:
    """The provider ``configure()`` installed and the tracer resolved for it (read on every decorated call)."""

    __slots__ = (
        "__weakref__",
        "configured",
        "disabled",
        "key",
        "lock",
        "recorder",
        "recorders",
        "registries",
        "registry",
        "retired",
        "tracer",
    )

    def __init__(self) -> None:
        self.configured: TracerProvider | None = None
        self.disabled = False
        self.key: object = None  # the provider `tracer` was resolved for
        self.tracer: Tracer | None = None
        self.registry: InflightRegistry | None = (
            None  # the in-flight registry of the provider `tracer` was resolved for
        )
        self.registries: weakref.WeakKeyDictionary[TracerProvider, InflightRegistry] = weakref.WeakKeyDictionary()
        self.recorder: Recorder | None = None  # the fast-path recorder of the provider `tracer` was resolved for
        self.recorders: weakref.WeakKeyDictionary[TracerProvider, Recorder] = weakref.WeakKeyDictionary()
        self.lock = threading.Lock()
        self.retired: weakref.WeakSet[TracerProvider] = weakref.WeakSet()

    def after_fork(self) -> None:
        self.lock = threading.Lock()

    def install(self, provider: TracerProvider | None) -> TracerProvider | None:
        """Make ``provider`` the configured one (``None``: the global one) and forget the resolved tracer; return
        the previous."""
        with self.lock:
            previous, self.configured, self.key = self.configured, provider, None
        return previous


def forked_worker(worker: str, parent_pid: int, pid: int) -> str:
    """A forked child's ``rl.worker`` from its parent's ``worker``: the parent's pid in it (the derived
    ``host:pid``, Ray's ``node:pid:actor``) replaced by the child's ``pid``, else ``:pid`` appended (a name the
    user chose): a child's spans never pass for its parent's."""
    parts = worker.split(":")
    old = str(parent_pid)
    if old in parts:
        return ":".join(str(pid) if part == old else part for part in parts)
    return f"{worker}:{pid}"


class Defaults:
    """What a step or sample takes when its caller says nothing: set by ``configure()``."""

    __slots__ = ("trace_per", "worker")

    def __init__(self) -> None:
        self.trace_per: TracePer = "sample"
        self.worker = f"{socket.gethostname()}:{os.getpid()}"


class Saved(NamedTuple):
    """The process-wide settings ``configure()`` replaces, as they were before it."""

    configured: TracerProvider | None
    disabled: bool
    content: tuple[bool, int, Redactor | None]
    trace_per: TracePer
    worker: str


class OpenHandle(Protocol):
    """What core knows of a ``configure()`` handle (``setup.Handle``, a layer above): it shuts down. Its readers
    up there take it as a ``Handle`` through one typed accessor each (``setup.current_handle``,
    ``integrations.ray._common.worker_handle``)."""

    def shutdown(self, timeout_s: float = ...) -> None: ...


class ProcessState:
    """The per-process state (one instance, :data:`state`). Its parts are never replaced, only changed in
    place, so modules may keep a reference to a part (the hot path reads ``state.tracer`` through one)."""

    __slots__ = ("__weakref__", "content", "defaults", "handle", "lock", "pid", "tracer", "worker_handle")

    def __init__(self) -> None:
        self.pid = os.getpid()  # the process the defaults were made for (see after_fork)
        self.tracer = TracerState()
        self.content = ContentPolicy()
        self.defaults = Defaults()
        self.handle: OpenHandle | None = None  # the Handle of the last configure() still in force
        self.worker_handle: OpenHandle | None = None  # a Ray worker's own handle (integrations.ray)
        self.lock = threading.RLock()  # one configure()/shutdown() state change at a time
        after_fork_in_child(self.tracer, "after_fork")
        after_fork_in_child(self, "after_fork")

    def after_fork(self) -> None:
        """In a forked child: fresh lock; the default ``rl.worker`` names this process (:func:`forked_worker`)."""
        self.lock = threading.RLock()
        parent, self.pid = self.pid, os.getpid()
        self.defaults.worker = forked_worker(self.defaults.worker, parent, self.pid)

    def save(self) -> Saved:
        content = self.content
        return Saved(
            self.tracer.configured,
            self.tracer.disabled,
            (content.enabled, content.max_chars, content.redact),
            self.defaults.trace_per,
            self.defaults.worker,
        )

    def restore(self, saved: Saved) -> None:
        self.tracer.install(saved.configured)
        self.tracer.disabled = saved.disabled
        self.content.enabled, self.content.max_chars, self.content.redact = saved.content
        self.defaults.trace_per = saved.trace_per
        self.defaults.worker = saved.worker

    def reset(self, timeout_s: float = 5.0) -> None:
        """Back to import time: the current handle and a worker's handle shut down (within ``timeout_s``
        each), no provider installed, tracing enabled, content capture off with default limits, defaults
        restored, once-only warnings forgotten. Providers shut down earlier stay retired."""
        for handle in (self.worker_handle, self.handle):
            if handle is not None:
                try:
                    handle.shutdown(timeout_s)
                except Exception:
                    internal_error("state.reset")
        self.handle = self.worker_handle = None
        self.restore(Saved(None, False, (False, ContentPolicy.DEFAULT_MAX_CHARS, None), "sample", Defaults().worker))
        self.content.truncated = 0
        forget_warnings()


state = ProcessState()
