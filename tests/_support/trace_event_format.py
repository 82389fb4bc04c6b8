"""A strict reader of Chrome Trace Event Format JSON, written from Google's "Trace Event Format" document, with
the extra constraints of the two viewers that open it (Perfetto UI's JSON importer, chrome://tracing).

No consumer of the format runs offline here: the ``perfetto`` package's trace processor downloads its binary at
first use, Debian's Chromium has no ``chrome://tracing``. So this checks what the document requires and what
the importers rely on, and returns the model a viewer would build (tracks, slices with their enclosing slice):

- the JSON Object Format: ``traceEvents`` (a list), ``displayTimeUnit`` ``"ms"`` or ``"ns"``, ``otherData``
  an object; strict JSON (no NaN);
- every event: ``ph`` a known phase, ``name`` a string, ``pid``/``tid`` integers in uint32 range (Perfetto
  reads them as uint32; pid 0 is its "no pid"), ``cat`` a string and ``args`` an object when present;
- ``ts`` (microseconds) a finite number >= 0 on every event but metadata; complete events (``X``) a finite
  ``dur`` >= 0; instant events (``i``/``I``) a scope ``s`` in g/p/t and no ``dur``;
- metadata (``M``): one of process_name, process_labels, process_sort_index, thread_name, thread_sort_index
  with its argument (``name``/``labels`` a string, ``sort_index`` an integer), at most one of each per
  process or thread;
- a tid belongs to one pid (Perfetto keys thread names by tid alone, and files metadata events under their
  pid/tid too), a tid is no other process's pid (Perfetto takes the thread whose tid is a pid for that process's
  main thread), every process with events is named and every thread with events is named;
- complete events on one thread nest strictly: sorted by (ts, -dur), each either starts at or after the end of
  the enclosing one or ends inside it. A partial overlap is an error (Perfetto drops or truncates such slices).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PHASES = frozenset("BEXiICbneSTpFstfPNODMVvRc()")
METADATA = {
    "process_name": "name",
    "process_labels": "labels",
    "process_sort_index": "sort_index",
    "thread_name": "name",
    "thread_sort_index": "sort_index",
}
UINT32 = 1 << 32


class TraceFormatError(AssertionError):
    """The file breaks the format; the message names the event."""


@dataclass
class Slice:
    """A complete or instant event as placed on its thread track."""

    event: dict[str, Any]
    ts: float
    end: float
    depth: int = 0
    parent: Slice | None = None

    @property
    def args(self) -> Mapping[str, Any]:
        return self.event.get("args") or {}


@dataclass
class Trace:
    events: list[dict[str, Any]]
    display_time_unit: str | None
    other: Mapping[str, Any]
    process_names: dict[int, str] = field(default_factory=dict)
    process_sort: dict[int, int] = field(default_factory=dict)
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    thread_sort: dict[tuple[int, int], int] = field(default_factory=dict)
    tracks: dict[tuple[int, int], list[Slice]] = field(default_factory=dict)
    """(pid, tid) -> its X and thread-scoped instant events, in (ts, -dur) order, each with its enclosing X."""


def _is_int(v: Any) -> bool:
    return type(v) is int


def _is_number(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def _fail(i: int, event: Any, why: str) -> TraceFormatError:
    return TraceFormatError(f"event {i} ({json.dumps(event)[:200]}): {why}")


def _reject_constant(name: str) -> Any:
    raise TraceFormatError(f"{name} is not JSON")


def parse(text: str) -> Trace:
    """Read and check a trace; raises :class:`TraceFormatError` on the first violation."""
    body = json.loads(text, parse_constant=_reject_constant)
    if isinstance(body, list):  # the JSON Array Format
        body = {"traceEvents": body}
    if not isinstance(body, dict) or not isinstance(body.get("traceEvents"), list):
        raise TraceFormatError("not the JSON Object Format (no traceEvents list)")
    unit = body.get("displayTimeUnit")
    if unit is not None and unit not in ("ms", "ns"):
        raise TraceFormatError(f"displayTimeUnit {unit!r} is neither 'ms' nor 'ns'")
    other = body.get("otherData", {})
    if not isinstance(other, dict):
        raise TraceFormatError("otherData is not an object")
    trace = Trace(body["traceEvents"], unit, other)
    owner: dict[int, int] = {}
    seen_meta: set[tuple[str, int, int]] = set()
    used: set[tuple[int, int]] = set()
    for i, e in enumerate(trace.events):
        if not isinstance(e, dict):
            raise _fail(i, e, "not an object")
        ph = e.get("ph")
        if not isinstance(ph, str) or ph not in PHASES:
            raise _fail(i, e, "ph is not a known phase")
        if not isinstance(e.get("name"), str):
            raise _fail(i, e, "name is not a string")
        if "cat" in e and not isinstance(e["cat"], str):
            raise _fail(i, e, "cat is not a string")
        if "args" in e and not isinstance(e["args"], dict):
            raise _fail(i, e, "args is not an object")
        pid, tid = e.get("pid"), e.get("tid")
        if not (_is_int(pid) and 0 < pid < UINT32 and _is_int(tid) and 0 <= tid < UINT32):
            raise _fail(i, e, "pid/tid are not integers in uint32 range (pid > 0)")
        if ph == "M":
            arg = METADATA.get(e["name"])
            if arg is None:
                raise _fail(i, e, "unknown metadata event")
            value = (e.get("args") or {}).get(arg)
            if not (_is_int(value) if arg == "sort_index" else isinstance(value, str)):
                raise _fail(i, e, f"metadata without a valid args.{arg}")
            thread = e["name"].startswith("thread_")
            key = (e["name"], pid, tid if thread else 0)
            if key in seen_meta:
                raise _fail(i, e, "duplicate metadata")
            seen_meta.add(key)
            if "ts" in e and not (_is_number(e["ts"]) and e["ts"] >= 0):
                raise _fail(i, e, "ts is not a finite number of microseconds >= 0")
            if owner.setdefault(tid, pid) != pid:  # Perfetto files every event under (pid, tid), metadata too
                raise _fail(i, e, f"tid {tid} is used by pid {owner[tid]} too")
            if thread:
                (trace.thread_names if arg == "name" else trace.thread_sort)[(pid, tid)] = value
            elif e["name"] == "process_name":
                trace.process_names[pid] = value
            elif e["name"] == "process_sort_index":
                trace.process_sort[pid] = value
            continue
        ts = e.get("ts")
        if not (_is_number(ts) and ts >= 0):
            raise _fail(i, e, "ts is not a finite number of microseconds >= 0")
        if owner.setdefault(tid, pid) != pid:
            raise _fail(i, e, f"tid {tid} is used by pid {owner[tid]} too")
        if ph == "X":
            dur = e.get("dur")
            if not (_is_number(dur) and dur >= 0):
                raise _fail(i, e, "a complete event without a finite dur >= 0")
            trace.tracks.setdefault((pid, tid), []).append(Slice(e, ts, ts + dur))
        elif ph in ("i", "I"):
            if "dur" in e:
                raise _fail(i, e, "an instant event with a dur")
            scope = e.get("s", "t")
            if scope not in ("g", "p", "t"):
                raise _fail(i, e, "instant scope is not g, p or t")
            if scope == "t":
                trace.tracks.setdefault((pid, tid), []).append(Slice(e, ts, ts))
        used.add((pid, tid))
    for tid, pid in owner.items():
        if tid != pid and tid in owner.values():
            raise TraceFormatError(
                f"tid {tid} (of pid {pid}) is also a pid: Perfetto would take it for that main thread"
            )
    for pid, tid in used:
        if pid not in trace.process_names:
            raise TraceFormatError(f"process {pid} has events but no process_name")
        if (pid, tid) not in trace.thread_names:
            raise TraceFormatError(f"thread {pid}/{tid} has events but no thread_name")
    for (pid, tid), slices in trace.tracks.items():
        _nest(pid, tid, slices)
    return trace


def _nest(pid: int, tid: int, slices: list[Slice]) -> None:
    """Place each slice under the innermost complete event enclosing it; a partial overlap is an error."""
    slices.sort(key=lambda s: (s.ts, -(s.end - s.ts), s.event["ph"] != "X"))
    stack: list[Slice] = []
    for s in slices:
        while stack and stack[-1].end <= s.ts:  # ended: a slice starting at its end is its sibling
            stack.pop()
        if stack and s.end > stack[-1].end:
            top = stack[-1]
            raise TraceFormatError(
                f"track {pid}/{tid}: {s.event['name']!r} [{s.ts}, {s.end}] partially overlaps "
                f"{top.event['name']!r} [{top.ts}, {top.end}]"
            )
        s.parent = stack[-1] if stack else None
        s.depth = len(stack)
        if s.event["ph"] == "X":
            stack.append(s)
