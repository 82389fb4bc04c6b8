"""Span timestamps on the wall clock, durations on the monotonic clock.

OpenTelemetry timestamps are wall-clock nanoseconds since the epoch, but the wall clock can step (NTP, an
operator's ``date -s``, a VM resumed): a duration taken from two wall readings can then be negative or an
hour long. Like the OTel Java SDK's ``AnchoredClock``, a span started by this library reads the wall clock
once, at its start (through the SDK), and the monotonic clock at both ends: it ends at
``monotonic_ns() + offset``, with ``offset = wall start - monotonic start`` (:func:`clock_offset`). So
``end - start`` is always the monotonic duration, and so is every metric computed from span start and end.

Phase spans below a sample take the sample's offset, also for their start (one monotonic reading, no wall
reading): a sample's spans share one timeline, children inside their parent whatever the wall clock does
meanwhile. The cost: over one sample's lifetime the spans drift from the wall clock by NTP's slew (at most
0.5 ms per second, typically far less). The in-flight registry and the watchdog keep monotonic start times
(``time.monotonic_ns``), so the ages they report and act on are monotonic too.
"""

from __future__ import annotations

from time import monotonic_ns
from typing import Any

__all__ = ["clock_offset", "monotonic_ns"]


def clock_offset(span: Any, mono_ns: int) -> int | None:
    """``span``'s wall-clock start minus ``mono_ns`` (``monotonic_ns()`` read at its start): end the span at
    ``monotonic_ns() + offset``. ``None`` for a span with no SDK start time (not recording, not the SDK's):
    end it on the SDK's own clock. Never raises."""
    try:
        start = span._start_time
    except Exception:
        return None
    return start - mono_ns if type(start) is int else None
