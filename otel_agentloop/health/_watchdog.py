"""The watchdog: a background thread that notices phases running too long, while they run.

Every ``interval_s`` the thread (one per process, ``otel_agentloop.live``) drains the ended spans the
:class:`~otel_agentloop.core._inflight.InflightRegistry` queued (recording the library's metrics) and visits
the open phase spans oldest first. A phase running longer than its threshold gets, once per sample: one
WARNING naming the sample, phase, tool, age and trace id, and a *snapshot span* exported at once (see
:data:`semconv.SNAPSHOT_SUFFIX`) so the still-running sample is visible in Jaeger before it ends.

Thresholds, first match wins: an explicit ``tool:NAME`` threshold, an explicit phase threshold, the learned
threshold of the tool, of the phase (``p99_multiple`` x the p99 of that key's recent durations, at least
``min_s``; learned when a step is collected, from at least ``min_observations`` ended spans), else ``default_s``.

When a step is collected, the samples reported during it are classified by the one verdict rule
(``metrics._summary.verdict``): *slow* (they finished) or *hung* (still running, even if they end later), as
``agent_loop/watchdog/{slow,hung}`` with their trace ids on the :class:`StepMetrics`. Bounded (warnings per
check, steps and samples remembered), fork-safe (the thread restarts in a forked child), stopped by the
provider's shutdown.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, TraceFlags, Tracer
from opentelemetry.util.types import AttributeValue

from .. import semconv as sc
from ..config._fork import after_fork_in_child
from ..config._values import ThresholdKey
from ..config._values import parse_thresholds as parse_thresholds
from ..config._watchdog import WATCHDOG_FIELDS as WATCHDOG_FIELDS
from ..config._watchdog import WatchdogSettings as WatchdogSettings
from ..core import _tracer
from ..core._guard import internal_error, logger
from ..core._inflight import InflightRegistry, OpenPhase
from ..core._scope import TrackedSample
from ..export._processor import failed_wait
from ..export._side import side_tracer
from ..metrics._hooks import StepHooks
from ..metrics._processor import PhaseMetricsProcessor
from ..metrics._table import OverdueSample, StepMetrics
from ..metrics._verdicts import HUNG, Verdict, apply_verdicts, classify_reported

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricReader

    from ..metrics._otel import LibraryMetrics

_MAX_STEPS = 16


def learned_thresholds(
    durations: Mapping[ThresholdKey, Iterable[int]], multiple: float, floor: float, min_obs: int
) -> dict[ThresholdKey, float]:
    """``max(floor, multiple x p99)`` in seconds per (phase, tool) window of ns durations with at least
    ``min_obs`` values, and per (phase, None) over all of that phase's windows."""
    import numpy as np

    keys: dict[ThresholdKey, list[int]] = {}
    for (phase, tool), window in list(durations.items()):
        values = list(window)  # one C-level copy: safe while on_end appends
        keys.setdefault((phase, None), []).extend(values)
        if tool is not None:
            keys[(phase, tool)] = values
    return {
        key: max(floor, multiple * float(np.percentile(np.asarray(values, float), 99)) / 1e9)
        for key, values in keys.items()
        if len(values) >= min_obs
    }


