"""In-flight samples: which samples of this process are running now, in which phase, since when.

:class:`InflightRegistry` is fed by the one span lifecycle the library's spans go through, with values that
lifecycle already holds, so it never reads a span's attributes back. ``sample()`` calls
:meth:`~InflightRegistry.sample_started` and :meth:`~InflightRegistry.sample_ended` around its ``rl.sample``
root span; every phase span started below a tracked sample (``phase``/``trace_*`` wrappers, ``span``, the verl
integration) calls :meth:`~InflightRegistry.phase_started` with the phase and tool decided when it was
decorated, and :meth:`~InflightRegistry.phase_ended` once it has ended (``_phase.SpanScope``). Phase spans are
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
import weakref
from collections import deque
from collections.abc import Mapping
from typing import Any, NamedTuple

from opentelemetry.sdk.trace import ReadableSpan

from .. import semconv as sc
from ._guard import internal_error

NO_PHASE = "other"
"""The phase reported for a sample with no phase span open (between turns, or in untraced code)."""


class _Sample:
    """A running sample (fields written once at start, ``tripped``/``ended``/``tracked`` flags later).

    ``tracked``: still in its registry (not ended, evicted, or inherited across a ``fork``)."""

    __slots__ = (
        "ended",
        "index",
        "name",
        "registry",
        "rollout",
        "span_id",
        "start_mono_ns",
        "start_ns",
        "step",
        "trace_flags",
        "trace_id",
        "tracked",
        "tripped",
        "validate",
        "worker",
    )

    def __init__(
        self,
        registry: InflightRegistry,
        attrs: Any,
        name: str,
        trace_id: int,
        span_id: int,
        trace_flags: int,
        start_ns: int,
        start_mono_ns: int,
    ) -> None:
        self.registry = registry
        get = attrs.get
        self.step: int | None = get(sc.RL_STEP)
        self.validate = get(sc.RL_VALIDATE) is True
        self.index: int | None = get(sc.RL_SAMPLE_INDEX)
        self.rollout: int | None = get(sc.RL_ROLLOUT_N)
        self.worker: str | None = get(sc.RL_WORKER)
        self.name = name
        self.trace_id = trace_id
        self.span_id = span_id
        self.trace_flags = trace_flags
        self.start_ns = start_ns  # the root span's start: wall clock, ns since the epoch
        self.start_mono_ns = start_mono_ns  # the same instant on the monotonic clock: ages are measured from it
        self.tripped = False
        self.ended = False
        self.tracked = True


class OpenPhase(NamedTuple):
    """An open phase span of a tracked sample. The hot path stores plain tuples of these four fields (and the
    duration window of its (phase, tool)). ``start_mono_ns``: its start on the monotonic clock
    (``time.monotonic_ns``), never the wall clock, so its age is right whatever the wall clock does."""

    sample: _Sample
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

    Hot path: a decorated phase (``_phase.PhaseBegin.begin`` and ``SpanScope.exit``) does the work of
    :meth:`phase_started` and :meth:`phase_ended` inline, because the two calls alone cost about 0.7 % of a
    decorated phase here (``bench/inflight.py``). Keep them in step: ``_phases[scope] = (sample, phase, tool,
    start_mono_ns, window)`` while fewer than ``max_phases`` are open (else count ``phases_untracked``), with
    ``window = durations[(phase, tool)]`` (:meth:`window_for`) when ``learn``; at the end pop it, append the
    duration to its window and, when ``keep_ended``, :meth:`queue_ended` it.
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
        ref = weakref.ref(self)

        def after_fork() -> None:
            registry = ref()
            if registry is not None:
                for sample in list(registry._samples.values()):
                    sample.tracked = False  # the parent's: phases started in the child are not tracked
                registry._init_state()
                registry.pid = os.getpid()

        os.register_at_fork(after_in_child=after_fork)

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._samples: dict[int, _Sample] = {}  # by span id, in start order
        self._phases: dict[object, tuple[Any, ...]] = {}  # by scope, in start order: OpenPhase fields, window
        self._ended: deque[tuple[Any, ReadableSpan]] = deque()
        self.durations: dict[tuple[str, str | None], deque[int]] = {}
        """Recent phase durations in ns per (phase, tool): bounded deques (``learn``)."""
        self.samples_evicted = 0
        self.phases_untracked = 0
        self.ended_dropped = 0

    # -- fed by the span lifecycle (_context.sample, _phase) --------------------------------------
    def sample_started(self, span: Any, attrs: Mapping[str, Any], start_mono_ns: int) -> _Sample | None:
        """Track the ``rl.sample`` root ``span`` that started with ``attrs`` at ``start_mono_ns``
        (``time.monotonic_ns``); the record to hand to :meth:`phase_started` and :meth:`sample_ended`, or
        ``None`` when the span is not recorded. Never raises."""
        try:
            if not span.is_recording():
                return None
            ctx = span.get_span_context()
            try:
                start = span._start_time
            except AttributeError:
                start = getattr(span, "start_time", None)
            sample = _Sample(
                self, attrs, span.name, ctx.trace_id, ctx.span_id, int(ctx.trace_flags), start or 0, start_mono_ns
            )
            with self._lock:
                samples = self._samples
                while len(samples) >= self.max_samples:
                    old = samples.pop(next(iter(samples)))
                    old.tracked = False
                    for key, rec in list(self._phases.items()):
                        if rec[0] is old:
                            self._phases.pop(key, None)
                    self.samples_evicted += 1
                samples[sample.span_id] = sample
            return sample
        except Exception:
            internal_error("InflightRegistry.sample_started")
            return None

    def sample_ended(self, sample: _Sample, span: Any) -> None:
        """``sample``'s root span has ended. Never raises."""
        try:
            if sample.tracked:
                sample.tracked = False
                self._samples.pop(sample.span_id, None)
                sample.ended = True
                if self.keep_ended:
                    self.queue_ended(sample, span)
        except Exception:
            internal_error("InflightRegistry.sample_ended")

    def phase_started(
        self, key: object, sample: _Sample, phase: str, tool: str | None, span: Any, start_mono_ns: int
    ) -> Any:
        """Track ``span``, a phase span of ``sample`` started at ``start_mono_ns`` (``time.monotonic_ns``), under
        ``key`` (its scope); ``self`` when tracked (pass it :meth:`phase_ended` later), ``None`` when not: the
        sample is no longer tracked here (ended, evicted, or tracked before a ``fork``), the span is not an SDK
        span, or the bound is reached (counted). Lock-free, O(1), never raises."""
        try:
            if not sample.tracked:
                return None
            phases = self._phases
            if len(phases) >= self.max_phases:
                self.phases_untracked += 1
                return None
            span._start_time  # noqa: B018 - the SDK's span, or AttributeError: not tracked
            window = self.window_for((phase, tool)) if self.learn else None
            phases[key] = (sample, phase, tool, start_mono_ns, window)
            return self
        except AttributeError:  # not the SDK's span (no start time): not tracked
            return None
        except Exception:
            internal_error("InflightRegistry.phase_started")
            return None

    def phase_ended(self, key: object, span: Any) -> None:
        """The phase span tracked under ``key`` has ended: forget it, learn its duration (its end - start: the
        library ends its spans on the monotonic clock, or at a duration measured elsewhere). Never raises."""
        try:
            rec = self._phases.pop(key, None)  # atomic under the GIL: no lock on the hot path
            if rec is None:
                return  # evicted with its sample, or tracked before a fork
            if rec[4] is not None:
                rec[4].append(span._end_time - span._start_time)
            if self.keep_ended:
                self.queue_ended(rec, span)
        except Exception:
            internal_error("InflightRegistry.phase_ended")

    def window_for(self, key: tuple[str, str | None]) -> deque[int]:
        """The duration window of ``key`` (phase, tool), made on first use."""
        window = self.durations.get(key)
        if window is None:
            window = self.durations.setdefault(key, deque(maxlen=self.window))
        return window

    def queue_ended(self, rec: Any, span: Any) -> None:
        """Hand an ended span to :meth:`drain`, bounded."""
        if len(self._ended) < self.max_ended:
            self._ended.append((rec, span))
        else:
            self.ended_dropped += 1

    # -- reading (background thread, snapshot API) -----------------------------------------------
    def drain(self) -> list[tuple[Any, ReadableSpan]]:
        """Take the ended spans queued so far: ``(record, span)`` with a ``_Sample`` or a phase tuple
        (:class:`OpenPhase`'s fields, then the duration window)."""
        ended = self._ended
        return [ended.popleft() for _ in range(len(ended))]

    def _current(self) -> dict[int, tuple[Any, ...]]:
        """The most recently started open phase of each sample (by the sample's span id)."""
        latest: dict[int, tuple[Any, ...]] = {}
        for rec in list(self._phases.values()):  # start order: later entries win
            latest[rec[0].span_id] = rec
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

    def _describe(self, s: _Sample, cur: tuple[Any, ...] | None, now: int) -> InflightSample:
        return InflightSample(
            step=s.step,
            validate=s.validate,
            sample_index=s.index,
            rollout_n=s.rollout,
            phase=cur[1] if cur is not None else NO_PHASE,
            tool=cur[2] if cur is not None else None,
            phase_age_s=(now - (cur[3] if cur is not None else s.start_mono_ns)) / 1e9,
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
            key = cur[1] if cur is not None else NO_PHASE
            by_phase[key] = by_phase.get(key, 0) + 1
        return by_phase, ((now - samples[0].start_mono_ns) / 1e9 if samples else 0.0)

    def overdue(self, now_ns: int, thresholds: Any, min_threshold_ns: int) -> list[tuple[OpenPhase, int]]:
        """Open phase spans whose age at ``now_ns`` (``time.monotonic_ns()``) reached ``thresholds(phase, tool)``
        (ns), of samples not reported before; their samples are marked reported. Phases are visited oldest
        first and the scan stops at the first younger than ``min_threshold_ns``: O(candidates), not
        O(in-flight)."""
        found: list[tuple[OpenPhase, int]] = []
        for rec in list(self._phases.values()):
            sample, phase, tool, start, _ = rec
            age = now_ns - start
            if age < min_threshold_ns:
                break
            if sample.tripped or sample.ended:
                continue
            if age >= thresholds(phase, tool):
                sample.tripped = True
                found.append((OpenPhase(*rec[:4]), age))
        return found

    @property
    def stats(self) -> dict[str, int]:
        return {
            "inflight_samples": len(self._samples),
            "inflight_samples_evicted": self.samples_evicted,
            "inflight_phases_untracked": self.phases_untracked,
            "inflight_ended_dropped": self.ended_dropped,
        }
