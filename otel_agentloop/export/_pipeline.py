"""The export pipeline: every ended span leaves the training thread here, as one type, the record.

:class:`RecordPipeline` owns the record queue (bounded: ``max_queue``). The fast path's recorder
(``core._recorder``) puts its ended records there, and the SDK spans the provider makes (``fast_path=False``, a
user's tracer on the library's provider) are queued as they are by :class:`_SdkDoor`, a cheap append on the
thread that ended them. One thread (``otel_agentloop.pipeline``) drains the queue in order: each item is
admitted as a record (``core._door.admit``: a record's limits applied, an SDK span adapted), then handed to the
provider's processors, in the order they were added: one list. The library's processors
(``core._door.RecordProcessor``: the metrics, the keeper, the export processors) take the record; any other
processor (a user's) sits behind one ``core._door.Foreign``, at its place. A record reaches those as a real SDK
span built from it (``materialise``): their ``on_start`` runs first, before any processor's ``on_end``, in the
context the span started in, and what it changes (attributes, events, links, status, name) is folded back into
the record: the library's processors and every exporter see one span, as on the SDK path. An SDK span reaches
them as it is, at its start and end, on the thread that made it (as the SDK's provider runs them).

The queue is drained every ``interval_s``, or when it holds ``batch`` items, or ``sdk_batch`` when an SDK span
joins it (an ended SDK span holds a dozen objects the garbage collector walks, a record two: waiting for the
timer, thousands of them would make every collection on the training thread slower); when it is full, the thread that
ends a span drains it itself (``drain``: the metrics stay exact, the exporters' own bounded queues drop and
count what they cannot take); after shutdown (``closed``) sampled spans are counted in ``dropped``, start
markers never. Until the pipeline takes them, the queued sampled spans are ``pending`` (:meth:`waiting`).

:class:`PipelineProvider` is the SDK provider ``configure()`` builds: a processor added to it (also later,
``handle.provider.add_span_processor(p)``) joins the pipeline's list and receives every span, and its
``force_flush``/``shutdown`` drain the pipeline first. A collect drains it too (the metrics are exact when
``collect()`` returns).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, TypedDict

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace.sampling import Sampler

from ..config._fork import after_fork_in_child
from ..core._door import Foreign, RecordProcessor, admit, sampled
from ..core._guard import internal_error
from ..core._record import FastSpan, Queued
from ..core._recorder import START, Recorder
from ..metrics._hooks import StepHooks
from ..semconv import SAMPLE_SPAN

if TYPE_CHECKING:
    from typing_extensions import Unpack


class RecordPipeline(StepHooks):
    """Owns the record queue and drains it into the processors (see the module docstring). ``interval_s``: the
    longest a span waits when fewer than ``batch`` (``sdk_batch`` once an SDK span is queued) are queued. As the
    metrics' hooks (``add_hooks``, first), it drains before a step is read."""

    def __init__(self, interval_s: float = 1.0, max_queue: int = 2048, batch: int = 512, sdk_batch: int = 512) -> None:
        self.interval_s = max(0.01, min(interval_s, 1.0))
        self.max_queue = max_queue
        self.batch = max(1, min(batch, max_queue))  # wake the thread at this many queued spans
        self.sdk_batch = max(1, min(sdk_batch, self.batch))  # ... or this many, when an SDK span joins them
        self.foreign = Foreign()
        self.processors: list[RecordProcessor] = []  # in the order added; the foreign ones behind one, at its place
        self.recorders: list[Recorder] = []  # the fast path's: told to keep start contexts
        self.closed = False
        self._stopping = False
        self._init_state()
        after_fork_in_child(self, "_init_state")

    def _init_state(self) -> None:
        """An empty queue (a forked child exports none of its parent's spans), a fresh lock and thread."""
        self.queue: deque[Queued] = deque()
        self.dropped = 0
        self.lock = threading.RLock()  # held by whoever drains the queue (the thread, a collect, an overflow)
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otel_agentloop.pipeline", daemon=True)
        if not self._stopping:
            self._thread.start()

    def add(self, processor: SpanProcessor) -> None:
        """Hand every span to ``processor`` too (after those added before it)."""
        if isinstance(processor, RecordProcessor):
            self.processors.append(processor)
            return
        if not self.foreign.processors:
            self.processors.append(self.foreign)
        self.foreign.processors.append(processor)
        for recorder in self.recorders:
            recorder.keep_context = True  # a foreign on_start reads the context a span started in (baggage)

    def attach(self, recorder: Recorder) -> None:
        """``recorder`` queues its records here (``put``)."""
        self.recorders.append(recorder)
        recorder.keep_context = bool(self.foreign.processors)

    # -- the queue -------------------------------------------------------------------------------------
    def put(self, item: Queued) -> None:
        """Queue an ended span (a record or an SDK span) or a ``(START, span)`` pair. When full or closed it is
        lost: a sampled span is counted in :attr:`dropped`, a start marker never (it is not a span)."""
        queue = self.queue
        if self.closed:
            self._lost(item)
            return
        if len(queue) >= self.max_queue:
            try:
                self.drain()
            except Exception:
                internal_error("pipeline.overflow")
            if len(queue) >= self.max_queue:
                self._lost(item)
                return
        queue.append(item)
        if len(queue) == self.batch:
            self._wake.set()

    def put_sdk(self, item: Queued) -> None:
        """:meth:`put` for an SDK span (or its start marker): the thread is woken at ``sdk_batch`` queued items."""
        self.put(item)
        if len(self.queue) >= self.sdk_batch and not self._wake.is_set():
            self._wake.set()

    def _lost(self, item: Queued) -> None:
        if _counted(item):
            self.dropped += 1

    def waiting(self) -> int:
        """The sampled spans queued here, not yet handed to the exporters (start markers are not spans). Exact
        while the caller holds :attr:`lock` and no other thread ends a span: a drained batch is handed over
        under that lock, so no span is between the queue and the exporters then."""
        return sum(1 for item in list(self.queue) if _counted(item))

    # -- draining --------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            try:
                self.drain()
            except Exception:
                internal_error("RecordPipeline.run")

    def drain(self) -> int:
        """Process everything queued so far, in order, on the calling thread; the number of items."""
        with self.lock:
            queue = self.queue
            items = [queue.popleft() for _ in range(len(queue))]
            for item in items:
                try:
                    if isinstance(item, tuple):
                        self._started(admit(item[1]))
                    else:
                        self._ended(admit(item))
                except Exception:
                    internal_error("RecordPipeline.process")
        return len(items)

    def _started(self, span: FastSpan) -> None:
        for p in self.processors:
            p.record_start(span)

    def _ended(self, span: FastSpan) -> None:
        if self.foreign.processors and not span.adapted:  # an adapted SDK span reached them as it was
            try:
                self.foreign.start(span)  # before any on_end: every processor and exporter sees the edits
            except Exception:  # the span still reaches the metrics and the library's exporters
                internal_error("RecordPipeline.foreign")
        for p in self.processors:
            p.record_end(span)

    def step_reading(self, step: int | None, validate: bool) -> None:
        self.drain()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Drain, then flush the processors in order within ``timeout_millis`` in all, as the SDK's provider
        does: ``False`` at the first that fails or when time runs out."""
        self.drain()
        deadline = time.monotonic_ns() + int(timeout_millis * 1_000_000)
        for p in self.processors:
            now = time.monotonic_ns()
            if now >= deadline or not p.force_flush((deadline - now) // 1_000_000):
                return False
        return True

    def shutdown(self) -> None:
        """Process what is queued and stop the thread (spans ending later are counted as dropped)."""
        self._stopping = True
        self.closed = True
        self._wake.set()
        self.drain()

    def shutdown_processors(self) -> None:
        """Shut every processor down, in order (the provider's shutdown, after :meth:`shutdown`)."""
        for p in self.processors:
            try:
                p.shutdown()
            except Exception:
                internal_error(f"{type(p).__name__}.shutdown")


def _counted(item: Queued) -> bool:
    """Whether a queued item counts as a span, as an export processor counts them: a sampled span (a start
    marker is not a span)."""
    return not isinstance(item, tuple) and sampled(item)


class _SdkDoor(SpanProcessor):
    """The one processor of the SDK's own composite: the SDK spans the provider makes run the foreign
    processors as they are, then join the record queue (adapted into records on the pipeline's thread). A
    sample's root span is announced when it starts, as the fast path announces it (``core._lifecycle``)."""

    def __init__(self, pipeline: RecordPipeline) -> None:
        self.pipeline = pipeline

    def on_start(self, span: SdkSpan, parent_context: Context | None = None) -> None:
        pipeline = self.pipeline
        if pipeline.foreign.processors:
            pipeline.foreign.sdk_start(span, parent_context)
        if span.name == SAMPLE_SPAN:
            pipeline.put_sdk((START, span))

    def on_end(self, span: ReadableSpan) -> None:
        pipeline = self.pipeline
        if pipeline.foreign.processors:
            pipeline.foreign.sdk_end(span)
        pipeline.put_sdk(span)


class ProviderArguments(TypedDict, total=False):
    """The SDK ``TracerProvider``'s arguments a :class:`PipelineProvider` passes on."""

    resource: Resource
    sampler: Sampler
    span_limits: SpanLimits
    shutdown_on_exit: bool


class PipelineProvider(TracerProvider):
    """The SDK ``TracerProvider`` ``configure()`` builds (see the module docstring): its processors are its
    pipeline's."""

    def __init__(self, pipeline: RecordPipeline, **kw: Unpack[ProviderArguments]) -> None:
        super().__init__(**kw)
        self.pipeline = pipeline
        super().add_span_processor(_SdkDoor(pipeline))

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        self.pipeline.add(span_processor)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.pipeline.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.pipeline.shutdown()
        self.pipeline.shutdown_processors()
        super().shutdown()