class LiveMonitor(StepHooks):
    """The background thread and what it maintains: learned thresholds, reports, step verdicts.

    A :class:`StepHooks` of the metrics processor: a step's release makes its verdict, ``collect`` gets it and
    the registry's counters, the provider's flush and shutdown reach the thread and the library's metrics
    (through the metrics processor, which runs on every span anyway: a processor of the monitor's own would
    add three calls to every span).

    ``export`` are the span processors snapshot spans are handed to (the handle's export processors: a
    snapshot is exported whether or not its sample is, and skips budget buffering). ``metrics`` is a
    :class:`~otel_agentloop.metrics._otel.LibraryMetrics` or ``None``.
    """

    def __init__(
        self,
        registry: InflightRegistry,
        settings: WatchdogSettings,
        *,
        provider: TracerProvider,
        export: Sequence[SpanProcessor] = (),
        metrics: LibraryMetrics | None = None,
    ) -> None:
        self.registry = registry
        self.settings = settings
        self.metrics = metrics
        self._export = tuple(export)  # their endpoint's failure shortens the metrics' flush and shutdown
        self._snapshots: Tracer | None = None
        if export:
            self._snapshots = side_tracer(
                "otel_agentloop.watchdog",
                provider.resource,
                export,
                max_attributes=32,
                max_links=1,
                max_attribute_length=256,
            )
        self._explicit = settings.parsed
        self._thresholds: dict[ThresholdKey, float] = {}
        self._rebuild({})
        self._tripped: dict[tuple[int | None, bool], list[tuple[TrackedSample, OpenPhase]]] = {}
        self._verdicts: dict[tuple[int | None, bool], Verdict] = {}
        self.reports = 0
        self.snapshots_exported = 0
        self.cpu_s = 0.0
        self.checks = 0
        self._closed = False
        self._init_thread()
        after_fork_in_child(self, "_after_fork")

    def _after_fork(self) -> None:
        """A forked child starts with no reports of its parent's and its own thread (none once closed)."""
        if not self._closed:
            self._tripped, self._verdicts = {}, {}
            self._init_thread()

    # -- thread -----------------------------------------------------------------------------------
    def _init_thread(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otel_agentloop.live", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.settings.interval_s):
            self.check()

    def check(self, now_ns: int | None = None) -> None:
        """One pass: drain ended spans (metrics), then report newly overdue phases, aged up to ``now_ns``
        (``time.monotonic_ns()``). Never raises."""
        t0 = time.thread_time()
        try:
            with self._lock:
                self._drain()
                if self.settings.enabled:
                    now = time.monotonic_ns() if now_ns is None else now_ns  # ages: never the wall clock
                    found = self.registry.overdue(now, self._threshold_ns, self._min_ns)
                    for n, (rec, age) in enumerate(found):
                        self._report(rec, age, now, log=n < self.settings.max_warnings_per_check)
                    if len(found) > self.settings.max_warnings_per_check:
                        logger.warning(
                            "otel_agentloop: watchdog: %d more samples over their threshold (not listed)",
                            len(found) - self.settings.max_warnings_per_check,
                        )
        except Exception:
            internal_error("LiveMonitor.check")
        self.checks += 1
        self.cpu_s += time.thread_time() - t0

    def _drain(self) -> None:
        metrics = self.metrics
        for phase, span in self.registry.drain():
            if metrics is not None:
                metrics.record(phase, span)

    # -- thresholds -------------------------------------------------------------------------------
    def _rebuild(self, learned: Mapping[ThresholdKey, float]) -> None:
        table = dict(learned)
        for phase, tool in self._explicit:
            if tool is None:  # an explicit phase threshold beats anything learned for that phase's tools
                for key in [k for k in table if k[0] == phase]:
                    del table[key]
        table.update(self._explicit)
        self._thresholds = {k: v for k, v in table.items()}
        self._ns = {k: int(v * 1e9) for k, v in table.items()}
        self._default_ns = int(self.settings.default_s * 1e9)
        self._min_ns = min([self._default_ns, *self._ns.values()])

    def _threshold_ns(self, phase: str, tool: str | None) -> int:
        ns = self._ns
        return ns.get((phase, tool)) or ns.get((phase, None)) or self._default_ns

    def threshold_s(self, phase: str, tool: str | None = None) -> float:
        """The threshold in force for ``phase`` (and ``tool``), in seconds."""
        return self._threshold_ns(phase, tool) / 1e9

    # -- reports ----------------------------------------------------------------------------------
    def _report(self, rec: OpenPhase, age_ns: int, now_ns: int, *, log: bool) -> None:
        sample = rec.sample
        trace_id = format(sample.trace_id, "032x")
        self.reports += 1
        if log:
            rollout = "" if sample.rollout is None else f"/{sample.rollout}"
            logger.warning(
                "otel_agentloop: watchdog: sample %s%s (step %s%s) has been in %s%s for %.1fs (threshold %.1fs); "
                "trace %s",
                sample.index,
                rollout,
                sample.step,
                ", validation" if sample.validate else "",
                rec.phase,
                f" (tool {rec.tool})" if rec.tool else "",
                age_ns / 1e9,
                self.threshold_s(rec.phase, rec.tool),
                trace_id,
            )
        key = (sample.step, sample.validate)
        tripped = self._tripped.get(key)
        if tripped is None:
            while len(self._tripped) >= _MAX_STEPS:
                self._tripped.pop(next(iter(self._tripped)))
            tripped = self._tripped[key] = []
        if len(tripped) < self.registry.max_samples:
            tripped.append((sample, rec))
        self._snapshot(sample, rec, now_ns)

    def _snapshot(self, sample: TrackedSample, rec: OpenPhase | None, now_ns: int) -> None:
        if self._snapshots is None:
            return
        try:
            ctx = SpanContext(
                sample.trace_id, sample.span_id, is_remote=False, trace_flags=TraceFlags(sample.trace_flags)
            )
            attrs: dict[str, AttributeValue] = {
                sc.RL_SNAPSHOT: True,
                sc.RL_VALIDATE: sample.validate,
                sc.RL_PHASE: rec.phase if rec is not None else "other",
            }
            for key, value in (
                (sc.RL_STEP, sample.step),
                (sc.RL_SAMPLE_INDEX, sample.index),
                (sc.RL_ROLLOUT_N, sample.rollout),
                (sc.RL_WORKER, sample.worker),
            ):
                if value is not None:
                    attrs[key] = value
            if rec is not None:
                attrs[sc.RL_SNAPSHOT_PHASE_AGE] = (now_ns - rec.start_mono_ns) / 1e9
                if rec.tool:
                    attrs[sc.GEN_AI_TOOL_NAME] = rec.tool
            span = self._snapshots.start_span(
                sample.name + sc.SNAPSHOT_SUFFIX,
                context=trace.set_span_in_context(NonRecordingSpan(ctx)),
                links=[Link(ctx)],
                attributes=attrs,
                start_time=sample.start_ns,
            )
            span.end(end_time=sample.start_ns + max(now_ns - sample.start_mono_ns, 0))  # on the sample's timeline
            self.snapshots_exported += 1
        except Exception:
            internal_error("LiveMonitor.snapshot")

    # -- steps ------------------------------------------------------------------------------------
    def step_released(self, step: int | None, validate: bool) -> None:
        """A step was collected: classify its reported samples, learn thresholds from what ended so far."""
        try:
            with self._lock:
                self._drain()
                if self.settings.enabled:
                    s = self.settings
                    self._rebuild(
                        learned_thresholds(self.registry.durations, s.p99_multiple, s.min_s, s.min_observations)
                    )
                slow: list[OverdueSample] = []
                hung: list[OverdueSample] = []
                for sample, rec in self._tripped.pop((step, validate), ()):
                    item = OverdueSample(
                        sample.index, sample.rollout, format(sample.trace_id, "032x"), rec.phase, rec.tool
                    )
                    # the one rule (metrics._summary.verdict): still running at this collect is hung
                    (hung if classify_reported(finished=sample.ended) == HUNG else slow).append(item)
                while len(self._verdicts) >= _MAX_STEPS:
                    self._verdicts.pop(next(iter(self._verdicts)))
                self._verdicts[(step, validate)] = Verdict(tuple(slow), tuple(hung))
        except Exception:
            internal_error("LiveMonitor.step_released")

    def verdict(self, step: int | None, validate: bool = False) -> Verdict:
        """The classification made when ``step`` was collected (forgotten once read)."""
        with self._lock:
            return self._verdicts.pop((step, validate), Verdict())

    def step_metrics(self, step: int | None, validate: bool, metrics: StepMetrics) -> None:
        """The step's verdict into ``metrics``: keys only when the watchdog reported a sample in that step."""
        if self.settings.enabled:
            apply_verdicts(metrics, [self.verdict(step, validate)])

    def telemetry_counters(self) -> Mapping[str, int]:
        """The registry's counters (not the gauge of running samples)."""
        return {k: v for k, v in self.registry.stats.items() if k != "inflight_samples"}

    def provider_flush(self, timeout_s: float) -> bool:
        return self.force_flush(failed_wait(self._export, timeout_s))

    def provider_shutdown(self) -> None:
        # at exit too: a dead endpoint costs a short bound; never 0 (the SDK's MeterProvider then raises and
        # leaves its readers running)
        self.shutdown(max(failed_wait(self._export, 5.0), 0.1))

    # -- lifecycle --------------------------------------------------------------------------------
    def force_flush(self, timeout_s: float = 5.0) -> bool:
        self.check()
        if self.metrics is None:
            return True
        try:
            return self.metrics.force_flush(timeout_s)
        except Exception:  # the SDK raises when a reader times out
            return False

    def shutdown(self, timeout_s: float = 5.0) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self.check()
        if self.metrics is not None:
            try:
                self.metrics.shutdown(timeout_s)
            except Exception:
                internal_error("LiveMonitor.shutdown")

    @property
    def stats(self) -> dict[str, int]:
        return {**self.registry.stats, "watchdog_reports": self.reports, "watchdog_snapshots": self.snapshots_exported}


def install(
    provider: TracerProvider,
    metrics_processor: PhaseMetricsProcessor,
    export: Sequence[SpanProcessor],
    *,
    settings: WatchdogSettings,
    max_inflight: int,
    readers: Sequence[MetricReader],
) -> LiveMonitor:
    """Create the registry (fed by the spans the library starts through ``provider``) and the monitor, the
    hooks of ``metrics_processor`` (the provider's shutdown and flush, step release and collect)."""
    from ..metrics._otel import LibraryMetrics

    registry = InflightRegistry(
        max_samples=max_inflight, keep_ended=bool(readers), learn=settings.enabled, window=settings.window
    )
    lib_metrics = LibraryMetrics(provider.resource, readers, registry) if readers else None
    monitor = LiveMonitor(registry, settings, provider=provider, export=export, metrics=lib_metrics)
    metrics_processor.add_hooks(monitor)
    _tracer.set_registry(provider, registry)  # fed by the library's span lifecycle (sample(), the phase wrappers)
    return monitor
