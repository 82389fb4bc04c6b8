"""Where fast-path spans start and end: one :class:`Recorder` per provider ``configure()`` builds.

Start (:meth:`Recorder.start`): a span below one of this recorder's own spans takes its parent's trace and
sampling decision, with no sampler call (what every sampler ``configure()`` installs decides for a span below a
local parent: ``ParentBased`` or the budget sampler, see ``export._sampling``). Any other span (a root, a child
of a user's SDK span or of a remote context) asks the provider's sampler, exactly as ``start_span`` would; if
it answers DROP, the caller falls back to the SDK (a non-recording span).

End (:meth:`Recorder.finish`): the one place a fast-path span ends: error recorded, identity restored if a
count limit evicted anything (``FastSpan.restore_identity``), end time on the span's monotonic timeline, the
in-flight registry told, the span put in the record queue. The queue is the export pipeline's
(``export._pipeline.RecordPipeline``, its one owner: bounded, drained off the hot path), given as ``queue``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

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
from ._guard import internal_error
from ._record import FastSpan, Queued

START = object()
"""Queued before a sample's root span, at its start: ``(START, span)`` (the metrics count running samples)."""


class RecordQueue(Protocol):
    """Where a recorder's records go (``export._pipeline.RecordPipeline``)."""

    def put(self, item: Queued) -> None: ...

    def attach(self, recorder: Recorder) -> None: ...


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
        queue: RecordQueue,
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
        self.queue = queue
        self.keep_context = False
        """Keep on each span the context it started in (``parent_context``): set by the queue while a span
        processor that is not the library's exists (its ``on_start`` runs later, on the pipeline, and may read
        the context: baggage)."""
        queue.attach(self)

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
        self.queue.put(span)  # its owner's method, called directly (a bound method kept here costs ~10 ns more)

    def put(self, item: Queued) -> None:
        """Queue ``item``: an ended span, or ``(START, span)`` before a sample's root span (the metrics count
        running samples). Never raises."""
        self.queue.put(item)
