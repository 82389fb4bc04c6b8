"""Run one scenario with the recording fast path on and off, capture every place spans reach, normalise.

What is captured per run (:class:`Run`): the spans a user's exporter receives (an ``InMemorySpanExporter``
passed in ``exporters=``), what a user's span processor (``processors=``) sees in ``on_start`` and ``on_end``,
the OTLP-JSON lines our file exporter writes (``file=``), and what a real OTLP receiver gets over gRPC. Every
source is turned into the same canonical span (:func:`from_readable`, :func:`from_proto`), then
:func:`normalise` replaces ids by their position in a stable order (so parentage, links and trace grouping are
compared, not raw ids) and times by their order (and checks that children lie within their parents).
Everything else is kept as it is: names, kind, attributes (ordered, with their types), status, events, links,
resource, scope, dropped counts, flags, ``parent.is_remote``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.core._tracer import SCOPE
from otel_agentloop.metrics._summary import TOP_STORED
from tests._support.otlp_receiver import Receiver, _hex_ids_to_base64, start_grpc, start_http, wait_for

FAST_PATH_ENV = "OTEL_AGENTLOOP_FAST_PATH"
MODES = ("fast", "sdk")
SUMMARY_SPAN = "rl.step.summary"
LIBRARY_SCOPE = SCOPE
RANDOM_TRACE_ID = 0x02
"""W3C Trace Context level 2's flag (the SDK sets it on traces it starts with random ids): compared by
``test_fast_path_parity::test_trace_flags_match_the_sdk_with_the_random_trace_id_flag`` only, so that a
difference there does not hide the others."""
_TIMED_PHASES = (sc.GENERATE, sc.TOOL_CALLS, sc.COMPUTE_SCORE)
EXPLICIT_TIMES = 1 << 50
"""Event times below this (before 1970-01-14) are a user's explicit timestamps: compared as they are; the
others (taken from the clock) only by their presence."""


# -- capture --------------------------------------------------------------------------------------------------
class RawReceiver(Receiver):
    """The test receiver, keeping the decoded requests whole (status, events, kind, scope...)."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []

    def add(self, request: Any, headers: Any) -> None:
        copy = trace_service_pb2.ExportTraceServiceRequest()
        copy.CopyFrom(request)
        with self.lock:
            self.requests.append(copy)
        super().add(request, headers)


