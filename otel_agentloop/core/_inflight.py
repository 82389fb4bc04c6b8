"""In-flight samples: which samples of this process are running now, in which phase, since when.

:class:`InflightRegistry` is fed by the one span lifecycle the library's spans go through, with values that
lifecycle already holds, so it never reads a span's attributes back. ``sample()`` calls
:meth:`~InflightRegistry.sample_started` and :meth:`~InflightRegistry.sample_ended` around its ``rl.sample``
root span; every phase span started below a tracked sample (``phase``/``trace_*`` wrappers, ``span``, the verl
integration) calls :meth:`~InflightRegistry.phase_started` with the phase and tool decided when it was
decorated, and :meth:`~InflightRegistry.phase_ended` once it has ended (``_lifecycle``). Phase spans are
keyed by their scope object. Both are O(1), take no lock for phase spans (single dict operations are atomic
under the GIL; readers copy a dict before iterating it) and never raise. It is no span processor: nothing runs
for spans it does not track, and spans started straight through an OpenTelemetry tracer are not tracked.

Bounded: at most ``max_samples`` samples (the oldest is evicted, counted) and ``4 * max_samples`` open phase
spans (more are not tracked, counted). Ended phase and sample spans are queued (bounded, drops counted) for
the background thread (:mod:`~otel_agentloop.health._watchdog`) that turns them into metrics off the hot path.
After ``fork`` the child starts empty with a fresh lock (a forked child runs none of its parent's spans).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from opentelemetry import trace

from ..config._fork import after_fork_in_child
from ..semconv import SAMPLE_SPAN
from ._guard import internal_error
from ._record import span_ids
from ._scope import OpenSpan, TrackedSample, span_of

_GONE = object()

NO_PHASE = "other"
"""The phase reported for a sample with no phase span open (between turns, or in untraced code)."""


class OpenPhase(NamedTuple):
    """An open phase span of a tracked sample, as :meth:`InflightRegistry.overdue` reports it.
    ``start_mono_ns``: its start on the monotonic clock (``time.monotonic_ns``), never the wall clock, so its
    age is right whatever the wall clock does."""

    sample: TrackedSample
    phase: str
    tool: str | None
    start_mono_ns: int


class InflightSample(NamedTuple):
    """One running sample as seen at snapshot time (picklable: it crosses Ray).

    ``phase`` is the phase of the most recently started open phase span (``"other"`` when none is open) and
    ``tool`` its ``gen_ai.tool.name``; ages are seconds up to the snapshot, on the monotonic clock.
    ``overdue``: the watchdog has reported this sample.
    """

    step: int | None
    validate: bool
    sample_index: int | None
    rollout_n: int | None
    phase: str
    tool: str | None
    phase_age_s: float
    sample_age_s: float
    trace_id: str
    span_id: str
    overdue: bool
    worker: str | None
    pid: int

    def label(self) -> str:
        """``"sample 3/1 (step 2)"``: how logs and the live view name the sample."""
        rollout = "" if self.rollout_n is None else f"/{self.rollout_n}"
        step = "" if self.step is None else f" (step {self.step}{', validation' if self.validate else ''})"
        return f"sample {self.sample_index}{rollout}{step}"


class InflightRegistry:
    """Tracks every running sample of this process and its open phase spans; see the module docstring.

    ``keep_ended``: queue ended phase/sample spans (``(record, span)`` pairs) for :meth:`drain` (the library's
    metrics need the spans). ``learn``: keep the durations (ns) of the last ``window`` ended phase spans per
    (phase, tool) in :attr:`durations` (the watchdog's learned thresholds), appended in :meth:`phase_ended`.

    The protocol with the span lifecycle is :class:`~otel_agentloop.core._scope.OpenSpan`'s typed fields
    (``sample``, ``phase``, ``tool``, ``start_mono``, ``window``, ``tracked``), written by
    :meth:`phase_started` and read here; open phase spans are the keys of ``_phases``, oldest first.
    """

    def __init__(
        self,
        *,
        max_samples: int = 65_536,
        keep_ended: bool = True,
        max_ended: int = 65_536,
        learn: bool = True,
        window: int = 2048,
    ) -> None:
        if max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, not {max_samples}")
        self.max_samples = max_samples
        self.max_phases = 4 * max_samples
        self.keep_ended = keep_ended
        self.max_ended = max_ended
        self.learn = learn
        self.window = window
        self.pid = os.getpid()
        self._init_state()
        after_fork_in_child(self, "_after_fork")

    def _after_fork(self) -> None:
        """A forked child tracks none of its parent's samples (phases started in the child are not tracked)."""
        for sample in list(self._samples.values()):
            sample.tracked = False
        self._init_state()
        self.pid = os.getpid()

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._samples: dict[int, TrackedSample] = {}  # by span id, in start order
        self._phases: dict[OpenSpan, None] = {}  # open phase spans, in start order
        self._ended: deque[tuple[str | None, trace.Span]] = deque()  # (phase, ended span of either path)
        self.durations: dict[tuple[str, str | None], deque[int]] = {}
        """Recent phase durations in ns per (phase, tool): bounded deques (``learn``)."""
        self.samples_evicted = 0
        self.phases_untracked = 0
        self.ended_dropped = 0

    # -- fed by the span lifecycle (_context.sample, _phase) --------------------------------------
    def sample_started(self, span: trace.Span, attrs: Mapping[str, Any], start_mono_ns: int) -> TrackedSample | None:
        """Track the ``rl.sample`` root ``span`` (``_context`` starts it) that started with ``attrs`` at
        ``start_mono_ns`` (``time.monotonic_ns``); the record to hand to :meth:`phase_started` and
        :meth:`sample_ended`, or ``None`` when the span is not recorded. Never raises."""
        try:
            ids = span_ids(span) if span.is_recording() else None
            if ids is None:
                return None
            sample = TrackedSample(
                self, attrs, SAMPLE_SPAN, *ids[:3], getattr(span, "start_time", None) or 0, start_mono_ns
            )
            with self._lock:
                samples = self._samples
                while len(samples) >= self.max_samples:
                    old = samples.pop(next(iter(samples)))
                    old.tracked = False
                    for phase in [p for p in self._phases if p.sample is old]:
                        self._phases.pop(phase, None)
                    self.samples_evicted += 1
                samples[sample.span_id] = sample
            return sample
        except Exception:
            internal_error("InflightRegistry.sample_started")
            return None

    def sample_ended(self, sample: TrackedSample, span: trace.Span) -> None:
        """``sample``'s root span has ended. Never raises."""
        try:
            if sample.tracked:
                sample.tracked = False
                self._samples.pop(sample.span_id, None)
                sample.ended = True
                if self.keep_ended:
                    self.queue_ended(None, span)
        except Exception:
            internal_error("InflightRegistry.sample_ended")

    def phase_started(self, span: OpenSpan, sample: TrackedSample, phase: str, tool: str | None) -> None:
        """Track ``span``, an open phase span of ``sample`` (its ``start_mono``: ``time.monotonic_ns`` at its
        start), with its phase and tool; sets ``span.tracked`` to this registry. Not tracked when ``sample`` no
        longer is here (ended, evicted, or tracked before a ``fork``) or the bound is reached (counted).
        Lock-free, O(1); the caller guards it."""
        if not sample.tracked:
            return
        phases = self._phases
        if len(phases) >= self.max_phases:
            self.phases_untracked += 1
            return
        span.sample, span.phase, span.tool = sample, phase, tool
        if self.learn:
            key = (phase, tool)
            span.window = self.durations.get(key) or self.window_for(key)
        phases[span] = None  # insertion-ordered: oldest first
        span.tracked = self

    def phase_ended(self, span: OpenSpan) -> None:
        """``span`` (tracked by :meth:`phase_started`) has ended: forget it, learn its duration (end - start:
        the library ends its spans on the monotonic clock, or at a duration measured elsewhere). Never
        raises."""
        try:
            span.tracked = None
            if self._phases.pop(span, _GONE) is _GONE:
                return  # evicted with its sample, or tracked before a fork
            if span.window is not None:
                span.window.append(span.duration_ns())
            if self.keep_ended:
                self.queue_ended(span.phase, span_of(span))
        except Exception:
            internal_error("InflightRegistry.phase_ended")

    def window_for(self, key: tuple[str, str | None]) -> deque[int]:
        """The duration window of ``key`` (phase, tool), made on first use."""
        window = self.durations.get(key)
        if window is None:
            window = self.durations.setdefault(key, deque(maxlen=self.window))
        return window

    def queue_ended(self, phase: str | None, span: trace.Span) -> None:
        """Hand an ended span (a phase span of ``phase``, or a sample's root span: ``None``) to :meth:`drain`,
        bounded."""
        if len(self._ended) < self.max_ended:
            self._ended.append((phase, span))
        else:
            self.ended_dropped += 1

    # -- reading (background thread, snapshot API) -----------------------------------------------
    def drain(self) -> list[tuple[str | None, trace.Span]]:
        """Take the ended spans queued so far: ``(phase, span)``, ``phase`` ``None`` for a sample's root."""
        ended = self._ended
        return [ended.popleft() for _ in range(len(ended))]

    def _current(self) -> dict[int, OpenSpan]:
        """The most recently started open phase of each sample (by the sample's span id)."""
        latest: dict[int, OpenSpan] = {}
        for span in list(self._phases):  # start order: later entries win
            sample = span.sample  # set by phase_started for every key of _phases
            if sample is not None:
                latest[sample.span_id] = span
        return latest

    def __len__(self) -> int:
        return len(self._samples)

    def snapshot(self, limit: int | None = None, now_ns: int | None = None) -> list[InflightSample]:
        """Running samples, oldest first (at most ``limit``), aged up to ``now_ns`` (``time.monotonic_ns()``)."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        samples = list(self._samples.values())
        if limit is not None:
            samples = samples[:limit]
        current = self._current()
        return [self._describe(s, current.get(s.span_id), now) for s in samples]

    def _describe(self, s: TrackedSample, cur: OpenSpan | None, now: int) -> InflightSample:
        return InflightSample(
            step=s.step,
            validate=s.validate,
            sample_index=s.index,
            rollout_n=s.rollout,
            phase=cur.phase or NO_PHASE if cur is not None else NO_PHASE,
            tool=cur.tool if cur is not None else None,
            phase_age_s=(now - (cur.start_mono if cur is not None else s.start_mono_ns)) / 1e9,
            sample_age_s=(now - s.start_mono_ns) / 1e9,
            trace_id=format(s.trace_id, "032x"),
            span_id=format(s.span_id, "016x"),
            overdue=s.tripped,
            worker=s.worker,
            pid=self.pid,
        )

    def counts(self, now_ns: int | None = None) -> tuple[dict[str, int], float]:
        """(running samples by current phase, age in seconds of the oldest running sample, 0 when none), up to
        ``now_ns`` (``time.monotonic_ns()``)."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        samples = list(self._samples.values())
        current = self._current()
        by_phase: dict[str, int] = {}
        for sample in samples:
            cur = current.get(sample.span_id)
            key = (cur.phase or NO_PHASE) if cur is not None else NO_PHASE
            by_phase[key] = by_phase.get(key, 0) + 1
        return by_phase, ((now - samples[0].start_mono_ns) / 1e9 if samples else 0.0)

    def overdue(
        self, now_ns: int, thresholds: Callable[[str, str | None], int], min_threshold_ns: int
    ) -> list[tuple[OpenPhase, int]]:
        """Open phase spans whose age at ``now_ns`` (``time.monotonic_ns()``) reached ``thresholds(phase, tool)``
        (ns), of samples not reported before; their samples are marked reported. Phases are visited oldest
        first and the scan stops at the first younger than ``min_threshold_ns``: O(candidates), not
        O(in-flight)."""
        found: list[tuple[OpenPhase, int]] = []
        for span in list(self._phases):
            sample, phase, tool, start = span.sample, span.phase, span.tool, span.start_mono
            age = now_ns - start
            if age < min_threshold_ns:
                break
            if sample is None or phase is None or sample.tripped or sample.ended:  # (never None once tracked)
                continue
            if age >= thresholds(phase, tool):
                sample.tripped = True
                found.append((OpenPhase(sample, phase or NO_PHASE, tool, start), age))
        return found

    @property
    def stats(self) -> dict[str, int]:
        return {
            "inflight_samples": len(self._samples),
            "inflight_samples_evicted": self.samples_evicted,
            "inflight_phases_untracked": self.phases_untracked,
            "inflight_ended_dropped": self.ended_dropped,
        }
