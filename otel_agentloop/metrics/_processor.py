"""The span processor that turns phase spans into verl's agent-loop metrics."""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.trace import StatusCode

from .. import semconv as sc
from ..config._fork import after_fork_in_child
from ..core._door import RecordProcessor
from ..core._guard import internal_error, warn_once
from ..core._record import FastSpan
from ..semconv import StepKey, step_key
from ._accumulate import PHASE_INDEX, StepRows
from ._hooks import StepHooks
from ._records import SpanRecord
from ._table import PhaseTable, StepMetrics, compute_metrics

_PHASE, _SAMPLE, _INDEX, _ROLLOUT = sc.RL_PHASE, sc.SAMPLE_SPAN, sc.RL_SAMPLE_INDEX, sc.RL_ROLLOUT_N
_SNAPSHOT = sc.RL_SNAPSHOT
_ERROR = StatusCode.ERROR
_MAX_RUNNING_ROOTS = 1 << 18


class PhaseMetricsProcessor(RecordProcessor):
    """Accumulates, per step, each sample's phase time from finished spans; :meth:`collect` returns verl's dict.

    Add it to any SDK ``TracerProvider`` (``configure()`` does). It reads only span attributes written by this
    library (``rl.phase``, ``rl.step``, ``rl.validate``, ``rl.sample.index``, ``rl.sample.rollout_n``, and
    per-sample facts on ``rl.sample`` root spans). It sees every *recorded* span, exported or not, so trace
    sampling never changes the metrics.

    Bounded: at most ``max_steps`` steps are open at once (the oldest is evicted, counted in
    ``stats["steps_evicted"]``) and ``max_samples_per_step`` samples per step (more are counted in
    ``stats["samples_dropped"]``). A step's state is released by :meth:`collect`/:meth:`take`.

    ``collect(step)`` while some of the step's samples still run (their ``rl.sample`` span started and has not
    ended): those samples are left out of the result and counted in ``agent_loop/telemetry/samples_in_flight``;
    what they accumulated so far is kept, their later spans add to it, and the next ``collect(step)`` returns
    the samples of the step that ended since the previous one, with ``agent_loop/late_samples`` (how many of
    them were running at an earlier collect). Each sample is counted in exactly one result, whole. A step's
    late samples count against ``max_steps`` until collected; evicted uncollected, they are counted in
    ``stats["late_samples_evicted"]``. verl collects each step once, after every sample of it ended: nothing
    is late there.

    Thread-safe and fork-safe (a forked child starts empty). ``on_end`` is O(1) for the usual span orders and
    never raises. Releases, collects and the provider's flush and shutdown reach the handle's other parts
    through :class:`~._hooks.StepHooks` (:meth:`add_hooks`).
    """

    reads_starts = True  # a sample's root span starts: its sample is running

    def __init__(self, *, max_steps: int = 16, max_samples_per_step: int = 1 << 20) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, not {max_steps}")
        if max_samples_per_step < 1:
            raise ValueError(f"max_samples_per_step must be >= 1, not {max_samples_per_step}")
        self.max_steps = max_steps
        self.max_samples_per_step = max_samples_per_step
        # the handle's other parts (keeper, watchdog, summaries, export counters): kept across fork, where
        # those parts carry on (each resets its own state in the child)
        self._hooks: tuple[StepHooks, ...] = ()
        self._init_state()
        after_fork_in_child(self, "_init_state")

    def _init_state(self) -> None:
        """Fresh state and lock (also in a forked child: the parent's accumulation stays with the parent, and
        a lock held by another thread at fork is never inherited held)."""
        self._steps: dict[StepKey, StepRows] = {}
        self._lock = threading.Lock()
        self._acquire, self._release = self._lock.acquire, self._lock.release
        self._outside = 0
        self._evicted = 0
        self._dropped_closed = 0
        self._late = 0
        self._late_evicted = 0
        self._in_flight_total = 0
        self._last_in_flight = 0
        # samples whose root span started and has not ended, per step: excluded from collect()
        self._running: dict[StepKey, dict[tuple[int, int], int]] = {}
        self._roots: dict[int, tuple[StepKey, tuple[int, int]]] = {}  # running root span id -> its entry above
        # samples still running when their step was collected: their later spans are counted, never
        # accumulated into a second result
        self._late_samples: OrderedDict[StepKey, set[tuple[int, int]]] = OrderedDict()
        # steps collected (released) at least once: a later span belongs to a next result only if its sample
        # was running at a collect or started after it, never if the sample was counted already
        self._released: OrderedDict[StepKey, None] = OrderedDict()
        self._last_key: object = object()  # one-entry cache: most spans belong to the step of the previous one
        self._last_rows: StepRows | None = None

    # -- SpanProcessor ---------------------------------------------------------------------------
    def record_start(self, span: FastSpan) -> None:
        try:
            if span.name != _SAMPLE:
                return
            attrs = span.attributes or {}
            index = attrs.get(_INDEX)
            if type(index) is not int:
                return
            rollout = attrs.get(_ROLLOUT, -1)
            key = step_key(attrs)
            sample = (index, rollout if type(rollout) is int else -1)
            with self._lock:
                while len(self._running) > 4 * self.max_steps and key not in self._running:
                    del self._running[next(iter(self._running))]  # bound: steps never collected
                running = self._running.setdefault(key, {})
                running[sample] = running.get(sample, 0) + 1
                # its end is matched by span id: attributes set on it later never leave it running forever
                roots = self._roots
                while len(roots) >= _MAX_RUNNING_ROOTS:  # bound: root spans that never end
                    self._sample_ended(*roots.pop(next(iter(roots))))
                roots[span.span_id] = (key, sample)
        except Exception:
            internal_error("PhaseMetricsProcessor.on_start")

    def _sample_ended(self, key: StepKey, sample: tuple[int, int]) -> None:
        """Called with the lock held when a sample's root span ends (``key``, ``sample``: as it started)."""
        running = self._running.get(key)
        if running is not None:
            count = running.get(sample, 0) - 1
            if count > 0:
                running[sample] = count
            else:
                running.pop(sample, None)
                if not running:
                    del self._running[key]

    def record_end(self, span: FastSpan) -> None:
        try:
            self._ingest(
                span.name,
                span.attributes,
                span.start_ns,
                span.end_ns,
                span.trace_id,
                span.status.status_code is _ERROR,
                span.span_id,
            )
        except Exception:
            internal_error("PhaseMetricsProcessor.on_end")

    def shutdown(self) -> None:
        """Fires every hook's ``provider_shutdown``."""
        for hooks in self._hooks:
            try:
                hooks.provider_shutdown()
            except Exception:
                internal_error("PhaseMetricsProcessor.provider_shutdown")

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Fires every hook's ``provider_flush``; ``False`` if one returned ``False`` or raised."""
        ok = True
        for hooks in self._hooks:
            try:
                ok = bool(hooks.provider_flush(timeout_millis / 1000)) and ok
            except Exception:
                internal_error("PhaseMetricsProcessor.provider_flush")
                ok = False
        return ok

    # -- ingestion (shared by live spans and stored spans) ------------------------------------------
    def ingest(self, name: str, attrs: Mapping[str, Any], start: int, end: int, trace_id: int, error: bool) -> None:
        """Account one finished span. Spans that are neither phase nor sample spans are ignored. A span named
        ``rl.sample`` is a sample's root span, whatever its attributes (a user's ``rl.phase`` among them)."""
        self._ingest(name, attrs, start, end, trace_id, error, 0)

    def _ingest(
        self, name: str, attrs: Mapping[str, Any], start: int, end: int, trace_id: int, error: bool, span_id: int
    ) -> None:
        get = attrs.get
        if name == _SAMPLE:
            p = -1
        else:
            phase = get(_PHASE)
            if phase is None:
                return
            try:
                p = PHASE_INDEX.get(phase, -2)
            except TypeError:  # an unhashable stored value (a key-value list read from a file) is not a phase
                return
            if p == -2 or get(_SNAPSHOT):  # a watchdog snapshot of a running sample is not phase time
                return
        index = get(_INDEX)
        if type(index) is not int:
            with self._lock:
                self._outside += 1
                if p < 0 and span_id and self._roots:
                    started = self._roots.pop(span_id, None)
                    if started is not None:
                        self._sample_ended(*started)
            if p >= 0:
                warn_once(
                    "phase-outside-sample",
                    "otel_agentloop: phase span %r outside any sample is not "
                    "counted in agent_loop metrics (open otel_agentloop.sample(...) around it)",
                    name,
                )
            return
        rollout = get(_ROLLOUT, -1)
        key = step_key(attrs)
        sample = (index, rollout if type(rollout) is int else -1)
        self._acquire()  # not `with`: ~0.25 us cheaper per span here
        try:
            started = self._roots.pop(span_id, None) if p < 0 and span_id and self._roots else None
            if key == self._last_key:
                rows = self._last_rows
            else:
                rows = self._steps.get(key)
                if rows is None and key not in self._released:
                    rows = self._open(key)
            if (rows is None or rows.late) and started is None and not self._counts_after_collect(key, sample):
                # a span of a sample already in an earlier result of its step (a task that outlived its sample)
                self._late += 1
                return
            if rows is None:
                rows = self._open(key)
            self._last_key, self._last_rows = key, rows
            if started is not None:
                self._sample_ended(*started)
            elif p < 0 and self._running and not span_id:  # a span that reached on_end only (ingest())
                self._sample_ended(key, sample)
            rows.add(sample, p, start, end, attrs, trace_id, error)
        finally:
            self._release()

    def _counts_after_collect(self, key: StepKey, sample: tuple[int, int]) -> bool:
        """With the lock held, for a step already collected: does a span of ``sample`` belong to its next result
        (the sample was running at a collect, or started after it, or has a row there already)?"""
        rows = self._steps.get(key)
        return (
            (rows is not None and sample in rows.rows)
            or sample in self._running.get(key, ())
            or sample in self._late_samples.get(key, ())
        )

    def ingest_records(self, records: Iterable[SpanRecord]) -> None:
        """Account stored spans (from a trace file or Jaeger) exactly as live ones."""
        for rec in records:
            self.ingest(rec.name, rec.attributes, rec.start_ns, rec.end_ns, rec.trace_id, rec.error)

    def _open(self, key: StepKey, rows: StepRows | None = None) -> StepRows:
        """Make ``rows`` (a new ``StepRows`` when ``None``) the state of ``key``, evicting the oldest open step
        when ``max_steps`` are open."""
        while len(self._steps) >= self.max_steps:
            oldest = next(iter(self._steps))
            evicted = self._steps.pop(oldest)
            self._dropped_closed += evicted.dropped
            self._running.pop(oldest, None)
            self._late_samples.pop(oldest, None)
            self._last_key = object()
            if evicted.late:  # the step was collected; these samples ended (or run) after it
                self._late_evicted += len(evicted)
                warn_once(
                    "late-evicted",
                    "otel_agentloop: more than %d steps open in PhaseMetricsProcessor; forgetting %d samples of "
                    "step %r that ended after its collect (call collect(step) again to get them)",
                    self.max_steps,
                    len(evicted),
                    oldest,
                )
                continue
            self._evicted += 1
            warn_once(
                "step-evicted",
                "otel_agentloop: more than %d steps open in PhaseMetricsProcessor; evicting "
                "step %r uncollected (call collect(step) each step)",
                self.max_steps,
                oldest,
            )
        if rows is None:
            rows = StepRows(self.max_samples_per_step)
            rows.late = key in self._released  # a collected step: its late samples' later spans
        self._steps[key] = rows
        return rows

    # -- results --------------------------------------------------------------------------------
    def take(self, step: int | None, validate: bool = False, *, release: bool = True) -> PhaseTable:
        """The per-sample table of ``step`` (empty if none); ``release`` frees the step's state.

        Samples of the step still running (root span started, not ended) are left out and counted in
        ``stats["samples_in_flight"]`` (this collect) and ``samples_in_flight_total``. On release, what they
        accumulated so far is kept as the step's new state, so their later spans add to it: the next release
        of the step returns them (flagged ``late``), with any other sample of the step that ended since. Each
        sample is in exactly one released table. Every release fires the hooks' ``step_released`` (the
        keeper's export of kept samples, the watchdog's verdict), also when no span of the step has ended.
        """
        for hooks in self._hooks:  # before the lock: a part holding spans not yet accounted hands them over
            try:
                hooks.step_reading(step, validate)
            except Exception:
                internal_error("PhaseMetricsProcessor.step_reading")
        with self._lock:
            key: StepKey = (step, validate)
            rows = self._steps.pop(key, None) if release else self._steps.get(key)
            self._last_key = object()
            running = self._running.get(key) or {}
            late = self._late_samples.get(key) or ()
            if rows is None:
                table = dataclasses.replace(PhaseTable.empty(), step_key=key)
            else:
                table = rows.to_table(exclude=running, late=late, step_key=key)
            if release:  # samples still running stay in self._running: their root span ends later
                self._released[key] = None
                self._released.move_to_end(key)
                while len(self._released) > 4 * self.max_steps:
                    self._released.popitem(last=False)
                self._last_in_flight = len(running)
                self._in_flight_total += len(running)
                if rows is not None and rows.dropped:
                    self._dropped_closed += rows.dropped
                self._late_samples.pop(key, None)  # the late ones that ended are in this table
                if running:
                    self._late_samples[key] = set(running)
                    while len(self._late_samples) > 4 * self.max_steps:
                        self._late_samples.popitem(last=False)
                    if rows is not None:
                        carried = rows.split_off(running)
                        if len(carried):
                            self._open(key, carried)
        if release:
            for hooks in self._hooks:
                try:
                    hooks.step_released(step, validate)
                except Exception:
                    internal_error("PhaseMetricsProcessor.step_released")
        return table

    def collect(self, step: int | None, validate: bool = False) -> StepMetrics:
        """verl's metric dict for ``step`` (see :func:`otel_agentloop.compute_metrics`), releasing its state.

        Also holds this process's telemetry counters since start, ``agent_loop/telemetry/<name>`` (spans
        dropped or failed in export, samples not kept or spilled under a budget, spans outside any sample), and
        what the hooks add (:class:`~._hooks.StepHooks`: release, counters, step metrics, then collected).
        """
        table = self.take(step, validate)
        metrics = compute_metrics(table)
        counters: dict[str, int] = dict(self.stats)
        for hooks in self._hooks:
            try:
                counters.update(hooks.telemetry_counters())
            except Exception:
                internal_error("PhaseMetricsProcessor.telemetry_counters")
        for name, value in counters.items():
            metrics[f"{sc.METRIC_PREFIX}/telemetry/{name}"] = float(value)
        for hooks in self._hooks:
            try:
                hooks.step_metrics(step, validate, metrics)
            except Exception:
                internal_error("PhaseMetricsProcessor.step_metrics")
        for hooks in self._hooks:
            try:
                hooks.step_collected(table, metrics, step, validate)
            except Exception:
                internal_error("PhaseMetricsProcessor.step_collected")
        return metrics

    def add_hooks(self, hooks: StepHooks) -> None:
        """Fire ``hooks``' events (:class:`~._hooks.StepHooks`: its contract) after those of the hooks added
        before; the provider's flush and shutdown reach through it parts that have no span processor of their
        own (one would cost calls on every span)."""
        self._hooks = (*self._hooks, hooks)

    def open_steps(self) -> list[StepKey]:
        """(step, validate) pairs holding uncollected state."""
        with self._lock:
            return list(self._steps)

    @property
    def stats(self) -> dict[str, int]:
        """Counters: spans outside any sample, steps evicted uncollected, samples dropped over the bound, samples
        still running at the last collect (and in all collects), spans of samples already in a result that
        ended after it (not counted again), and samples of a collected step forgotten before a later collect
        of the step (evicted)."""
        with self._lock:
            open_dropped = sum(rows.dropped for rows in self._steps.values())
            return {
                "spans_outside_sample": self._outside,
                "steps_evicted": self._evicted,
                "samples_dropped": self._dropped_closed + open_dropped,
                "samples_in_flight": self._last_in_flight,
                "samples_in_flight_total": self._in_flight_total,
                "spans_after_collect": self._late,
                "late_samples_evicted": self._late_evicted,
            }