class RecordingProcessor(SpanProcessor):
    """A user's span processor: logs each ``on_start`` (with what the span carried then) and ``on_end``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, dict[str, Any], ReadableSpan | None]] = []
        self.lock = threading.Lock()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        with self.lock:
            self.calls.append(("start", span.context.span_id, dict(span.attributes or {}), None))

    def on_end(self, span: ReadableSpan) -> None:
        with self.lock:
            self.calls.append(("end", span.context.span_id, dict(span.attributes or {}), span))

    def ended(self) -> list[ReadableSpan]:
        return [span for kind, _, _, span in self.calls if kind == "end" and span is not None]


@dataclass
class Run:
    """One run of a scenario: what each destination received, and what the scenario returned."""

    mode: str
    exported: list[ReadableSpan]
    processor: RecordingProcessor
    file_lines: list[str]
    grpc: list[trace_service_pb2.ExportTraceServiceRequest]
    result: Any = None
    handle: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def canonical(self, source: str) -> list[dict[str, Any]]:
        if source == "exporter":
            return [from_readable(s) for s in self.exported]
        if source == "processor":
            return [from_readable(s) for s in self.processor.ended()]
        if source == "file":
            return [span for line in self.file_lines for span in from_proto(parse_json_line(line))]
        if source == "grpc":
            return [span for request in self.grpc for span in from_proto(request)]
        raise ValueError(source)


SOURCES = ("exporter", "processor", "file", "grpc")


def run_scenario(
    mode: str,
    scenario: Callable[[Any], Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    env: Mapping[str, str] | None = None,
    protocol: str = "grpc",
    **configure_kwargs: Any,
) -> Run:
    """``scenario(handle)`` under a fresh ``configure()`` with the fast path on (``mode="fast"``) or off; the
    handle is flushed and shut down before this returns, and the receiver has every exported span.
    ``protocol``: ``"grpc"`` or ``"http/protobuf"``, the OTLP exporter and the loopback receiver's
    (``Run.grpc`` holds what that receiver decoded either way)."""
    monkeypatch.setenv(FAST_PATH_ENV, "true" if mode == "fast" else "false")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")  # the receiver takes traces only
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    receiver = RawReceiver()
    stop: Callable[[], Any]
    if protocol == "grpc":
        grpc_server, endpoint = start_grpc(receiver)
        stop = lambda: grpc_server.stop(0)  # noqa: E731
    else:
        http_server, endpoint = start_http(receiver)
        stop = http_server.shutdown
    exporter = InMemorySpanExporter()
    processor = RecordingProcessor()
    path = tmp_path / f"{mode}.jsonl"
    options: dict[str, Any] = {
        "exporters": [exporter],
        "processors": [processor],
        "file": str(path),
        "endpoint": endpoint,
        "protocol": protocol,
        "set_global": False,
        "schedule_delay_s": 0.05,
        **configure_kwargs,
    }
    try:
        handle = oal.configure("parity", **options)
        try:
            result = scenario(handle)
            assert handle.force_flush(5), f"{mode}: spans still queued after 5 s"
        finally:
            handle.shutdown(5)
        exported = list(exporter.get_finished_spans())
        assert wait_for(lambda: len(receiver.records) >= len(exported), 10), (len(receiver.records), len(exported))
    finally:
        stop()
    lines = [line for line in path.read_text().split("\n") if line] if path.exists() else []  # not U+0085
    return Run(mode, exported, processor, lines, list(receiver.requests), result, handle)


def run_both(
    scenario: Callable[[Any], Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    env: Mapping[str, str] | None = None,
    **configure_kwargs: Any,
) -> dict[str, Run]:
    """:func:`run_scenario` with the fast path on, then off, each in a fresh configuration."""
    return {mode: run_scenario(mode, scenario, tmp_path, monkeypatch, env=env, **configure_kwargs) for mode in MODES}


# -- canonical spans ------------------------------------------------------------------------------------------
def _typed(value: Any) -> Any:
    """A value with its type (a sequence with each element's)."""
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_typed(v) for v in value))
    return (type(value).__name__, value)


def _attrs(attributes: Mapping[str, Any] | None) -> list[tuple[str, Any]]:
    return [(key, _typed(value)) for key, value in (attributes or {}).items()]


def from_readable(span: ReadableSpan) -> dict[str, Any]:
    """``span`` as a canonical dict (raw ids and times; :func:`normalise` replaces them). Python types kept:
    tuple and list differ here, as they reach a user's exporter."""
    ctx = span.context
    parent = span.parent
    resource = span.resource
    scope = span.instrumentation_scope
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": ctx.trace_id,
        "span_id": ctx.span_id,
        "parent_id": parent.span_id if parent is not None else 0,
        "parent_remote": parent.is_remote if parent is not None else None,
        "flags": int(ctx.trace_flags) & ~RANDOM_TRACE_ID,
        "random_trace_id": bool(ctx.trace_flags & RANDOM_TRACE_ID),
        "trace_state": ctx.trace_state.to_header(),
        "attributes": _attrs(span.attributes),
        "dropped_attributes": span.dropped_attributes,
        "status": (span.status.status_code.name, span.status.description),
        "events": [(e.name, _attrs(e.attributes)) for e in span.events],
        "event_times": [e.timestamp for e in span.events],
        "dropped_events": span.dropped_events,
        "links": [(link.context.trace_id, link.context.span_id, _attrs(link.attributes)) for link in span.links],
        "dropped_links": span.dropped_links,
        "resource": (sorted(_attrs(resource.attributes)), resource.schema_url),
        "scope": (scope.name, scope.version, scope.schema_url) if scope is not None else None,
        "start": span.start_time,
        "end": span.end_time,
    }


def _any_value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return ("array", tuple(_any_value(x) for x in v.array_value.values))
    if kind == "kvlist_value":
        return ("kvlist", tuple((kv.key, _any_value(kv.value)) for kv in v.kvlist_value.values))
    return (kind, getattr(v, kind)) if kind else (None, None)


def _kvs(kvs: Iterable[Any]) -> list[tuple[str, Any]]:
    return [(kv.key, _any_value(kv.value)) for kv in kvs]


