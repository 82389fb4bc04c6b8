"""The engine's timing in words: a turn's note (:func:`engine_note`) and the step's engine table
(:func:`engine_cells`, :func:`engine_table`), from the attributes :mod:`.._reading._engine` reads."""

from __future__ import annotations

from collections.abc import Mapping

from ... import semconv as sc
from .._reading._engine import ENGINE_PARTS, engine_seconds


def engine_note(attrs: Mapping[str, object]) -> str:
    """The engine's timing of a turn in a few words (``""`` without it): ``queue 0.150s prefill 0.002s decode
    0.010s, 100 tokens``."""
    words = []
    for name, key in zip(
        ENGINE_PARTS, (sc.RL_ENGINE_QUEUE_S, sc.RL_ENGINE_PREFILL_S, sc.RL_ENGINE_DECODE_S), strict=True
    ):
        value = engine_seconds(attrs, key)
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


def engine_state(metrics: Mapping[str, float]) -> str:
    """The engine's state under the step's turns in one line (``""`` when no turn carried it): ``engine state:
    peak KV cache 97 %, 2 preemptions, 60 sequences running on average (max 64), 12,000 prompt tokens from the
    prefix cache, up to 3 attempts in a turn`` (each part only when its metric is there)."""
    base = f"{sc.METRIC_PREFIX}/{sc.ENGINE_METRIC}"

    def get(key: str) -> float | None:
        return metrics.get(f"{base}/{key}")

    parts = []
    if (kv := get(f"{sc.ENGINE_KV_CACHE_USAGE}/max")) is not None:
        parts.append(f"peak KV cache {kv * 100:.0f} %")
    if (pre := get(sc.ENGINE_PREEMPTIONS)) is not None:
        parts.append(f"{pre:,.0f} preemption{'' if pre == 1 else 's'}")
    if (mean := get(f"{sc.ENGINE_BATCH_RUNNING}/mean")) is not None:
        top = get(f"{sc.ENGINE_BATCH_RUNNING}/max")
        parts.append(f"{mean:.0f} sequences running on average" + (f" (max {top:.0f})" if top is not None else ""))
    if (cached := get(sc.ENGINE_CACHED_TOKENS)) is not None:
        parts.append(f"{cached:,.0f} prompt tokens from the prefix cache")
    if (segments := get(f"{sc.ENGINE_SEGMENTS}/max")) is not None and segments > 1:
        parts.append(f"up to {segments:.0f} attempts in a turn (partial rollouts)")
    return "engine state: " + ", ".join(parts) if parts else ""


def engine_table(metrics: Mapping[str, float]) -> str:
    """:func:`engine_cells` as plain text, then :func:`engine_state` (``""`` without either)."""
    rows = engine_cells(metrics)
    state = engine_state(metrics)
    lines = []
    if rows:
        lines.append(f"{ENGINE_HEAD[0]:<30}" + "".join(f"{c:>10}" for c in ENGINE_HEAD[1:]))
        lines += [f"{r[0]:<30}" + "".join(f"{c:>10}" for c in r[1:]) for r in rows]
    if state:
        lines.append(state)
    return "\n".join(lines)
