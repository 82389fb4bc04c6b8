"""Where fast-path spans start and end: one :class:`Recorder` per provider ``configure()`` builds.

Start (:meth:`Recorder.start`): a span below one of this recorder's own spans takes its parent's trace and
sampling decision, with no sampler call (what every sampler ``configure()`` installs decides for a span below a
local parent: ``ParentBased`` or the budget sampler, see ``export._sampling``). Any other span (a root, a child
of a user's SDK span or of a remote context) asks the provider's sampler, exactly as ``start_span`` would; if
it answers DROP, the caller falls back to the SDK (a non-recording span).

End (:meth:`Recorder.finish`): the one place a fast-path span ends: error recorded, identity restored if a
count limit evicted anything (``FastSpan.restore_identity``), end time on the span's monotonic timeline, the
in-flight registry told, the span queued. The queue is drained off the hot path by the export pipeline
(``export._pipeline``), which bounds the attributes a span started with, feeds the metrics and hands the spans
to the exporters; ``wake`` is called when it reaches ``batch`` spans. It is bounded (``max_queue``): when it is
full, the span's thread drains it first (``overflow``: the metrics stay exact, the exporters' own bounded queues
drop and count what they cannot take); after shutdown (``closed``) sampled spans are counted in ``dropped``,
start markers never. Until the pipeline takes them, the queued sampled spans are ``pending`` in
``Handle.stats`` (:meth:`waiting`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.context import Context, get_current
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import DEFAULT_ON, Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanKind, get_current_span
from opentelemetry.trace import Span as ApiSpan
from opentelemetry.util.types import AttributeValue

from ._clock import monotonic_ns
from ._errors import mark_error
from ._guard import after_fork_in_child, internal_error
from ._record import FastSpan

START = object()
"""Queued before a sample's root span, at its start: ``(START, span)`` (the metrics count running samples)."""


