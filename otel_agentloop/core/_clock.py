"""Span timestamps on the wall clock, durations on the monotonic clock.

OpenTelemetry timestamps are wall-clock nanoseconds since the epoch, but the wall clock can step (NTP, an
operator's ``date -s``, a VM resumed): a duration taken from two wall readings can then be negative or an
hour long. Like the OTel Java SDK's ``AnchoredClock``, a span started by this library reads the wall clock
once, at its start, and the monotonic clock at both ends: it ends at ``monotonic_ns() + offset``, with
``offset = wall start - monotonic start``. So ``end - start`` is always the monotonic duration, and so is every
metric computed from span start and end. Both readings are taken before the span is started, on both paths:
with ``fast_path=False`` the start is passed to the SDK as ``start_time``, so a slow sampler (or a thread
switch) inside the SDK's ``start_span`` does not shift the span, its sample's timeline or its children later.

Phase spans below a sample take the sample's offset, also for their start (one monotonic reading, no wall
reading): a sample's spans share one timeline, children inside their parent whatever the wall clock does
meanwhile. The cost: over one sample's lifetime the spans drift from the wall clock by NTP's slew (at most
0.5 ms per second, typically far less). The in-flight registry and the watchdog keep monotonic start times
(``time.monotonic_ns``), so the ages they report and act on are monotonic too.
"""

from __future__ import annotations

from time import monotonic_ns

__all__ = ["monotonic_ns"]
