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
from typing import Any

from .. import semconv as sc
from ..metrics._accumulate import engine_number

ENGINE_PARTS: tuple[str, ...] = ("queue", "prefill", "decode")
"""The engine's phases inside a turn, in time order."""
Part = tuple[str, int, int]
"""(engine phase, start, end): Unix nanoseconds inside the turn span."""


def _seconds(attrs: Mapping[str, Any], key: str) -> float | None:
    return engine_number(attrs.get(key))


def engine_parts(start_ns: int, end_ns: int, attrs: Mapping[str, Any]) -> list[Part]:
    """The engine's queue, prefill and decode inside the turn ``[start_ns, end_ns]`` (see the module docstring);
    empty when the span carries none of them. Parts of zero length are left out."""
    queue = _seconds(attrs, sc.RL_ENGINE_QUEUE_S)
    prefill = _seconds(attrs, sc.RL_ENGINE_PREFILL_S)
    decode = _seconds(attrs, sc.RL_ENGINE_DECODE_S)
    if prefill is None:
        ttft = _seconds(attrs, sc.RL_ENGINE_TTFT_S)
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


def engine_note(attrs: Mapping[str, Any]) -> str:
    """The engine's timing of a turn in a few words (``""`` without it): ``queue 0.150s prefill 0.002s decode
    0.010s, 100 tokens``."""
    words = []
    for name, key in zip(
        ENGINE_PARTS, (sc.RL_ENGINE_QUEUE_S, sc.RL_ENGINE_PREFILL_S, sc.RL_ENGINE_DECODE_S), strict=True
    ):
        value = _seconds(attrs, key)
        if value is not None:
            words.append(f"{name} {value:.3f}s")
    if not words:
        return ""
    tokens = attrs.get(sc.GEN_AI_USAGE_OUTPUT_TOKENS)
    return " ".join(words) + (f", {tokens} tokens" if type(tokens) is int and tokens >= 0 else "")


_UNITS = {sc.ENGINE_OUTPUT_TOKENS: "tokens", sc.ENGINE_DECODE_TPS: "tokens/s"}


def engine_value(stat: str, value: float | None) -> str:
    """One engine statistic formatted: seconds to the ms, tokens and tokens/s whole; ``-`` when missing."""
    if value is None:
        return "-"
    return f"{value:.0f}" if stat in _UNITS else f"{value:.3f}"


def engine_cells(metrics: Mapping[str, float]) -> list[tuple[str, ...]]:
    """The step's engine table: one row per statistic of ``semconv.ENGINE_STATS`` present in ``metrics``
    (``agent_loop/engine/<stat>/{p50,p90,p99,max}``), its unit in the name; empty without engine timing."""
    base = f"{sc.METRIC_PREFIX}/{sc.ENGINE_METRIC}"
    rows = []
    for stat in sc.ENGINE_STATS:
        values = [metrics.get(f"{base}/{stat}/{c}") for c in sc.ENGINE_STAT_COLUMNS]
        if all(v is None for v in values):
            continue
        unit = _UNITS.get(stat)
        rows.append((f"{stat} ({unit})" if unit else stat, *(engine_value(stat, v) for v in values)))
    return rows


ENGINE_HEAD: tuple[str, ...] = ("engine, per turn", *sc.ENGINE_STAT_COLUMNS)


def engine_table(metrics: Mapping[str, float]) -> str:
    """:func:`engine_cells` as plain text (``""`` without engine timing)."""
    rows = engine_cells(metrics)
    if not rows:
        return ""
    lines = [f"{ENGINE_HEAD[0]:<30}" + "".join(f"{c:>10}" for c in ENGINE_HEAD[1:])]
    lines += [f"{r[0]:<30}" + "".join(f"{c:>10}" for c in r[1:]) for r in rows]
    return "\n".join(lines)