class Recorder:
    """Starts and ends this provider's fast-path spans and queues them for the export pipeline."""

    def __init__(
        self,
        *,
        resource: Resource,
        scope: InstrumentationScope,
        limits: SpanLimits,
        sampler: Sampler,
        id_generator: IdGenerator,
        max_queue: int = 2048,
        batch: int = 512,
    ) -> None:
        self.resource = resource
        self.scope = scope
        self.limits = limits
        self.sampler = sampler
        asks = getattr(sampler, "asks_roots", None)  # a wrapper of the default sampler says so (export._sampling)
        self.sample_roots = asks if type(asks) is bool else sampler.get_description() != DEFAULT_ON.get_description()
        """``False``: the default sampler (``ParentBased(ALWAYS_ON)``, also wrapped), which samples every root and
        every span below a sampled parent: not asked for those."""
        self.max_attributes = limits.max_span_attributes
        self.new_span_id = id_generator.generate_span_id
        self.new_trace_id = id_generator.generate_trace_id
        self.random_ids = 2 if id_generator.is_trace_id_random() else 0
        """The W3C random-trace-id flag (0x02) a new trace carries, as the SDK sets it."""
        self.max_queue = max_queue
        self.batch = max(1, min(batch, max_queue))  # wake the pipeline at this many queued spans
        self.wake: Callable[[], object] = _nothing
        self.overflow: Callable[[], object] = _nothing
        self.closed = False
        self.keep_context = False
        """Keep on each span the context it started in (``parent_context``): set when a span processor that is
        not the library's is added (its ``on_start`` runs later, on the pipeline, and may read the context:
        baggage)."""
        self._init_state()
        after_fork_in_child(self, "_init_state")

    def _init_state(self) -> None:
        """An empty queue (a forked child exports none of its parent's spans)."""
        self.queue: deque[Any] = deque()
        self.dropped = 0
        self.lock = threading.RLock()  # held by whoever drains the queue (the pipeline, a collect, an overflow)

    # -- start ---------------------------------------------------------------------------------------
    def start(
        self,
        name: str,
        attributes: dict[str, AttributeValue],
        start_ns: int,
        parent: ApiSpan | None = None,
        context: Context | None = None,
        links: Sequence[Link] | None = None,
    ) -> FastSpan | None:
        """A new span at ``start_ns`` (wall clock) below ``parent`` (the current span when ``None`` and no
        ``context``; ``context``: an explicit parent context, ``Context()`` for a new trace). ``None`` when the
        sampler drops it (start it through the SDK instead). Raises nothing the caller must not catch."""
        if parent is None:
            parent = get_current_span(context)
        span: FastSpan | None
        if type(parent) is FastSpan and parent.recorder is self and not links:
            span = FastSpan(
                self, name, parent.trace_id, self.new_span_id(), parent.span_id, parent.flags, start_ns, attributes
            )
            span.trace_state = parent.trace_state
        else:
            span = self._sampled(name, attributes, start_ns, parent, context, links)
        if self.keep_context and span is not None:
            # an instance attribute (FastSpan's instance dict): read back by export._pipeline, then freed
            span.parent_context = context if context is not None else get_current()
        return span

    def _sampled(
        self,
        name: str,
        attributes: dict[str, AttributeValue],
        start_ns: int,
        parent: ApiSpan | None,
        context: Context | None,
        links: Sequence[Link] | None,
    ) -> FastSpan | None:
        ctx = parent.get_span_context() if parent is not None else None
        valid = ctx is not None and ctx.is_valid
        trace_id = ctx.trace_id if valid else self.new_trace_id()  # type: ignore[union-attr]
        random = self.random_ids if not valid else int(ctx.trace_flags) & 2  # type: ignore[union-attr]
        if not self.sample_roots and not valid:  # ParentBased(ALWAYS_ON), a root: sampled, as it would answer
            span = FastSpan(self, name, trace_id, self.new_span_id(), 0, 1 | random, start_ns, attributes)
            if links:
                span.links = tuple(links)
            return span
        result = self.sampler.should_sample(context, trace_id, name, SpanKind.INTERNAL, attributes, links)
        if not result.decision.is_recording():
            return None
        if result.attributes and dict(result.attributes) != attributes:
            attributes = dict(result.attributes)  # a sampler may add attributes: the span gets the result's
        flags = (1 if result.decision.is_sampled() else 0) | random
        parent_id = ctx.span_id if ctx is not None and valid else 0
        span = FastSpan(self, name, trace_id, self.new_span_id(), parent_id, flags, start_ns, attributes)
        span.parent_remote = bool(ctx is not None and valid and ctx.is_remote)
        span.trace_state = result.trace_state
        if links:
            span.links = tuple(links)  # as the SDK keeps them
        return span

    # -- end -----------------------------------------------------------------------------------------
    def finish(self, span: FastSpan, exc: BaseException | None, end_time: int | None) -> None:
        """End ``span`` (once: later calls do nothing) at ``end_time`` (ns since the epoch; ``None``: now on its
        monotonic timeline), recording ``exc``; tell the in-flight registry; queue it. Never raises."""
        if span.end_ns:
            return
        try:
            if exc is not None:
                mark_error(span, exc)
            limit = self.max_attributes
            if (
                limit is not None
                and span.started is not None
                and (span.dropped_attributes or len(span.attributes) > limit)
            ):
                span.restore_identity(span.started)
            if end_time is None:
                offset = span.offset
                end_time = monotonic_ns() + offset if offset is not None else time.time_ns()
            span.end_ns = max(end_time, span.start_ns) or 1
        except Exception:
            internal_error("span.end")
            span.end_ns = span.end_ns or time.time_ns()
        registry = span.tracked
        if registry is not None:
            registry.phase_ended(span)
        self.put(span)

    def put(self, item: Any) -> None:
        """Queue an ended span (or a ``(START, span)`` pair) for the pipeline. When full or closed it is lost:
        a sampled span is counted in :attr:`dropped`, a start marker never (it is not a span)."""
        queue = self.queue
        if self.closed:
            self._lost(item)
            return
        if len(queue) >= self.max_queue:
            try:
                self.overflow()
            except Exception:
                internal_error("recorder.overflow")
            if len(queue) >= self.max_queue:
                self._lost(item)
                return
        queue.append(item)
        if len(queue) == self.batch:
            try:
                self.wake()
            except Exception:
                internal_error("recorder.wake")

    def _lost(self, item: Any) -> None:
        if type(item) is not tuple and item.flags & 1:  # as an export processor counts it: sampled spans only
            self.dropped += 1

    def take(self) -> list[Any]:
        """Everything queued so far, in order (the caller holds :attr:`lock`)."""
        queue = self.queue
        return [queue.popleft() for _ in range(len(queue))]

    def waiting(self) -> int:
        """The sampled spans queued here, not yet handed to the exporters (start markers are not spans). Exact
        while the caller holds :attr:`lock` and no other thread ends a span: the pipeline hands a drained batch
        over under that lock, so no span is between the queue and the exporters then."""
        return sum(1 for item in list(self.queue) if type(item) is not tuple and item.flags & 1)


def _nothing() -> None:
    return None
