"""The engine's load, read from vLLM's stat logger interface: per request (:class:`Series`) and over time
(:class:`LoadWindow`, exported as ``rl.engine.load`` spans). One :class:`EngineLoad` per ``AsyncLLM``.

Contract:

- **Per iteration** (:meth:`EngineLoad.record`, called by our stat logger once per engine-core output batch,
  vLLM's unit of ``record``): ``SchedulerStats.num_running_reqs``/``num_waiting_reqs``/``kv_cache_usage`` and
  ``IterationStats.num_preempted_reqs``/``iteration_timestamp``, read by attribute (a missing or non-numeric
  field reads as absent: 0 for counts, no point for the time). O(1) amortized, no allocation per iteration
  beyond a point per 100 ms.
- **Per request** (:class:`Series`): a request takes a :meth:`~Series.mark` when it enters the engine and asks
  :meth:`~Series.summary` at its end: ``rl.engine.batch.running.{max,mean}``, ``rl.engine.batch.waiting.max``,
  ``rl.engine.kv_cache.usage.max`` and ``rl.engine.iterations`` over the iterations in between. The maxima
  come from monotonic stacks (the suffix maxima, at most :data:`MAX_STACK` entries each: running and waiting
  counts and KV usage have few distinct values; past that the oldest entries are dropped and a request older
  than them reads the maximum of the entries kept), the mean from a running sum. Nothing is kept per request.
- **Over time** (:class:`LoadWindow`, one per engine index): at most one point per 100 ms bucket (the max of
  running/waiting/KV, the sum of preemptions); a window closes every :data:`WINDOW_S` of wall time with
  points, when a newer step is seen (``rl.step``: the newest step of a request that entered the engine), at a
  ``collect()`` or ``force_flush()`` of the handle, at ``AsyncLLM.shutdown()``, at process exit, or at
  :data:`MAX_POINTS`. A closed window is one ``rl.engine.load`` span (a root span of a trace of
  its own, always sampled, straight into the handle's export processors); with tracing off it is dropped.

Never raises into vLLM (an error is logged once).
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import time
import weakref
from bisect import bisect_left

from opentelemetry.context import Context
from opentelemetry.trace import Tracer
from opentelemetry.util.types import AttributeValue

from ... import semconv as sc
from ...config._fork import after_fork_in_child
from ...core._guard import internal_error
from ...export._side import side_tracer
from ...metrics._hooks import StepHooks
from ...setup import current_handle

MAX_STACK = 4096
"""Entries each per-request maximum keeps at most (see the module)."""
BUCKET_S = 0.1
"""One point per this many seconds at most."""
WINDOW_S = 10.0
"""A load span covers at most this much wall time."""
MAX_POINTS = 600
"""A load span holds at most this many points."""


def _number(obj: object, name: str) -> float:
    value = getattr(obj, name, 0)
    return value if (type(value) is int or type(value) is float) and value >= 0 else 0


class _MaxStack:
    """The suffix maxima of a stream of values: :meth:`since` is the max over the iterations from ``start``."""

    __slots__ = ("its", "values")

    def __init__(self) -> None:
        self.its: list[int] = []
        self.values: list[float] = []

    def push(self, it: int, value: float) -> None:
        its, values = self.its, self.values
        while values and values[-1] <= value:
            values.pop()
            its.pop()
        its.append(it)
        values.append(value)
        if len(its) > MAX_STACK:
            del its[0], values[0]

    def since(self, start: int) -> float | None:
        i = bisect_left(self.its, start)
        return self.values[i] if i < len(self.values) else None


class Series:
    """Per-request load figures over an engine's iterations (see the module): O(1) per iteration."""

    __slots__ = ("iterations", "kv", "running", "running_sum", "waiting")

    def __init__(self) -> None:
        self.iterations = 0
        self.running_sum = 0.0
        self.running, self.waiting, self.kv = _MaxStack(), _MaxStack(), _MaxStack()

    def push(self, running: float, waiting: float, kv: float) -> None:
        self.iterations = it = self.iterations + 1
        self.running_sum += running
        self.running.push(it, running)
        self.waiting.push(it, waiting)
        self.kv.push(it, kv)

    def mark(self) -> tuple[int, float]:
        """Where a request entering the engine now starts."""
        return self.iterations, self.running_sum

    def summary(self, mark: tuple[int, float]) -> dict[str, AttributeValue]:
        """The load attributes over the iterations since ``mark``; ``{}`` when there were none."""
        start, running_sum = mark
        iterations = self.iterations - start
        if iterations <= 0:
            return {}
        attrs: dict[str, AttributeValue] = {
            sc.RL_ENGINE_ITERATIONS: iterations,
            sc.RL_ENGINE_BATCH_RUNNING_MEAN: (self.running_sum - running_sum) / iterations,
        }
        for key, stack, kind in (
            (sc.RL_ENGINE_BATCH_RUNNING_MAX, self.running, int),
            (sc.RL_ENGINE_BATCH_WAITING_MAX, self.waiting, int),
            (sc.RL_ENGINE_KV_CACHE_USAGE_MAX, self.kv, float),
        ):
            value = stack.since(start + 1)
            if value is not None:
                attrs[key] = kind(value)
        return attrs


