"""A side tracer: spans the library writes about the run itself (the watchdog's snapshots, step summaries).

They go straight into the handle's export processors, past the provider's sampler and the SampleKeeper, with
span limits of their own (every limit given, so no ``OTEL_*_LIMIT`` variable is read).
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import Tracer


def side_tracer(
    name: str,
    resource: Resource,
    export: Sequence[SpanProcessor],
    *,
    max_attributes: int,
    max_links: int,
    max_attribute_length: int | None,
) -> Tracer:
    """A tracer whose spans are always recorded and reach ``export`` only (``max_attribute_length`` ``None``: no
    limit). Its provider is never shut down on exit: ``export``'s owner flushes and stops the processors."""
    length = SpanLimits.UNSET if max_attribute_length is None else max_attribute_length
    limits = SpanLimits(
        max_attributes=max_attributes,
        max_events=0,
        max_links=max_links,
        max_span_attributes=max_attributes,
        max_event_attributes=0,
        max_link_attributes=0,
        max_attribute_length=length,
        max_span_attribute_length=length,
    )
    provider = TracerProvider(resource=resource, sampler=ALWAYS_ON, span_limits=limits, shutdown_on_exit=False)
    for proc in export:
        provider.add_span_processor(proc)
    return provider.get_tracer(name)
