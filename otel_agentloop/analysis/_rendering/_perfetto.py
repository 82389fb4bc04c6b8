"""One step as a Chrome Trace Event Format file (``report --step N --perfetto step.json``), for Perfetto UI
(ui.perfetto.dev) and ``chrome://tracing``.

Layout (the JSON Object Format of Google's "Trace Event Format" document):

- a *process* per worker (the span's ``rl.worker``, else the resource's ``rl.worker``, else its
  ``host.name:process.pid``), named with ``process_name`` metadata; processes without samples (the trainer's
  ``rl.step``/``rl.train.*`` spans) come first;
- a *thread* (track) per sample, named ``sample I/R`` (``I/R [hung]`` etc. when its verdict is not ok), in sample
  order (``thread_sort_index``, and tids rising in the same order, so viewers that sort by tid agree);
- one *event* per span of the step: a complete event (``"X"``) nested under its parent span's event, or, for a
  watchdog snapshot (``rl.snapshot``) of a sample whose span did end, an instant event (``"i"``) at the moment
  the watchdog looked. A hung sample whose span never ended is drawn by its latest snapshot (from the sample's
  start to the snapshot).
- inside a generation turn that carries the engine's timing and has no child span of its own, the engine's
  ``queue``, ``prefill`` and ``decode`` (``analysis._reading._engine.engine_parts``) as nested complete events named
  ``engine queue`` etc. (category ``engine``); the turn's ``args.attributes`` carry the engine's numbers either
  way. A sample's own event says why it took its time (``args.cause``, ``metrics._summary.cause``) for the
  slowest and slow samples.

- each engine's load over the step (``rl.engine.load`` spans) as counter tracks (``"ph": "C"``): a process per
  engine, ``engine <id>``, with ``requests`` (running, waiting), ``KV cache usage %`` and ``preemptions``
  (:mod:`._perfetto_counters`).

Events on one track must nest strictly (an event that partially overlaps another on its tid is mis-nested by both
viewers), so a span that would overlap a sibling (parallel tool calls), or that lies outside its parent's time
range by more than :data:`~._perfetto_layout.SKEW_US` (clock skew between processes), goes onto a *lane*: an extra
track right below its sample's, named ``sample I/R (lane k)``, where it and its children nest again. Lanes are
threads rather than async events because thread tracks sort next to the sample's own track in both viewers and
keep strict nesting checkable; async tracks are grouped per process, away from the sample.

Times are integer microseconds since the step's first span start (the absolute start is in ``otherData``):
flooring both ends keeps every containment and every disjointness of the nanosecond times, so the nesting on a
track is the spans' nesting (a child moved into its parent by at most :data:`~._perfetto_layout.SKEW_US` says so
in its args). Every event carries its trace and span ids in ``args``; pids and tids are assigned in sorted order,
so the same spans give the same file. Verdicts come from :func:`otel_agentloop.metrics._summary.verdict`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypedDict

from ... import semconv as sc
from ...metrics._records import SpanRecord
from ...metrics._summary import HUNG, OK, SLOW
from ...metrics._verdicts import StepVerdicts
from .._reading._engine import engine_parts
from .._reading._gc import gc_paused
from .._reading._json import JsonValue
from .._reading._report import build_report, sample_key_of, step_verdicts, stored_summaries
from ._perfetto_counters import TraceEvent, counter_tracks, meta_event
from ._perfetto_layout import Group, Item, layout

SampleKey = tuple[int, int]
SpanKey = tuple[int, int]
"""(trace id, span id)"""
Event = tuple[tuple[int, int, int, int, int], TraceEvent]
"""An event with its sort key (tid, start, -duration, depth, span id)."""


class TraceFile(TypedDict):
    """A Trace Event Format file (its JSON Object Format), as :func:`step_trace` makes it."""

    traceEvents: list[TraceEvent]
    displayTimeUnit: str
    otherData: dict[str, object]


MAX_STRING_CHARS = 1000
"""A longer string attribute is cut to this many characters in ``args`` (prompt/response content)."""
MAX_ATTR_DEPTH = 8
TIME_UNIT = "ms"
"""``displayTimeUnit``: how viewers print times (the ``ts``/``dur`` numbers are microseconds either way)."""


def _is_snapshot(rec: SpanRecord) -> bool:
    return rec.attributes.get(sc.RL_SNAPSHOT) is True


def _is_sample_root(rec: SpanRecord) -> bool:
    return rec.name == sc.SAMPLE_SPAN and not _is_snapshot(rec)


def _worker(rec: SpanRecord) -> str:
    """The process a span ran in: ``rl.worker`` (span, then resource), else ``host.name:process.pid``."""
    for source in (rec.attributes, rec.resource):
        name = source.get(sc.RL_WORKER)
        if isinstance(name, str) and name:
            return name
    host, pid = rec.resource.get("host.name"), rec.resource.get("process.pid")
    if host is not None or pid is not None:
        return f"{host if host is not None else '?'}:{pid if pid is not None else '?'}"
    service = rec.resource.get("service.name")
    return str(service) if service else "unknown"


def _json_value(value: object, depth: int = 0) -> JsonValue:
    """An attribute value as JSON (strings cut, non-finite floats and bytes as text, nesting bounded)."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return value if len(value) <= MAX_STRING_CHARS else value[:MAX_STRING_CHARS] + "…"
    if isinstance(value, bytes):
        return value[: MAX_STRING_CHARS // 2].hex()
    if depth >= MAX_ATTR_DEPTH:
        return "…"
    if isinstance(value, (tuple, list)):
        return [_json_value(v, depth + 1) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _json_value(v, depth + 1) for k, v in value.items()}
    return str(value)[:MAX_STRING_CHARS]


_NOT_SPANS = (sc.STEP_SUMMARY_SPAN, sc.ENGINE_LOAD_SPAN)
"""Records of the step that are not drawn as spans: its summary, the engines' load (counter tracks)."""


def _step_spans(records: list[SpanRecord], step: int, validate: bool) -> dict[SpanKey, SpanRecord]:
    """The step's spans: those tagged with the step, and every span below them in their traces (a user's own
    child spans carry no ``rl.step``), but not the step summary record nor spans tagged with another step."""
    chosen: dict[SpanKey, SpanRecord] = {}
    for rec in records:
        attrs = rec.attributes
        if sc.step_key(attrs) == (step, validate) and rec.name not in _NOT_SPANS:
            chosen.setdefault((rec.trace_id, rec.span_id), rec)
    traces = {trace for trace, _ in chosen}
    children: dict[SpanKey, list[SpanRecord]] = {}
    for rec in records:
        if rec.trace_id in traces and rec.parent_id and (rec.trace_id, rec.span_id) not in chosen:
            if rec.name == sc.STEP_SUMMARY_SPAN or sc.RL_STEP in rec.attributes:
                continue  # another step's span (or the summary record) in a shared trace
            children.setdefault((rec.trace_id, rec.parent_id), []).append(rec)
    todo = list(chosen)
    while todo:
        for child in children.pop(todo.pop(), ()):
            key = (child.trace_id, child.span_id)
            if key not in chosen:
                chosen[key] = child
                todo.append(key)
    return chosen


def _owners(spans: Mapping[SpanKey, SpanRecord]) -> dict[SpanKey, SampleKey | None]:
    """Each span's sample: the nearest sample span (or snapshot) above it, else the sample named by its own
    attributes (a sample whose span is missing), else ``None`` (a span outside samples: trainer, worker call)."""
    owner: dict[SpanKey, SampleKey | None] = {}
    for start in spans:
        chain: list[SpanKey] = []
        key = start
        seen: set[SpanKey] = set()
        result: SampleKey | None = None
        while True:
            if key in owner:
                result = owner[key]
                break
            rec = spans[key]
            chain.append(key)
            seen.add(key)
            if rec.name == sc.SAMPLE_SPAN or rec.attributes.get(sc.RL_SNAPSHOT) is True:  # a root or a snapshot
                result = sample_key_of(rec.attributes)
                break
            parent = (rec.trace_id, rec.parent_id)
            if not rec.parent_id or parent not in spans or parent in seen:
                result = sample_key_of(rec.attributes)
                break
            key = parent
        for k in chain:
            owner[k] = result
    return owner


def _verdict(
    spans: list[SpanRecord], verdicts: StepVerdicts, key: SampleKey
) -> tuple[str, SpanRecord | None, list[SpanRecord]]:
    """A sample's one verdict (``verdicts``: the step's, see ``analysis._reading._report.step_verdicts``), its finished
    sample span (if any) and its snapshots (oldest first)."""
    roots = [s for s in spans if _is_sample_root(s)]
    root = max(roots, key=lambda s: (s.end_ns, s.span_id)) if roots else None
    snapshots = sorted((s for s in spans if _is_snapshot(s)), key=lambda s: (s.end_ns, s.span_id))
    return verdicts.of_sample(key, error=root is not None and root.error), root, snapshots


def _us(ns: int, t0: int) -> int:
    return (ns - t0) // 1000


def _label(verdict_: str) -> str:
    return "" if verdict_ == OK else f" [{verdict_}]"


def _group_items(
    group: Group, spans: list[SpanRecord], verdicts: StepVerdicts, t0: int, causes: Mapping[SampleKey, str]
) -> dict[str, str] | None:
    """Fill ``group.items`` (and the sample's verdict); returns the sample's facts for its events' args."""
    snapshot_events: set[int] = set()
    primary: SpanRecord | None = None
    facts: dict[str, str] | None = None
    if group.key is not None:
        group.verdict, root, snapshots = _verdict(spans, verdicts, group.key)
        primary = root if root is not None else (snapshots[-1] if snapshots else None)
        snapshot_events = {id(s) for s in snapshots if s is not primary}
        facts = {"sample": f"{group.key[0]}/{group.key[1]}", "verdict": group.verdict, "worker": group.worker}
        if group.key in causes:
            facts["cause"] = causes[group.key]
    for rec in spans:
        item = Item(rec, _us(rec.start_ns, t0), _us(rec.end_ns, t0), name=rec.name)
        if id(rec) in snapshot_events:
            phase, tool = rec.attributes.get(sc.RL_PHASE), rec.attributes.get(sc.GEN_AI_TOOL_NAME)
            item.instant, item.start = True, item.end
            item.name = f"watchdog: {group.verdict} in {phase}" + (f" ({tool})" if tool else "")
        elif rec is primary:
            item.primary = True
            item.name = rec.name + _label(group.verdict).upper()
        group.items.append(item)
    layout(group)
    return facts


def _args(item: Item, facts: dict[str, str] | None) -> dict[str, object]:
    rec = item.rec
    args: dict[str, object] = {"trace_id": rec.trace_id_hex, "span_id": format(rec.span_id, "016x")}
    if rec.parent_id:
        args["parent_span_id"] = format(rec.parent_id, "016x")
    if facts is not None and (item.primary or item.instant):
        args.update(facts)
    if item.instant:
        args["snapshot_span"] = rec.name
    elif item.primary and _is_snapshot(rec) and rec.parent_id:
        args["open_sample_span_id"] = format(rec.parent_id, "016x")  # the sample span it stands in for
    if item.skew is not None:
        args["skew_us"] = list(item.skew)
    if rec.error:
        args["status"] = "ERROR" + (f": {rec.status_message[:MAX_STRING_CHARS]}" if rec.status_message else "")
    if rec.attributes:
        args["attributes"] = {
            k: v
            if (type(v) is str and len(v) <= MAX_STRING_CHARS) or type(v) is int or type(v) is bool
            else _json_value(v)
            for k, v in rec.attributes.items()
        }
    return args


def _category(rec: SpanRecord) -> str:
    if _is_snapshot(rec):
        return "watchdog"
    phase = rec.attributes.get(sc.RL_PHASE)
    if isinstance(phase, str) and phase in sc.PHASES:
        return phase
    if rec.name == sc.SAMPLE_SPAN:
        return "sample"
    if rec.name.startswith(sc.TRAINER_PHASE_SPAN_PREFIX) or rec.name == sc.STEP_SPAN:
        return "trainer"
    return "span"


def _engine_events(item: Item, pid: int, tid: int, t0: int) -> list[Event]:
    """The engine's parts of a turn as events nested in it (none for a turn with child spans: they could
    overlap them), each inside the turn's event, zero-length ones left out."""
    if item.instant or item.children:
        return []
    out = []
    for name, start_ns, end_ns in engine_parts(item.rec.start_ns, item.rec.end_ns, item.rec.attributes):
        start = min(max(_us(start_ns, t0), item.start), item.end)
        end = min(max(_us(end_ns, t0), start), item.end)
        if end > start:
            args = {"span_id": format(item.rec.span_id, "016x")}
            event: TraceEvent = {"name": f"engine {name}", "cat": "engine", "ph": "X", "ts": start}
            event.update({"dur": end - start, "pid": pid, "tid": tid, "args": args})
            out.append(((tid, start, start - end, item.depth + 1, item.rec.span_id), event))
    return out


@dataclass(slots=True)
class _Tracks:
    """The step's spans by sample and by process, and the track groups in the file's order."""

    by_sample: dict[SampleKey, list[SpanRecord]]
    outside: dict[str, list[SpanRecord]]
    sample_worker: dict[SampleKey, str]
    workers: list[str]
    groups: list[Group]


def _tracks(spans: Mapping[SpanKey, SpanRecord]) -> _Tracks:
    owners = _owners(spans)
    by_sample: dict[SampleKey, list[SpanRecord]] = {}
    outside: dict[str, list[SpanRecord]] = {}
    for key, rec in spans.items():
        sample = owners[key]
        if sample is None:
            outside.setdefault(_worker(rec), []).append(rec)
        else:
            by_sample.setdefault(sample, []).append(rec)
    # A sample's process: its sample span's worker, else its snapshot's, else any of its spans'.
    sample_worker: dict[SampleKey, str] = {}
    for sample, recs in by_sample.items():
        firsts = [r for r in recs if r.name == sc.SAMPLE_SPAN or r.attributes.get(sc.RL_SNAPSHOT) is True]
        best = min(firsts or recs, key=lambda r: (not _is_sample_root(r), not _is_snapshot(r), r.start_ns, r.span_id))
        sample_worker[sample] = _worker(best)
    first_sample: dict[str, SampleKey] = {}
    for sample in sorted(by_sample):
        first_sample.setdefault(sample_worker[sample], sample)
    workers = sorted(outside.keys() - first_sample.keys()) + sorted(first_sample, key=lambda w: first_sample[w])
    groups: list[Group] = []
    for worker in workers:
        if worker in outside:
            groups.append(Group(worker, None, []))
        groups.extend(Group(worker, s) for s in sorted(by_sample) if sample_worker[s] == worker)
    return _Tracks(by_sample, outside, sample_worker, workers, groups)


def _item_events(group: Group, pid: int, track: int, facts: dict[str, str] | None, t0: int) -> list[Event]:
    """The events of one group's items (and their engine parts) on the tracks from ``track`` on."""
    out: list[Event] = []
    for item in group.items:
        tid = track + item.lane
        event: TraceEvent = {
            "name": item.name,
            "cat": _category(item.rec),
            "ph": "i" if item.instant else "X",
            "ts": item.start,
            "pid": pid,
            "tid": tid,
        }
        if item.instant:
            event["s"] = "t"
        else:
            event["dur"] = item.end - item.start
        event["args"] = _args(item, facts)
        out.append(((tid, item.start, item.start - item.end, item.depth, item.rec.span_id), event))
        out.extend(_engine_events(item, pid, track + item.lane, t0))
    return out


def _processmeta_event(tracks: _Tracks, pids: Mapping[str, int], first_tid: Mapping[int, int]) -> list[TraceEvent]:
    """A process's metadata on its first track: every event's (pid, tid) agrees."""
    meta: list[TraceEvent] = []
    for worker in tracks.workers:
        pid = pids[worker]
        n = sum(1 for s in tracks.by_sample if tracks.sample_worker[s] == worker)
        meta.append(meta_event("process_name", pid, first_tid[pid], name=f"worker {worker}" if n else worker))
        meta.append(meta_event("process_labels", pid, first_tid[pid], labels=f"{n} samples"))
        meta.append(meta_event("process_sort_index", pid, first_tid[pid], sort_index=pid))
    return meta


def step_trace(
    records: Iterable[SpanRecord],
    step: int,
    validate: bool = False,
    *,
    source: str = "",
    verdicts: StepVerdicts | None = None,
    causes: Mapping[SampleKey, str] | None = None,
) -> TraceFile:
    """The Trace Event Format object of ``step`` (its validation pass with ``validate``) from ``records``
    (spans of one run: selecting the run is the caller's). A step without spans gives a trace without events.
    ``verdicts`` and ``causes``: the step's, when the caller has them (``report`` built them from the same
    spans); else made here, as ``report`` makes them."""
    records = list(records)
    spans = {k: r for k, r in _step_spans(records, step, validate).items() if r.start_ns > 0}
    if verdicts is None:
        verdicts = step_verdicts(records, step, validate, stored_summaries(records).get((step, validate)))
    if causes is None:
        causes = build_report(records, step, validate, verdicts).causes()
    t0 = min((r.start_ns for r in spans.values()), default=0)
    tracks = _tracks(spans)
    pids = {w: i + 1 for i, w in enumerate(tracks.workers)}
    threads: list[TraceEvent] = []
    events: list[Event] = []
    counts: dict[str, int] = {}
    # tids are unique across processes (Perfetto keys thread names by tid) and never equal a pid (Perfetto takes
    # the thread whose tid is its pid for the process's main thread): they count on from the last pid.
    tid = len(tracks.workers)
    first_tid: dict[int, int] = {}
    for group in tracks.groups:
        recs = tracks.by_sample[group.key] if group.key is not None else tracks.outside[group.worker]
        facts = _group_items(group, recs, verdicts, t0, causes)
        if group.key is not None:
            counts[group.verdict] = counts.get(group.verdict, 0) + 1
            title = f"sample {group.key[0]}/{group.key[1]}{_label(group.verdict)}"
        else:
            title = "step (spans outside samples)"
        pid, track = pids[group.worker], tid + 1
        first_tid.setdefault(pid, track)
        for lane in range(group.lanes):
            tid += 1
            thread = title if lane == 0 else f"{title} (lane {lane})"
            threads.append(meta_event("thread_name", pid, tid, name=thread))
            threads.append(meta_event("thread_sort_index", pid, tid, sort_index=tid))
        events.extend(_item_events(group, pid, track, facts, t0))
    events.sort(key=lambda e: e[0])
    t1 = max((r.end_ns for r in spans.values()), default=0)
    engines, engine_meta, counters = counter_tracks(records, step, validate, t0, t1, tid)
    other = _other_data(step, validate, source, t0, len(spans), tracks, counts)
    other["engines"] = [e.engine_id for e in engines]
    return {
        "traceEvents": _processmeta_event(tracks, pids, first_tid)
        + threads
        + engine_meta
        + [e for _, e in events]
        + counters,
        "displayTimeUnit": TIME_UNIT,
        "otherData": other,
    }


def _other_data(
    step: int, validate: bool, source: str, t0: int, spans: int, tracks: _Tracks, counts: Mapping[str, int]
) -> dict[str, object]:
    groups = tracks.groups
    return {
        "generator": "otel-agentloop report --perfetto",
        "step": step,
        "validate": validate,
        "source": source,
        "t0_unix_ns": t0,
        "time_origin": "ts is integer microseconds since t0_unix_ns (the step's first span start)",
        "spans": spans,
        "samples": len(tracks.by_sample),
        "verdicts": {v: counts[v] for v in sorted(counts)},
        "hung": sorted(f"{g.key[0]}/{g.key[1]}" for g in groups if g.key is not None and g.verdict == HUNG),
        "slow": sorted(f"{g.key[0]}/{g.key[1]}" for g in groups if g.key is not None and g.verdict == SLOW),
    }


def write_perfetto(trace: TraceFile, path: str | os.PathLike[str]) -> str:
    """Write ``trace`` (a :func:`step_trace` object) to ``path`` as compact JSON; returns the path. Raises
    ``OSError`` when the file cannot be written."""
    with gc_paused():  # only acyclic dicts and lists
        text = json.dumps(trace, separators=(",", ":"), allow_nan=False, check_circular=False)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return os.fspath(path)
