"""The :class:`Handle` that ``configure()`` returns, the current handle, and what a handle's shutdown undoes."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, cast

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from .. import semconv as sc
from ..config._fork import after_fork_in_child
from ..config._otlp import OtlpSettings
from ..config._settings import Settings
from ..core import _tracer
from ..core._guard import internal_error
from ..core._state import Saved, forked_worker, state
from ..export._keep import SampleKeeper
from ..export._pipeline import PipelineProvider, RecordPipeline
from ..export._processor import ExportProcessor, failed_wait
from ..export._processor import timeout_s as _timeout_s
from ..export._step_summary import StepSummaryWriter
from ..health._watchdog import LiveMonitor
from ..metrics._hooks import StepHooks
from ..metrics._processor import PhaseMetricsProcessor
from ..metrics._summary import StepSummary
from ..metrics._table import PhaseTable, StepMetrics

if TYPE_CHECKING:
    import numpy.typing as npt

    from ..core._inflight import InflightSample

__all__ = ["Handle", "_ExportCounters", "current_handle", "write_step_summary"]


class Handle:
    """What :func:`configure` returns: the provider, the metrics processor, and bounded flush/shutdown.

    ``enabled`` is ``False`` when tracing is off (``OTEL_SDK_DISABLED`` or ``enabled=False``): ``metrics``
    then exists but sees no spans, and ``force_flush``/``shutdown`` return at once.
    """

    def __init__(
        self,
        provider: TracerProvider | None,
        metrics: PhaseMetricsProcessor,
        exporters: Sequence[ExportProcessor],
        previous: trace.TracerProvider | None,
        description: str,
        keeper: SampleKeeper | None = None,
        settings: Settings | None = None,
        *,
        otlp: OtlpSettings,
        worker_env: dict[str, str],
        live: LiveMonitor | None = None,
        summaries: StepSummaryWriter | None = None,
        saved: Saved | None = None,
    ) -> None:
        self.provider = provider
        self.metrics = metrics
        self.export_processors = tuple(exporters)
        self.description = description
        self.keeper = keeper
        self.settings = settings if settings is not None else Settings()
        """The resolved settings this handle was configured with (what a Ray worker reports back)."""
        self.otlp = otlp
        """Where and how the OTLP exporters connect (``config._otlp``: every exporter reads it)."""
        self.worker_env = worker_env
        """Environment for another process's ``configure()`` to export like this one (see integrations.ray)."""
        self.live = live
        """The in-flight registry's monitor (``_watchdog.LiveMonitor``), ``None`` when tracing is off."""
        self.summaries = summaries
        """Writes the ``rl.step.summary`` span of each collected step (:func:`write_step_summary`); ``None`` when
        tracing is off."""
        self._previous = previous
        self._closed = False
        self._parent = current_handle()  # the handle current when this one was configured
        self._saved = saved  # what configure() replaced, restored by shutdown()
        after_fork_in_child(self, "_after_fork")

    def _after_fork(self) -> None:
        """In a forked child: the resource names this process (:func:`_fork_identity`), and so does the worker
        name this handle's shutdown restores."""
        if self.provider is None or self._closed:
            return
        parent = _fork_identity(self.provider.resource)
        if parent is not None and self._saved is not None:
            self._saved = self._saved._replace(worker=forked_worker(self._saved.worker, parent, os.getpid()))

    @property
    def run_id(self) -> str | None:
        """This process's ``rl.run.id`` (``None`` when tracing is off)."""
        return self.settings.run_id if self.provider is not None else None

    @property
    def run_attempt(self) -> str | None:
        """This process's ``rl.run.attempt`` (``None`` when tracing is off)."""
        return self.settings.run_attempt if self.provider is not None else None

    def inflight(self, limit: int | None = None) -> list[InflightSample]:
        """This process's running samples, oldest first (``InflightSample``: identity, phase, tool, ages,
        trace id); ``[]`` when tracing is off."""
        return self.live.registry.snapshot(limit) if self.live is not None and not self._closed else []

    @property
    def _pipeline(self) -> RecordPipeline | None:
        """The fast path's export pipeline of :attr:`provider` (``None``: tracing off, or ``fast_path=False``)."""
        return self.provider.pipeline if isinstance(self.provider, PipelineProvider) else None

    @property
    def enabled(self) -> bool:
        return self.provider is not None and not self._closed

    @property
    def closed(self) -> bool:
        """``shutdown()`` was called."""
        return self._closed

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        """Export what is queued, waiting at most ``timeout_s`` in total (at most ``failed_export_wait_s`` once an
        exporter's endpoint has failed); ``False`` if time ran out. Never
        raises: NaN (or not a number) means the default, a negative timeout 0, an infinite or huge one
        ``MAX_SECONDS`` (one hour)."""
        if not self.enabled:
            return True
        wait_s = failed_wait(self.export_processors, _timeout_s(timeout_s, 5.0))  # shorter once an endpoint failed
        return _bounded(lambda: self.provider.force_flush(int(wait_s * 1000)), wait_s)  # type: ignore[union-attr]

    def request_flush(self, wait_s: float = 0.0) -> bool:
        """Ask the export processors to export what is queued now; wait (at most ``wait_s`` in total) only
        while their backend is healthy (see :meth:`ExportProcessor.request_flush`). Never blocks on a dead or
        hung backend beyond the first timed-out wait. Returns whether everything queued was exported."""
        if not self.enabled:
            return True
        deadline = time.monotonic() + max(wait_s, 0.0)
        pipeline = self._pipeline
        if pipeline is not None:  # the fast path's ended spans into the export queues first (CPU only, bounded)
            pipeline.drain()
        ok = True
        for proc in self.export_processors:
            ok = proc.request_flush(max(deadline - time.monotonic(), 0.0)) and ok
        return ok

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Turn tracing off for this handle and restore what :func:`configure` replaced; idempotent.

        Exports what is queued within ``timeout_s`` in total (the timeout reaches every export processor; at
        most ``failed_export_wait_s`` once an exporter's endpoint has failed, each saying what it could not send);
        spans still queued or stuck in an export when it runs out are counted as dropped. Afterwards the
        decorators make no spans through this handle's provider, even where it stays the global provider.
        Handles nest: shutting down the current handle restores the newest older handle still open (or the
        state before any), never a shut-down one. Returns within ``timeout_s`` (plus ~0.2 s) even when an
        exporter's own ``shutdown()`` blocks, and never raises: ``timeout_s`` is bounded as in
        :meth:`force_flush`.
        """
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + failed_wait(self.export_processors, _timeout_s(timeout_s, 5.0))
        if self.summaries is not None:
            self.summaries.close()
        _release(self)
        if self.provider is None:
            return
        provider = self.provider
        _tracer.retire(provider)

        def remaining_ms() -> int:
            return max(int((deadline - time.monotonic()) * 1000), 0)

        try:
            pipeline = self._pipeline
            if pipeline is not None:
                pipeline.shutdown()  # the fast path's queued spans reach the exporters before they stop
            if self.keeper is not None:
                self.keeper.shutdown(remaining_ms())
            else:
                for proc in self.export_processors:
                    proc.shutdown(remaining_ms())
        except Exception:
            internal_error("Handle.shutdown")
        _bounded(provider.shutdown, max(deadline - time.monotonic(), 0.05))  # its result is not used

    @property
    def stats(self) -> dict[str, int]:
        """Export counters summed over exporters (``queued``, ``exported``, ``dropped``, ``failed``, ``pending``),
        the keeper's (``kept_slowest``, ``kept_errors``, ``samples_not_kept``, ``samples_spilled``, buffered)
        and the metrics processor's counters.

        One accounting: at any moment every sampled span that ended is in exactly one of ``exported``,
        ``failed``, ``dropped`` or ``pending``, once per exporter. ``pending`` includes the fast path's queue
        (spans not yet handed to the exporters); ``dropped`` includes the spans that queue lost (ended after
        shutdown). The export counters are read under the fast path's queue lock, which the pipeline holds
        while it hands spans over, so none is counted twice or missed.

        One number with ``collect()``: the fast path's queued spans are handed to the exporters first, as a
        collect does before it reads these counters (``agent_loop/telemetry/spans_dropped`` and ``spans_failed``
        are ``dropped`` and ``failed`` here), so a span a full export queue drops is ``dropped`` on both surfaces,
        never ``pending`` on one of them."""
        out: dict[str, int] = {"queued": 0, "exported": 0, "dropped": 0, "failed": 0, "pending": 0}
        pipeline = self._pipeline
        with pipeline.lock if pipeline is not None else contextlib.nullcontext():
            if pipeline is not None:
                try:
                    pipeline.drain()  # under the lock: no span moves between the drain and the reads
                except Exception:
                    internal_error("Handle.stats")
            for proc in self.export_processors:
                for key, value in proc.stats.items():
                    out[key] += value
            if pipeline is not None:  # each exporter would have received these: counted once per exporter
                exporters = len(self.export_processors)
                out["pending"] += pipeline.waiting() * exporters
                out["dropped"] += pipeline.dropped * exporters
        if self.keeper is not None:
            out.update(self.keeper.stats)
        if self.summaries is not None:
            out.update(self.summaries.stats)
        out.update(self.metrics.stats)
        return out

    def export_counters(self) -> dict[str, int]:
        """The counters reported under ``agent_loop/telemetry/`` by ``metrics.collect``."""
        stats = self.stats
        out = {
            "spans_dropped": stats["dropped"],
            "spans_failed": stats["failed"],
            "content_truncated": state.content.truncated,
        }
        for key in ("samples_not_kept", "samples_spilled"):
            if key in stats:
                out[key] = stats[key]
        return out

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"<otel_agentloop.Handle {self.description}>"


class _ExportCounters(StepHooks):
    """The hooks that put ``handle``'s :meth:`Handle.export_counters` in each ``collect()`` result."""

    __slots__ = ("handle",)

    def __init__(self, handle: Handle) -> None:
        self.handle = handle

    def telemetry_counters(self) -> Mapping[str, int]:
        return self.handle.export_counters()


def _release(handle: Handle) -> None:
    """Undo what ``handle``'s :func:`configure` installed, atomically with other configure/shutdown calls: if it
    is current, restore the newest older handle still open (or the state before any)."""
    with state.lock:
        if state.handle is handle:
            target = handle
            while target._parent is not None and target._parent._closed:
                target = target._parent
            if target._saved is not None:
                state.restore(target._saved)
            state.handle = target._parent
        elif state.tracer.configured is handle.provider:  # not current, yet installed: uninstall it
            _tracer.install(handle._previous)


def current_handle() -> Handle | None:
    """The handle of the last :func:`configure` call in this process (``None`` before any)."""
    return cast("Handle | None", state.handle)  # the one reader that types it: only configure() stores one


def write_step_summary(
    table: PhaseTable,
    metrics: StepMetrics,
    step: int | None,
    validate: bool = False,
    *,
    staleness: npt.ArrayLike | None = None,
    handle: Handle | None = None,
) -> StepSummary | None:
    """Write the ``rl.step.summary`` span of one collected step through ``handle`` (default: the current one):
    ``table`` and ``metrics`` exactly as the caller's step produced them (see ``export._step_summary``).
    Nothing (``None``) when there is no handle or tracing is off; never raises."""
    try:
        handle = handle if handle is not None else current_handle()
        writer = handle.summaries if handle is not None and handle.enabled else None
        return writer.write(table, metrics, step, validate, staleness=staleness) if writer is not None else None
    except Exception:
        internal_error("write_step_summary")
        return None


def _bounded(fn: Callable[[], object], timeout_s: float) -> bool:
    """Run ``fn`` on a daemon thread and wait at most ``timeout_s``: SDK calls do not always honour timeouts."""
    result: list[bool] = []
    worker = threading.Thread(target=lambda: result.append(bool(fn())), name="otel_agentloop.bounded", daemon=True)
    worker.start()
    worker.join(max(timeout_s, 0.0) + 0.05)
    return bool(result and result[0])


def _fork_identity(resource: Resource) -> int | None:
    """In a forked child, make ``resource`` carry this process's ``process.pid`` and ``rl.worker``
    (:func:`~otel_agentloop.core._state.forked_worker`), not the parent's; the parent's pid (``None``: nothing
    changed). Changed in place: the one object is shared by the provider, its tracers, the fast path's
    recorder, the step summaries' tracer and the meter provider, and every one of them must see it
    (``Resource`` has no public way to change it)."""
    attrs = dict(resource.attributes)
    parent, pid = attrs.get("process.pid"), os.getpid()
    if type(parent) is not int or parent == pid:
        return None
    attrs["process.pid"] = pid
    worker = attrs.get(sc.RL_WORKER)
    if isinstance(worker, str):
        attrs[sc.RL_WORKER] = forked_worker(worker, parent, pid)
    resource._attributes = BoundedAttributes(attributes=attrs, immutable=True)  # pyright: ignore[reportPrivateUsage]
    return parent
