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

After the end, off the hot path (:func:`finalize`, when the pipeline admits the span: ``core._door.admit``):
what is left of the span's limits, on the attributes it started with.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

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
from ._values import bound_attributes

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


# -- after the end, off the hot path ------------------------------------------------------------------------
def finalize(span: FastSpan) -> None:
    """Apply what is left of the provider's span limits to an ended ``span``: the attributes it started with
    (a sample's shared dict, never written to, so not bounded when written) cleaned, cut to the length limit,
    the oldest over the count limit evicted (counted in ``dropped_attributes``), as the SDK's
    ``BoundedAttributes`` would; the links it started with bounded. What the user wrote through the ``Span`` API
    was bounded as it was written (``core._record``). Costs a type check per attribute when nothing needs
    doing, and not even that for a shared dict found clean for the span before (a sample's phases)."""
    global _clean
    limits = span.recorder.limits
    attrs = span.attributes
    key = (attrs, limits.max_span_attributes, limits.max_span_attribute_length)
    shared = not span.owned
    last = _clean  # one read: another handle's pipeline may replace it meanwhile
    if shared and last[0] is attrs and last[1:] == key[1:]:
        pass
    elif (key[1] is not None and len(attrs) > key[1]) or _too_long(attrs, key[2]):
        span.attributes, dropped = bound_attributes(attrs, key[1], key[2])
        span.owned = True
        span.dropped_attributes += dropped
    elif shared:
        _clean = key  # the dict kept alive (its id is never another dict's); a shared dict is never written to
    if span.links and not span.links_bounded:
        span.bound_links()


_clean: tuple[object, int | None, int | None] = (None, None, None)
"""The last shared attribute dict :func:`finalize` found clean, with the count and length limits it was checked
against (the dict only compared by identity)."""


def _too_long(attrs: Mapping[str, Any], length: int | None) -> bool:
    """Whether a value of ``attrs`` needs the SDK's cleaning: not a plain ``str``/``int``/``float``/``bool``,
    or a ``str`` over ``length``."""
    for value in attrs.values():
        kind = type(value)
        if kind is str:
            if length is not None and len(value) > length:
                return True
        elif kind is not int and kind is not float and kind is not bool:
            return True
    return False
