"""Keep what matters: export the slowest and the failed samples even when the budget skipped them.

Record-only spans of a sample are buffered until the sample's root span ends. Then a sample with an error
anywhere is exported at once; the others compete for the ``keep_slowest`` places of their step (by
generate + tool + score time, as verl ranks samples), and the winners are exported when the step closes.
So the step's slowest sample is exported (within budget, as a failure, or as the slowest of the rest)
unless its buffer spilled. A step closes when its ``rl.step`` span ends here, its metrics are taken, or it
is the oldest of too many open steps. Buffers are bounded in spans and bytes: past either bound a
sample's buffer is spilled (discarded) and counted, never grown.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence

from opentelemetry.trace import StatusCode

from .. import semconv as sc
from ..config._fork import after_fork_in_child
from ..core._door import RecordProcessor
from ..core._guard import internal_error
from ..core._record import FastSpan
from ..metrics._accumulate import PHASE_INDEX, add_interval
from ..metrics._hooks import StepHooks
from ._processor import ExportProcessor, timeout_s

_BASE_BYTES = 256  # rough fixed cost of a span, on top of its string attributes


def _size(span: FastSpan) -> int:
    size = _BASE_BYTES + len(span.name)
    for value in (span.attributes or {}).values():
        if isinstance(value, str):
            size += len(value)
    return size


class _Buffer:
    __slots__ = ("blocks", "bytes", "error", "spans", "spilled", "totals")

    def __init__(self) -> None:
        self.spans: list[FastSpan] = []
        self.bytes = 0
        self.error = False
        self.blocks: list[list[int]] = [[], [], []]
        self.totals = [0, 0, 0]
        self.spilled = False


class SampleKeeper(RecordProcessor, StepHooks):
    """Forwards sampled spans to ``exporters`` and decides the fate of record-only samples (see module doc).

    A span processor of the provider (after the metrics processor) and a :class:`StepHooks` of the metrics
    processor: a step's release (its metrics taken) closes the step here (``step_released``)."""

    def __init__(
        self,
        exporters: Sequence[ExportProcessor],
        *,
        keep_slowest: int = 5,
        keep_errors: bool = True,
        max_buffered_spans: int = 50_000,
        max_buffered_bytes: int = 64 << 20,
        max_open_steps: int = 4,
    ) -> None:
        if keep_slowest < 0 or max_buffered_spans < 0 or max_buffered_bytes < 0:
            raise ValueError("keep_slowest and the buffer bounds must be >= 0")
        self.exporters = tuple(exporters)
        self.keep_slowest = keep_slowest
        self.keep_errors = keep_errors
        self.max_buffered_spans = max_buffered_spans
        self.max_buffered_bytes = max_buffered_bytes
        self.max_open_steps = max_open_steps
        self._buffers: dict[tuple[object, ...], _Buffer] = {}
        self._heaps: OrderedDict[sc.StepKey, list[tuple[int, int, _Buffer]]] = OrderedDict()
        self._seq = itertools.count()
        self._spans = 0
        self._bytes = 0
        self._lock = threading.Lock()
        after_fork_in_child(self, "_after_fork")
        self.counters = {"kept_slowest": 0, "kept_errors": 0, "samples_not_kept": 0, "samples_spilled": 0}

    def _after_fork(self) -> None:
        """A forked child starts with no buffers (the parent's stay with the parent) and a fresh lock."""
        self._lock = threading.Lock()
        self._buffers = {}
        self._heaps = OrderedDict()
        self._spans = self._bytes = 0

    def _forward(self, spans: Sequence[FastSpan]) -> None:
        for exporter in self.exporters:
            for span in spans:
                exporter.enqueue(span)

    def record_end(self, span: FastSpan) -> None:
        if span.flags & 1:
            for exporter in self.exporters:
                exporter.record_end(span)
            if span.name == sc.STEP_SPAN:
                self._close_from(span)
            return
        try:
            self._buffer(span)
        except Exception:
            internal_error("SampleKeeper.on_end")

    def _close_from(self, span: FastSpan) -> None:
        self.close_step(*sc.step_key(span.attributes or {}))

    def _buffer(self, span: FastSpan) -> None:
        attrs = span.attributes or {}
        if span.name == sc.STEP_SPAN:
            self._close_from(span)
            return
        index = attrs.get(sc.RL_SAMPLE_INDEX)
        if not isinstance(index, int):
            return  # record-only and outside any sample: not ours to keep
        step_key = sc.step_key(attrs)
        key = (*step_key, index, attrs.get(sc.RL_ROLLOUT_N))
        release: list[FastSpan] = []
        with self._lock:
            buf = self._buffers.get(key)
            if buf is None:
                buf = self._buffers[key] = _Buffer()
            if not buf.spilled:
                size = _size(span)
                if self._spans + 1 > self.max_buffered_spans or self._bytes + size > self.max_buffered_bytes:
                    self._spill(buf)
                else:
                    buf.spans.append(span)
                    buf.bytes += size
                    self._spans += 1
                    self._bytes += size
            if span.status.status_code is StatusCode.ERROR:
                buf.error = True
            p = PHASE_INDEX.get(attrs.get(sc.RL_PHASE))
            if p is not None and span.end_ns:
                buf.totals[p] += add_interval(buf.blocks[p], span.start_ns, span.end_ns)
            if span.name != sc.SAMPLE_SPAN:
                return
            del self._buffers[key]  # the root ended: the sample's fate is known
            if buf.spilled:
                return
            if buf.error and self.keep_errors:
                self.counters["kept_errors"] += 1
                release = self._release(buf)
            elif self.keep_slowest:
                heap = self._heaps.get(step_key)
                if heap is None:
                    while len(self._heaps) >= self.max_open_steps:
                        release += self._close_locked(next(iter(self._heaps)))
                    heap = self._heaps[step_key] = []
                heapq.heappush(heap, (sum(buf.totals), next(self._seq), buf))
                if len(heap) > self.keep_slowest:
                    self._drop(heapq.heappop(heap)[2])
            else:
                self._drop(buf)
        if release:
            self._forward(release)

    def _spill(self, buf: _Buffer) -> None:
        self.counters["samples_spilled"] += 1
        self._spans -= len(buf.spans)
        self._bytes -= buf.bytes
        buf.spans, buf.bytes, buf.spilled = [], 0, True

    def _drop(self, buf: _Buffer) -> None:
        self.counters["samples_not_kept"] += 1
        self._release(buf)

    def _release(self, buf: _Buffer) -> list[FastSpan]:
        self._spans -= len(buf.spans)
        self._bytes -= buf.bytes
        spans, buf.spans, buf.bytes = buf.spans, [], 0
        return spans

    def _close_locked(self, step_key: sc.StepKey) -> list[FastSpan]:
        out: list[FastSpan] = []
        for _, _, buf in self._heaps.pop(step_key, []):
            self.counters["kept_slowest"] += 1
            out += self._release(buf)
        for key in [k for k in self._buffers if k[:2] == step_key]:  # samples whose root never ended
            self._drop(self._buffers.pop(key))
        return out

    def close_step(self, step: int | None, validate: bool = False) -> None:
        """Export the kept samples of a step and free its buffers (idempotent)."""
        with self._lock:
            release = self._close_locked((step, validate))
        if release:
            self._forward(release)

    def step_released(self, step: int | None, validate: bool) -> None:
        """The step's metrics were taken: close it (:meth:`close_step`)."""
        self.close_step(step, validate)

    def shutdown(self, timeout_millis: float | None = None) -> None:
        """Export every kept sample still waiting for its step to close, then shut the exporters down within
        ``timeout_millis`` in total (default, or NaN: each exporter's own ``shutdown_timeout_s``; bounded as
        :func:`~._processor.timeout_s` bounds it)."""
        with self._lock:
            release = [span for key in list(self._heaps) for span in self._close_locked(key)]
        self._forward(release)
        wait_s = timeout_s(timeout_millis, math.nan, 1e-3)
        deadline = None if math.isnan(wait_s) else time.monotonic() + wait_s
        for exporter in self.exporters:
            if deadline is None:
                exporter.shutdown()
            else:
                exporter.shutdown(max(int((deadline - time.monotonic()) * 1000), 0))

    def force_flush(self, timeout_millis: float = 30000) -> bool:
        """Flush the exporters (kept samples of open steps wait for their step to close)."""
        deadline = time.monotonic() + timeout_s(timeout_millis, 30.0, 1e-3)
        ok = True
        for exporter in self.exporters:
            remaining_ms = max(int((deadline - time.monotonic()) * 1000), 0)
            ok = exporter.force_flush(remaining_ms) and ok
        return ok

    @property
    def stats(self) -> dict[str, int]:
        with self._lock:
            return {**self.counters, "buffered_spans": self._spans, "buffered_bytes": self._bytes}
