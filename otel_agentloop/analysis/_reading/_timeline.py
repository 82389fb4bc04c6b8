"""Keep each sample's spans of the current steps, to draw a waterfall without a backend."""

from __future__ import annotations

import threading

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from ... import semconv as sc
from ...config._fork import after_fork_in_child
from ...core._guard import internal_error
from ...metrics._records import SpanRecord

SampleKey = tuple[int, int]


class TimelineRecorder(SpanProcessor):
    """Records sample and phase spans per (step, validate) and per sample; bounded by ``max_spans_per_step``
    (spans past it are counted in ``dropped``) and ``max_steps`` (oldest evicted). :meth:`pop` releases a step.
    """

    def __init__(self, *, max_spans_per_step: int = 200_000, max_steps: int = 4) -> None:
        self.max_spans_per_step = max_spans_per_step
        self.max_steps = max_steps
        self._steps: dict[sc.StepKey, dict[SampleKey, list[SpanRecord]]] = {}
        self._counts: dict[sc.StepKey, int] = {}
        self._lock = threading.Lock()
        self.dropped = 0
        after_fork_in_child(self, "_after_fork")

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # a lock held by another thread at fork is never inherited held

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        try:
            attrs = span.attributes or {}
            index = attrs.get(sc.RL_SAMPLE_INDEX)
            if not isinstance(index, int):
                return
            rollout = attrs.get(sc.RL_ROLLOUT_N)
            step_key = sc.step_key(attrs)
            record = SpanRecord.from_span(span)
            with self._lock:
                samples = self._steps.get(step_key)
                if samples is None:
                    while len(self._steps) >= self.max_steps:
                        evicted = next(iter(self._steps))
                        del self._steps[evicted]
                        self._counts.pop(evicted, None)
                    samples = self._steps[step_key] = {}
                count = self._counts.get(step_key, 0)
                if count >= self.max_spans_per_step:
                    self.dropped += 1
                    return
                self._counts[step_key] = count + 1
                samples.setdefault((index, rollout if isinstance(rollout, int) else -1), []).append(record)
        except Exception:
            internal_error("TimelineRecorder.on_end")

    def pop(self, step: int | None, validate: bool = False) -> dict[SampleKey, list[SpanRecord]]:
        """All recorded spans of ``step`` by (sample_index, rollout_n), releasing them."""
        with self._lock:
            self._counts.pop((step, validate), None)
            return self._steps.pop((step, validate), {})

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