class LoadWindow:
    """One engine index's load points of the current window (see the module). Thread-safe: vLLM records on
    its event loop, the handle's flush/shutdown close windows from other threads."""

    def __init__(self, engine_index: int, step: int | None = None) -> None:
        self.engine_index = engine_index
        self.step = step
        self.dropped = 0
        self._clear()
        self._new_lock()
        after_fork_in_child(self, "_new_lock")

    def _new_lock(self) -> None:
        self._lock = threading.Lock()

    def _clear(self) -> None:
        self.bucket = -1
        self.start = 0.0
        self.times: list[float] = []
        self.running: list[int] = []
        self.waiting: list[int] = []
        self.kv: list[float] = []
        self.preemptions: list[int] = []

    def add(self, now: float, running: int, waiting: int, kv: float, preempted: int) -> None:
        bucket = int(now / BUCKET_S)
        with self._lock:
            if bucket == self.bucket:
                i = -1
                self.running[i] = max(self.running[i], running)
                self.waiting[i] = max(self.waiting[i], waiting)
                self.kv[i] = max(self.kv[i], kv)
                self.preemptions[i] += preempted
                return
            if self.times and (now - self.start >= WINDOW_S or len(self.times) >= MAX_POINTS):
                self._emit()
            if not self.times:
                self.start = now
                _tracer()  # the current handle closes this window at its flush and shutdown
            self.bucket = bucket
            self.times.append(now)
            self.running.append(running)
            self.waiting.append(waiting)
            self.kv.append(kv)
            self.preemptions.append(preempted)

    def close(self, step: int | None = None, tracer: Tracer | None = None) -> None:
        """Close the window now (a span when it has points, through ``tracer``, by default the current
        handle's); ``step``: the newer step the next window is of."""
        with self._lock:
            if self.times:
                self._emit(tracer)
            if step is not None:
                self.step = step

    def see_step(self, step: int) -> None:
        """A request of ``step`` entered the engine: a newer step closes the window."""
        current = self.step
        if current is None or step > current:
            if current is not None:
                self.close(step)
            else:
                self.step = step

    def _emit(self, tracer: Tracer | None = None) -> None:
        """The window as an ``rl.engine.load`` span (lock held), then a new, empty window."""
        times, start = self.times, self.start
        attrs: dict[str, AttributeValue] = {
            sc.RL_ENGINE_NAME: "vllm",
            sc.RL_ENGINE_ID: f"{socket.gethostname()}:{os.getpid()}:{self.engine_index}",
            sc.RL_ENGINE_LOAD_OFFSET_MS: [round((t - start) * 1000.0) for t in times],
            sc.RL_ENGINE_LOAD_RUNNING: self.running,
            sc.RL_ENGINE_LOAD_WAITING: self.waiting,
            sc.RL_ENGINE_LOAD_KV_CACHE_USAGE: self.kv,
            sc.RL_ENGINE_LOAD_PREEMPTIONS: self.preemptions,
        }
        if self.step is not None:
            attrs[sc.RL_STEP] = self.step
        self._clear()
        tracer = tracer or _tracer()
        if tracer is None:
            self.dropped += 1
            return
        try:
            span = tracer.start_span(
                sc.ENGINE_LOAD_SPAN, context=Context(), attributes=attrs, start_time=int(start * 1e9)
            )
            span.end(end_time=int(times[-1] * 1e9))
        except Exception:
            internal_error("vllm.load.emit")