def _id(raw: bytes) -> int:
    return int.from_bytes(raw, "big") if raw else 0


_STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}
_KIND = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


def from_proto(request: trace_service_pb2.ExportTraceServiceRequest) -> list[dict[str, Any]]:
    """The spans of an OTLP request as canonical dicts (OTLP's types: ``string_value``, ``int_value``...)."""
    out = []
    for rs in request.resource_spans:
        resource = (sorted(_kvs(rs.resource.attributes)), rs.schema_url)
        for ss in rs.scope_spans:
            scope = (ss.scope.name, ss.scope.version, ss.schema_url)
            for s in ss.spans:
                flags = s.flags
                out.append(
                    {
                        "name": s.name,
                        "kind": _KIND[s.kind],
                        "trace_id": _id(s.trace_id),
                        "span_id": _id(s.span_id),
                        "parent_id": _id(s.parent_span_id),
                        "parent_remote": bool(flags & 0x200) if flags & 0x100 else None,
                        "flags": flags & 0xFF & ~RANDOM_TRACE_ID,
                        "random_trace_id": bool(flags & RANDOM_TRACE_ID),
                        "trace_state": s.trace_state,
                        "attributes": _kvs(s.attributes),
                        "dropped_attributes": s.dropped_attributes_count,
                        "status": (_STATUS[s.status.code], s.status.message),
                        "events": [(e.name, _kvs(e.attributes)) for e in s.events],
                        "event_times": [e.time_unix_nano for e in s.events],
                        "dropped_events": s.dropped_events_count,
                        "links": [(_id(link.trace_id), _id(link.span_id), _kvs(link.attributes)) for link in s.links],
                        "dropped_links": s.dropped_links_count,
                        "resource": resource,
                        "scope": scope,
                        "start": s.start_time_unix_nano,
                        "end": s.end_time_unix_nano,
                    }
                )
    return out


def parse_json_line(line: str) -> trace_service_pb2.ExportTraceServiceRequest:
    request = trace_service_pb2.ExportTraceServiceRequest()
    json_format.Parse(json.dumps(_hex_ids_to_base64(json.loads(line))), request)
    return request


# -- normalisation --------------------------------------------------------------------------------------------
def is_timing_metric(key: str) -> bool:
    """A metric whose value is a measured duration (compared by presence only)."""
    parts = key.split("/")
    return len(parts) >= 2 and parts[0] == "agent_loop" and (parts[1] in _TIMED_PHASES or parts[-1] in _TIMED_PHASES)


WHICH_SLOWEST = f"{SUMMARY_SPAN}/slowest"
"""Kept for callers: which sample was the step's slowest is a measurement, so two runs compare it masked always;
:func:`check_slowest` checks it within each run against that run's own spans."""
_SLOWEST = "agent_loop/slowest/"


def mask_metrics(metrics: Mapping[str, Any], which_slowest: bool = True) -> dict[str, Any]:
    """``metrics`` with every measured duration replaced by ``"<time>"`` (keys, counts, identities kept) and,
    with ``which_slowest``, what depends on which sample was the slowest (its index, rollout, counts, lengths)
    by ``"<which>"``: under load another sample can truly be the slowest in one of two runs."""
    out = {key: ("<time>" if is_timing_metric(key) else value) for key, value in sorted(metrics.items())}
    if which_slowest:
        out.update({key: "<which>" for key, value in out.items() if key.startswith(_SLOWEST) and value != "<time>"})
    return out


def _mask_summary(text: str, which_slowest: bool = True) -> Any:
    """The ``rl.step.summary`` JSON with its durations and times masked (counts, identity and keys kept; which
    sample was the slowest masked too, see :func:`mask_metrics`)."""
    data = json.loads(text)
    data["metrics"] = mask_metrics(data.get("metrics", {}), which_slowest)
    for key in ("phases", "tools"):
        data[key] = {name: row[0] for name, row in data.get(key, {}).items()}  # the count per phase/tool
    data["t"] = len(data.get("t", []))
    slowest = data.get("slowest")
    if slowest:
        which = ["<which>"] * 2 + ["<which>"] * len(slowest[6:]) if which_slowest else [*slowest[:2], *slowest[6:]]
        data["slowest"] = [*which[:2], "<trace>", "<time>", "<time>", "<time>", *which[2:]]
    top = data.get("top", [])
    # the slowest samples in duration order, which differs between runs: their identities and verdicts as a set
    # (every sample while the step has fewer than the list holds; else only how many)
    data["top"] = sorted([row[0], row[1], *row[6:]] for row in top) if len(top) < TOP_STORED else len(top)
    for key in ("hung", "slow"):
        data[key] = len(data.get(key, []))
    return data


