"""A plain span record: what we keep of a span for timelines, reports and re-reading stored traces."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode


@dataclass(slots=True)
class SpanRecord:
    """One finished span. Ids are ints (``parent_id`` 0 for a root); times are Unix nanoseconds."""

    trace_id: int
    span_id: int
    parent_id: int
    name: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any] = field(default_factory=dict)
    error: bool = False
    status_message: str = ""
    kind: int = 0
    resource: Mapping[str, Any] = field(default_factory=dict)
    events: tuple[tuple[str, int, Mapping[str, Any]], ...] = ()
    links: tuple[tuple[int, int], ...] = ()

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def trace_id_hex(self) -> str:
        return format(self.trace_id, "032x")

    @classmethod
    def from_span(cls, span: ReadableSpan) -> SpanRecord:
        ctx = span.context
        parent = span.parent
        return cls(
            trace_id=ctx.trace_id if ctx is not None else 0,
            span_id=ctx.span_id if ctx is not None else 0,
            parent_id=parent.span_id if parent is not None else 0,
            name=span.name,
            start_ns=span.start_time or 0,
            end_ns=span.end_time or 0,
            attributes=dict(span.attributes or {}),
            error=span.status.status_code is StatusCode.ERROR,
            status_message=span.status.description or "",
            kind=span.kind.value,
        )
