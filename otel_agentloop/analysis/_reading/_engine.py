"""The inference engine's part of a generation turn, as drawn inside the turn, and the step's engine table.

A turn span that carries the engine's timing (``semconv.ENGINE_ATTRIBUTES``) is split, for drawing, into the
engine's phases placed from the turn's start: ``queue`` (``rl.engine.queue_s``), then ``prefill``
(``rl.engine.prefill_s``, else time to first token less the queue), then ``decode`` (``rl.engine.decode_s``);
each clipped to the turn (the engine's clock and ours differ by the request's way in and out, which is what is
left of the turn). The terminal waterfall, the step page, the PNG and Perfetto all draw from
:func:`engine_parts`; a span without the engine's timing has no parts and is drawn as before.
"""

from __future__ import annotations

from collections.abc import Mapping

from ... import semconv as sc
from ...metrics._accumulate import engine_number

ENGINE_PARTS: tuple[str, ...] = ("queue", "prefill", "decode")
"""The engine's phases inside a turn, in time order."""
_TIMING = (sc.RL_ENGINE_QUEUE_S, sc.RL_ENGINE_PREFILL_S, sc.RL_ENGINE_DECODE_S, sc.RL_ENGINE_TTFT_S)
"""The attributes the parts are made from."""
Part = tuple[str, int, int]
"""(engine phase, start, end): Unix nanoseconds inside the turn span."""


def engine_seconds(attrs: Mapping[str, object], key: str) -> float | None:
    return engine_number(attrs.get(key))


def engine_parts(start_ns: int, end_ns: int, attrs: Mapping[str, object]) -> list[Part]:
    """The engine's queue, prefill and decode inside the turn ``[start_ns, end_ns]`` (see the module docstring);
    empty when the span carries none of them. Parts of zero length are left out."""
    if not any(key in attrs for key in _TIMING):  # most spans: not a turn with the engine's timing
        return []
    queue = engine_seconds(attrs, sc.RL_ENGINE_QUEUE_S)
    prefill = engine_seconds(attrs, sc.RL_ENGINE_PREFILL_S)
    decode = engine_seconds(attrs, sc.RL_ENGINE_DECODE_S)
    if prefill is None:
        ttft = engine_seconds(attrs, sc.RL_ENGINE_TTFT_S)
        if ttft is not None:
            prefill = max(ttft - (queue or 0.0), 0.0)
    if queue is None and prefill is None and decode is None:
        return []
    out: list[Part] = []
    at = start_ns
    for name, seconds in zip(ENGINE_PARTS, (queue, prefill, decode), strict=True):
        if seconds is None:
            continue
        end = min(at + round(seconds * 1e9), end_ns)
        if end > at:
            out.append((name, at, end))
        at = end
    return out