def _map_attrs(attrs: list[tuple[str, Any]], masked: frozenset[str]) -> list[Any]:
    out = []
    for key, (kind, value) in attrs:
        if key in masked:
            value = "<masked>"
        elif key == SUMMARY_SPAN and kind in ("str", "string_value"):
            value = _mask_summary(value)
        out.append((key, (kind, value)))
    return out


def _covered(intervals: list[tuple[int, int]]) -> int:
    """The time the intervals cover, overlaps once (how a phase's time adds up)."""
    covered = reach = 0
    for start, end in sorted(intervals):
        covered += max(0, end - max(start, reach))
        reach = max(reach, end)
    return covered


def phase_totals(spans: list[dict[str, Any]]) -> dict[tuple[Any, ...], int]:
    """Per sample, ``(step, validate, index, rollout)``: the time its phase spans cover (each phase's overlaps
    once, phases added: verl's generate + tool + score), read from canonical spans with real times; a phase span's
    sample is its ``rl.sample`` ancestor."""
    by_id = {s["span_id"]: s for s in spans}

    def sample_of(span: dict[str, Any]) -> dict[str, Any]:
        seen = 0
        while span["name"] != sc.SAMPLE_SPAN and span["parent_id"] in by_id and seen < len(spans):
            span, seen = by_id[span["parent_id"]], seen + 1
        return {key: value for key, (_, value) in span["attributes"]}

    phases: dict[tuple[Any, ...], list[tuple[int, int]]] = {}
    for s in spans:
        phase = {key: value for key, (_, value) in s["attributes"]}.get(sc.RL_PHASE)
        attrs = sample_of(s) if phase in _TIMED_PHASES else {}
        if sc.RL_SAMPLE_INDEX in attrs:
            key = (attrs.get(sc.RL_STEP), attrs.get(sc.RL_VALIDATE, False))
            key += (attrs[sc.RL_SAMPLE_INDEX], attrs.get(sc.RL_ROLLOUT_N, -1), phase)
            phases.setdefault(key, []).append((s["start"], s["end"]))
    totals: dict[tuple[Any, ...], int] = {}
    for key, intervals in phases.items():
        totals[key[:4]] = totals.get(key[:4], 0) + _covered(intervals)
    return totals


def slowest_by_spans(spans: list[dict[str, Any]], step: Any, validate: Any = False) -> tuple[Any, Any]:
    """The step's sample whose phase spans took longest, ``(index, rollout)``."""
    totals = {key[2:]: total for key, total in phase_totals(spans).items() if key[:2] == (step, validate)}
    return max(totals, key=totals.__getitem__)


def check_slowest(spans: list[dict[str, Any]], what: str) -> int:
    """Within one run (canonical spans, real times): each step summary's slowest sample is the one whose phase
    spans cover the most time (:func:`phase_totals`), and its metrics name that sample. The load-proof check of
    which sample was slowest, which two runs compare masked. A step whose samples did not all reach these spans
    (a budget, a sampler) is left to the metric tests. Returns how many steps it checked."""
    all_totals = phase_totals(spans)
    checked = 0
    for s in spans:
        text = {key: value for key, (_, value) in s["attributes"]}.get(SUMMARY_SPAN)
        if s["name"] != SUMMARY_SPAN or not isinstance(text, str):
            continue
        data = json.loads(text)
        totals = {k[2:]: t for k, t in all_totals.items() if k[:2] == (data.get("step"), data.get("validate"))}
        slowest = data.get("slowest")
        if not slowest or len(totals) != data.get("n"):
            continue
        longest = max(totals.values())
        assert totals.get((slowest[0], slowest[1])) == longest, f"{what}: slowest {slowest[:2]}, spans: {totals}"
        index = data.get("metrics", {}).get(f"{_SLOWEST}sample_index", slowest[0])
        assert index == slowest[0], f"{what}: metrics name sample {index} the slowest, the summary {slowest[0]}"
        checked += 1
    return checked


