"""The engine's load over a step's time, from its ``rl.engine.load`` spans: what the step page, Perfetto and the run
page draw. An engine integration writes one ``rl.engine.load`` root span per engine per window
(``semconv.ENGINE_LOAD_SPAN``: equal-length arrays, one element per point of at most one per 100 ms: ms from the
span's start, running, waiting, KV cache usage, preemptions in that point). A step's load is every such span that
carries the step's ``rl.step`` (and ``rl.validate``), and every one without ``rl.step`` (a process that does not
know the step: a verl server actor) whose time overlaps the step's ``[t0, t1]``; its points are clipped to ``[t0,
t1]`` (a span of another step, with its ``rl.step``, never counts). Points of one engine (``rl.engine.id``) from
several spans make one series, in time order. Jaeger returns each array as its JSON text (its model has no arrays):
read alike. A malformed span (arrays of unequal lengths, a non-number) is left out whole. For drawing, a series
longer than :data:`MAX_POINTS` is merged into that many time buckets as the integration merges its 100 ms ones: the
max of running, waiting and KV usage, the sum of preemptions.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ... import semconv as sc
from ...metrics._engine import array_value
from ...metrics._records import SpanRecord

MAX_POINTS = 2000
"""Points of one engine's series a page or a trace draws (a longer one is merged into this many buckets)."""
MAX_ENGINES = 256
"""Engines one step draws (the busiest by peak running sequences)."""


@dataclass(frozen=True)
class EngineLoad:
    """One engine's load over a step: points at Unix ns ``t_ns`` (ascending), each with running and waiting
    requests, KV cache usage (0 to 1) and the preemptions in that point."""

    engine_id: str
    t_ns: tuple[int, ...]
    running: tuple[int, ...]
    waiting: tuple[int, ...]
    kv_cache_usage: tuple[float, ...]
    preemptions: tuple[int, ...]

    @property
    def peak_kv_cache_usage(self) -> float:
        return max(self.kv_cache_usage, default=0.0)

    @property
    def total_preemptions(self) -> int:
        return sum(self.preemptions)

    def to_json(self, t0_ns: int) -> dict[str, object]:
        """The series for a page: ms from ``t0_ns`` and the four columns."""
        return {
            "engine": self.engine_id,
            "t": [round((t - t0_ns) / 1e6, 1) for t in self.t_ns],
            "running": list(self.running),
            "waiting": list(self.waiting),
            "kv": [round(v, 4) for v in self.kv_cache_usage],
            "preempted": list(self.preemptions),
        }


def _ints(items: list[object] | None) -> list[int] | None:
    """``items`` when each is a non-negative int (below 2**53), else ``None``."""
    if items is None:
        return None
    out = [v for v in items if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 53]
    return out if len(out) == len(items) else None


def _fractions(items: list[object] | None) -> list[float] | None:
    """``items`` as floats when each is a number in [0, 1e6], else ``None``."""
    if items is None:
        return None
    out = [float(v) for v in items if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1e6]
    return out if len(out) == len(items) else None


def _points(rec: SpanRecord) -> list[tuple[int, int, int, float, int]] | None:
    """The span's points as (Unix ns, running, waiting, kv, preemptions); ``None`` when malformed."""
    get = rec.attributes.get  # lists, or Jaeger's JSON text of them
    offsets, running, waiting, preempted = (
        _ints(array_value(get(name)))
        for name in (
            sc.RL_ENGINE_LOAD_OFFSET_MS,
            sc.RL_ENGINE_LOAD_RUNNING,
            sc.RL_ENGINE_LOAD_WAITING,
            sc.RL_ENGINE_LOAD_PREEMPTIONS,
        )
    )
    kv = _fractions(array_value(get(sc.RL_ENGINE_LOAD_KV_CACHE_USAGE)))
    if offsets is None or running is None or waiting is None or preempted is None or kv is None:
        return None
    if len({len(offsets), len(running), len(waiting), len(kv), len(preempted)}) != 1:
        return None
    return [
        (rec.start_ns + o * 1_000_000, r, w, k, p)
        for o, r, w, k, p in zip(offsets, running, waiting, kv, preempted, strict=True)
    ]