class EngineLoad:
    """The load of one ``AsyncLLM``'s engines: its :class:`Series` (every engine index of it: their
    iterations) and a :class:`LoadWindow` per engine index. Fed by our stat logger."""

    def __init__(self) -> None:
        self.series = Series()
        self.windows: dict[int, LoadWindow] = {}
        self.step: int | None = None
        _engines.add(self)

    def record(self, scheduler_stats: object, iteration_stats: object, engine_idx: int = 0) -> None:
        """One engine-core output batch's stats (either may be ``None``). Never raises."""
        try:
            if scheduler_stats is None:
                return
            running = int(_number(scheduler_stats, "num_running_reqs"))
            waiting = int(_number(scheduler_stats, "num_waiting_reqs"))
            kv = float(min(_number(scheduler_stats, "kv_cache_usage"), 1.0))
            self.series.push(running, waiting, kv)
            preempted = int(_number(iteration_stats, "num_preempted_reqs")) if iteration_stats is not None else 0
            now = _number(iteration_stats, "iteration_timestamp") if iteration_stats is not None else 0
            window = self.windows.get(engine_idx)
            if window is None:
                window = self.windows.setdefault(engine_idx, LoadWindow(engine_idx, self.step))
            window.add(now or _now(), running, waiting, kv, preempted)
        except Exception:
            internal_error("vllm.load.record")

    def see_step(self, step: int) -> None:
        """A request of ``step`` enters the engine (the windows of a newer step close the older ones')."""
        if self.step is not None and step <= self.step:
            return
        self.step = step
        for window in list(self.windows.values()):
            window.see_step(step)

    def close(self, tracer: Tracer | None = None) -> None:
        for window in list(self.windows.values()):
            window.close(tracer=tracer)


def _now() -> float:
    return time.time()


_engines: weakref.WeakSet[EngineLoad] = weakref.WeakSet()
_tracers: weakref.WeakKeyDictionary[object, Tracer] = weakref.WeakKeyDictionary()
_at_exit: list[bool] = []


class _CloseWindows(StepHooks):
    """A handle's ``collect()`` (``step_reading``) and ``force_flush()`` close every engine's window into that
    handle's export. (Its ``shutdown()`` stops the export processors before any hook of ours runs: a window
    still open then is dropped, counted; ``AsyncLLM.shutdown()`` and process exit close them first.)"""

    __slots__ = ("tracer",)

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def step_reading(self, step: int | None, validate: bool) -> None:
        close_all(self.tracer)

    def provider_flush(self, timeout_s: float) -> bool:
        close_all(self.tracer)
        return True


def close_all(tracer: Tracer | None = None) -> None:
    """Close every live engine's load windows (the handle's flush and shutdown)."""
    for engine in list(_engines):
        engine.close(tracer)


def _tracer() -> Tracer | None:
    """The side tracer of the current handle (made, and the handle hooked, on first use); ``None`` when off."""
    handle = current_handle()
    if handle is None or handle.provider is None:
        return None
    tracer = _tracers.get(handle)
    if tracer is None:
        tracer = side_tracer(
            "otel_agentloop.engine_load",
            handle.provider.resource,
            handle.export_processors,
            max_attributes=16,
            max_links=0,
            max_attribute_length=None,
        )
        _tracers[handle] = tracer
        handle.metrics.add_hooks(_CloseWindows(tracer))
        if not _at_exit:
            _at_exit.append(True)
            atexit.register(close_all)  # runs before the handle's own exit hook (registered earlier)
    return tracer