def _tree_order(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Spans depth first: roots (spans whose parent is not here) by start, each span's children by start
    (longest first on a tie), then name; the step summary after its siblings (its times are the metrics', which
    tie with its first sample's start). Only siblings are compared by time, and siblings share a timeline."""
    here = {s["span_id"] for s in spans}
    children: dict[int, list[dict[str, Any]]] = {}
    for s in spans:
        children.setdefault(s["parent_id"] if s["parent_id"] in here else 0, []).append(s)
    out: list[dict[str, Any]] = []

    def visit(parent: int) -> None:
        for s in sorted(
            children.get(parent, []), key=lambda s: (s["name"] == SUMMARY_SPAN, s["start"], -s["end"], s["name"])
        ):
            out.append(s)
            visit(s["span_id"])

    visit(0)
    assert len(out) == len(spans), "a cycle in parentage"
    return out


def nesting_violations(spans: list[dict[str, Any]]) -> list[str]:
    """Spans that do not lie within their parent's [start, end]."""
    by_id = {s["span_id"]: s for s in spans}
    out = []
    for s in spans:
        parent = by_id.get(s["parent_id"])
        if parent is not None and not (parent["start"] <= s["start"] and s["end"] <= parent["end"]):
            out.append(
                f"{s['name']} [{s['start']}, {s['end']}] not within its parent {parent['name']} "
                f"[{parent['start']}, {parent['end']}] (by {s['end'] - parent['end']} ns at the end, "
                f"{parent['start'] - s['start']} ns at the start)"
            )
    return out


def normalise(spans: list[dict[str, Any]], masked: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Spans in a stable order (:func:`_tree_order`) with ids replaced by positions (``t0``, ``s3``; an id of
    no span here: ``x0``...) and times by order: ``start``/``end`` become the span's rank among its siblings'
    starts / ends (each compared with the same kind of time, so spans on different clocks' anchors compare).
    ``masked``: attribute keys whose values are timing (compared by presence and type only)."""
    masked_keys = frozenset(masked)
    ordered = _tree_order(spans)
    traces: dict[int, str] = {}
    span_ids = {s["span_id"]: f"s{i}" for i, s in enumerate(ordered)}
    external: dict[int, str] = {}
    for s in ordered:
        traces.setdefault(s["trace_id"], f"t{len(traces)}")

    def sid(raw: int) -> str:
        if raw == 0:
            return "-"
        return span_ids.get(raw) or external.setdefault(raw, f"x{len(external)}")

    def tid(raw: int) -> str:
        return traces.get(raw) or external.setdefault(raw, f"xt{len(external)}")

    siblings: dict[int, list[dict[str, Any]]] = {}
    for s in ordered:
        siblings.setdefault(s["parent_id"] if s["parent_id"] in span_ids else 0, []).append(s)
    rank: dict[int, tuple[int, int]] = {}
    roots = siblings.get(0, [])
    for group in siblings.values():
        timed = [s for s in group if s["name"] != SUMMARY_SPAN]  # the summary's times: see _tree_order
        starts = sorted(s["start"] for s in timed)
        ends = sorted(s["end"] for s in timed)
        for s in group:  # roots: each on its own clock anchor, so only their starts are compared
            if s["name"] == SUMMARY_SPAN:
                rank[s["span_id"]] = (-1, -1)
                continue
            rank[s["span_id"]] = (starts.index(s["start"]), -1 if group is roots else ends.index(s["end"]))
    out = []
    for s in ordered:
        n = dict(s)
        n["trace_id"] = tid(s["trace_id"])
        n["span_id"] = sid(s["span_id"])
        n["parent_id"] = sid(s["parent_id"])
        n["links"] = [(tid(t), sid(i), a) for t, i, a in s["links"]]
        n["attributes"] = _map_attrs(s["attributes"], masked_keys)
        n["events"] = [(name, _map_attrs(attrs, masked_keys)) for name, attrs in s["events"]]
        n["event_times"] = [t if t < EXPLICIT_TIMES else "<now>" for t in s["event_times"]]
        n["start"], n["end"] = rank[s["span_id"]]
        out.append(n)
    return out


def assert_same(a: Any, b: Any, what: str) -> None:
    """``a == b``, else a message listing every differing field (span, field, both values)."""
    if a == b:
        return
    if isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), f"{what}: {len(a)} spans (fast) != {len(b)} (sdk): {_names(a)} vs {_names(b)}"
        diffs = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y and isinstance(x, dict) and isinstance(y, dict):
                for key in x:
                    if x[key] != y.get(key):
                        diffs.append(f"span {i} ({x['name']}) {key}: {_diff(x[key], y.get(key))}")
        assert not diffs, f"{what}: {len(diffs)} differences:\n" + "\n".join(diffs[:40])
    assert a == b, what


def _diff(fast: Any, sdk: Any) -> str:
    """Both values; for attribute lists, only the entries that differ."""
    if isinstance(fast, list) and isinstance(sdk, list) and all(isinstance(x, tuple) for x in [*fast, *sdk]):
        only_fast = [x for x in fast if x not in sdk]
        only_sdk = [x for x in sdk if x not in fast]
        if only_fast or only_sdk:
            return f"only fast {only_fast!r}, only sdk {only_sdk!r}"
        return f"same entries, order: fast {[x[0] for x in fast]!r} != sdk {[x[0] for x in sdk]!r}"
    return f"fast {fast!r} != sdk {sdk!r}"


def _names(spans: list[dict[str, Any]]) -> list[str]:
    return [s["name"] for s in spans]


def compare_runs(
    runs: Mapping[str, Run],
    *,
    masked: Iterable[str] = (),
    ignore: Iterable[str] = ("random_trace_id",),
    timeline: bool = True,
) -> dict[str, list[dict[str, Any]]]:
    """Compare every destination of the fast run with the SDK run, field by field; also each run's
    destinations with each other. ``ignore``: fields left out (a difference allowed by design, asserted by the
    caller). ``timeline=False``: times compared by nesting only (concurrent threads). Returns the fast run's
    normalised exporter spans, per source."""
    masked = tuple(masked)
    dropped = set(ignore) | ({"start", "end"} if not timeline else set())
    out: dict[str, list[dict[str, Any]]] = {}
    failures = []
    for source in SOURCES:  # every source compared before failing: the message lists them all
        per_mode = {}
        for mode, run in runs.items():
            spans = normalise(run.canonical(source), masked)
            per_mode[mode] = [{k: v for k, v in s.items() if k not in dropped} for s in spans]
        try:
            assert_same(per_mode["fast"], per_mode["sdk"], f"{source}: fast vs sdk")
        except AssertionError as exc:
            failures.append(str(exc))
        out[source] = per_mode["fast"]
    assert not failures, "\n".join(failures)
    # within one run: the processor saw every exported span as the exporter did (and, under a sampler, also
    # the record-only ones); the file and the gRPC receiver got the same OTLP
    for mode, run in runs.items():
        exported = [s for s in run.canonical("exporter") if not _side_span(s["name"])]
        ids = {s["span_id"] for s in exported}
        seen = [s for s in run.canonical("processor") if s["span_id"] in ids]
        assert_same(normalise(exported, masked), normalise(seen, masked), f"{mode}: exporter vs processor")
        file_spans, grpc_spans = normalise(run.canonical("file"), masked), normalise(run.canonical("grpc"), masked)
        assert_same(file_spans, grpc_spans, f"{mode}: file vs grpc")
    violations = nesting_violations(runs["fast"].canonical("exporter"))
    assert not violations, "fast: " + "; ".join(violations)
    for mode, run in runs.items():  # which sample was slowest: compared masked above, checked in each run here
        check_slowest(run.canonical("exporter"), mode)
    return out


def _side_span(name: str) -> bool:
    """Spans the library hands to its export processors directly (never to the provider's processors)."""
    return name == SUMMARY_SPAN or name.endswith(sc.SNAPSHOT_SUFFIX)


def end_order(run: Run, per_trace: bool = False) -> Any:
    """The order in which the user's processor saw the library's spans end, as normalised span names
    (``name#position``); with ``per_trace``, per normalised trace id (concurrent samples whose phases take
    measured times end in an order of their own). A user's own SDK spans are left out: on the fast path they
    reach the processor as they end, the library's when the pipeline drains (by design)."""
    spans = run.canonical("processor")
    ids = {
        s["span_id"]: (n["trace_id"], f"{n['name']}#{n['span_id']}")
        for s, n in zip(_tree_order(spans), normalise(spans), strict=True)
    }
    ended = [
        ids[sid]
        for kind, sid, _, span in run.processor.calls
        if kind == "end"
        and span is not None
        and span.instrumentation_scope is not None
        and span.instrumentation_scope.name == LIBRARY_SCOPE
    ]
    if not per_trace:
        return [name for _, name in ended]
    out: dict[str, list[str]] = {}
    for trace_id, name in ended:
        out.setdefault(trace_id, []).append(name)
    return out


def check_processor_starts(runs: Mapping[str, Run]) -> None:
    """Every span's ``on_start`` came before its ``on_end``, once each. SDK path: ``on_start`` ran when the span
    started (a parent's before its children's). Fast path, by design, for the library's spans: ``on_start``
    runs on the export pipeline after the span ended, with every attribute already set, ``on_end`` right
    after, and a child's before its parent's (a user's own SDK spans are started by the SDK as before)."""
    for mode, run in runs.items():
        calls = run.processor.calls
        starts = {sid: i for i, (kind, sid, _, _) in enumerate(calls) if kind == "start"}
        ends = {sid: i for i, (kind, sid, _, _) in enumerate(calls) if kind == "end"}
        assert set(starts) == set(ends), f"{mode}: on_start and on_end for different spans"
        assert len(starts) + len(ends) == len(calls), f"{mode}: a span seen twice"
        ours: set[int] = set()
        for sid, i in starts.items():
            assert i < ends[sid]
            start_attrs, end_span = calls[i][2], calls[ends[sid]][3]
            assert end_span is not None
            if end_span.instrumentation_scope is not None and end_span.instrumentation_scope.name == LIBRARY_SCOPE:
                ours.add(sid)
            final = dict(end_span.attributes or {})
            if mode == "fast" and sid in ours:
                assert ends[sid] == i + 1, f"fast: on_end of {end_span.name} not right after its on_start"
                assert start_attrs == final, f"fast: on_start of {end_span.name} saw {start_attrs}, ended with {final}"
        spans = run.canonical("processor")
        here = {sp["span_id"]: sp for sp in spans}
        for sp in spans:
            child, parent = sp["span_id"], sp["parent_id"]
            if parent not in here:
                continue
            if mode == "sdk" or parent not in ours:  # the parent's on_start as it started: before the child's
                assert starts[parent] < starts[child], f"{mode}: on_start of {sp['name']} came before its parent's"
            else:  # the parent's on the pipeline after it ended: after its children's
                assert starts[child] < starts[parent], f"fast: on_start of {sp['name']} came after its parent's"


def per_launch(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Values that differ in every launch (pids, run ids, instance and node ids) replaced: pids by their order of
    appearance (also inside ``rl.worker``), the others by a mark."""
    pids: dict[Any, str] = {}

    def pid_of(value: Any) -> str:
        return pids.setdefault(int(value), f"pid{len(pids)}")

    def worker(value: Any) -> Any:
        host, _, pid = str(value[1]).rpartition(":")
        return (value[0], f"{host}:{pid_of(pid)}" if pid.isdigit() else value[1])

    out = []
    for s in sorted(spans, key=lambda s: s["start"]):
        attrs, schema = s["resource"]
        resource = []
        for key, value in attrs:
            if key == "process.pid":
                value = (value[0], pid_of(value[1]))
            elif key in (sc.RL_RUN_ID, sc.RL_RUN_ATTEMPT, "service.instance.id", "ray.node.id"):
                value = (value[0], "<per launch>")
            elif key == sc.RL_WORKER:
                value = worker(value)
            resource.append((key, value))
        attributes = [(key, worker(value) if key == sc.RL_WORKER else value) for key, value in s["attributes"]]
        out.append({**s, "resource": (resource, schema), "attributes": attributes})
    return out
