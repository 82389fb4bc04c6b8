"""The engines' load over a step as Perfetto counter tracks (``"ph": "C"``), beside the samples' tracks.

Each engine (``rl.engine.id``, :func:`~.._reading._engine_load.step_engine_load`) is a process named
``engine <id>`` with three counters: ``requests`` (series ``running`` and ``waiting``), ``KV cache usage %`` and
``preemptions`` (in each point), one event per point, at the point's time. Its pid and its one thread's tid count
on from the last tid of the samples' tracks, so no tid equals a pid (see :mod:`._perfetto`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypedDict

from ... import semconv as sc
from ...metrics._records import SpanRecord
from .._reading._engine_load import EngineLoad, step_engine_load


class TraceEvent(TypedDict, total=False):
    """One event of the Trace Event Format (``"ph"``: ``X`` complete, ``i`` instant, ``M`` metadata, ``C``
    counter); each kind has the fields it needs, in the order written."""

    name: str
    cat: str
    ph: str
    s: str
    ts: int
    dur: int
    pid: int
    tid: int
    args: Mapping[str, object]


def meta_event(kind: str, pid: int, tid: int, **args: object) -> TraceEvent:
    """A metadata event (``ts`` 0: some readers want a ``ts`` on every event)."""
    return {"name": kind, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": args}


def counter_tracks(
    records: Iterable[SpanRecord], step: int, validate: bool, t0: int, t1: int, last_tid: int
) -> tuple[list[EngineLoad], list[TraceEvent], list[TraceEvent]]:
    """The engines of step ``step`` over ``[t0, t1]`` (Unix ns; ``ts`` is microseconds since ``t0``), their
    metadata events and their counter events (time order per engine); pids and tids from ``last_tid + 1`` on."""
    engines = step_engine_load(records, step, validate, t0, t1) if t1 > t0 else []
    meta: list[TraceEvent] = []
    events: list[TraceEvent] = []
    at = last_tid
    for engine in engines:
        pid, tid = at + 1, at + 2
        at += 2
        meta.append(meta_event("process_name", pid, tid, name=f"engine {engine.engine_id}"))
        meta.append(meta_event("process_labels", pid, tid, labels=sc.ENGINE_LOAD_SPAN))
        meta.append(meta_event("process_sort_index", pid, tid, sort_index=pid))
        meta.append(meta_event("thread_name", pid, tid, name="engine load"))
        meta.append(meta_event("thread_sort_index", pid, tid, sort_index=tid))
        for t, running, waiting, kv, preempted in zip(
            engine.t_ns, engine.running, engine.waiting, engine.kv_cache_usage, engine.preemptions, strict=True
        ):
            ts = (t - t0) // 1000
            base: TraceEvent = {"ph": "C", "cat": "engine", "ts": ts, "pid": pid, "tid": tid}
            events.append({**base, "name": "requests", "args": {"running": running, "waiting": waiting}})
            events.append({**base, "name": "KV cache usage %", "args": {"kv": round(kv * 100, 2)}})
            events.append({**base, "name": "preemptions", "args": {"preemptions": preempted}})
    return engines, meta, events