def _belongs(attrs: Mapping[str, object], rec: SpanRecord, step: int, validate: bool, t0: int, t1: int) -> bool:
    if attrs.get(sc.RL_STEP) is not None:
        return sc.step_key(attrs) == (step, validate)
    return rec.start_ns <= t1 and rec.end_ns >= t0


def step_engine_load(
    records: Iterable[SpanRecord], step: int, validate: bool, t0_ns: int, t1_ns: int
) -> list[EngineLoad]:
    """Each engine's load over step ``step`` whose samples ran in ``[t0_ns, t1_ns]`` (see the module docstring),
    ordered by engine id; empty when no ``rl.engine.load`` span belongs to it."""
    by_engine: dict[str, dict[int, tuple[int, int, int, float, int]]] = {}
    for rec in records:
        if rec.name != sc.ENGINE_LOAD_SPAN or not _belongs(rec.attributes, rec, step, validate, t0_ns, t1_ns):
            continue
        points = _points(rec)
        if points is None:
            continue
        engine = rec.attributes.get(sc.RL_ENGINE_ID)
        series = by_engine.setdefault(str(engine) if engine is not None else "engine", {})
        for point in points:
            if t0_ns <= point[0] <= t1_ns:
                series[point[0]] = point  # a span read twice (two sources) counts once
    out = [_load(engine, sorted(points.values())) for engine, points in by_engine.items() if points]
    if len(out) > MAX_ENGINES:
        out = sorted(out, key=lambda e: (-max(e.running), e.engine_id))[:MAX_ENGINES]
    return sorted(out, key=lambda e: e.engine_id)


def _load(engine: str, points: Sequence[tuple[int, int, int, float, int]]) -> EngineLoad:
    if len(points) > MAX_POINTS:
        points = _merge(points)
    t, running, waiting, kv, preempted = zip(*points, strict=True)
    return EngineLoad(engine, t, running, waiting, kv, preempted)


def _merge(points: Sequence[tuple[int, int, int, float, int]]) -> list[tuple[int, int, int, float, int]]:
    """``points`` in :data:`MAX_POINTS` equal time buckets (each at its first point's time)."""
    lo, hi = points[0][0], points[-1][0]
    width = (hi - lo) / MAX_POINTS or 1
    buckets: dict[int, tuple[int, int, int, float, int]] = {}
    for t, r, w, k, p in points:
        b = min(int((t - lo) / width), MAX_POINTS - 1)
        cur = buckets.get(b)
        if cur is None:
            buckets[b] = (t, r, w, k, p)
        else:
            buckets[b] = (cur[0], max(cur[1], r), max(cur[2], w), max(cur[3], k), cur[4] + p)
    return [v for _, v in sorted(buckets.items())]


K = TypeVar("K")


def with_unstepped_load(
    by_step: Mapping[K, list[SpanRecord]], records: Iterable[SpanRecord]
) -> dict[K, list[SpanRecord]]:
    """``by_step`` (each step's records) with each ``rl.engine.load`` span of ``records`` that carries no
    ``rl.step`` added to every step whose records' time range it overlaps (what :func:`step_engine_load` then
    draws of it); ``by_step``'s lists are not changed."""
    loads = sorted(
        (r for r in records if r.name == sc.ENGINE_LOAD_SPAN and r.attributes.get(sc.RL_STEP) is None),
        key=lambda r: r.start_ns,
    )
    out = {key: list(spans) for key, spans in by_step.items()}
    if not loads:
        return out
    starts = [r.start_ns for r in loads]
    longest = max(r.end_ns - r.start_ns for r in loads)
    for spans in out.values():
        if not spans:
            continue
        lo, hi = min(r.start_ns for r in spans), max(r.end_ns for r in spans)
        first = bisect.bisect_left(starts, lo - longest)
        spans += [r for r in loads[first : bisect.bisect_right(starts, hi)] if r.end_ns >= lo]
    return out
