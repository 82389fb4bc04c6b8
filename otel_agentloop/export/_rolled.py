"""The run-scale trace file: a directory of OTLP-JSON-lines segments, one per step, with a small index.

Layout v1 (read by :mod:`otel_agentloop.analysis._store`)::

    DIR/index.jsonl                  one line per (process, segment), written before the segment's first data
    DIR/summaries.jsonl              every ``rl.step.summary`` span
    DIR/run-<hash>/step-<N>.jsonl    the spans whose ``rl.step`` is N (``val-<N>``: ``rl.validate`` true)
    DIR/run-<hash>/other-<pid>-<ns>.jsonl   spans of no step, rolled every 60 s of write time (or 64 MiB)
    DIR/run-<hash>/load-<pid>-<ns>.jsonl    ``rl.engine.load`` spans of no step, by their start: 60 s each

``<hash>`` is the first 16 hex digits of sha256 of the run key text (``id:<rl.run.id>``, else
``service:<service.name>``); ``N`` is zero-padded to 8 digits (``m00000001`` for -1). A span without ``rl.step``
follows its trace: the exporter remembers the segment of the most recent :data:`MAX_TRACES` trace ids that had
a step (spans of the same batch first). An engine's load span (``rl.engine.load``, a root span) without ``rl.step``
goes to the ``load-`` segment of the 60 s its start falls in (``<ns>``: that period's start; its index line has
``opened_ns`` the period's start, ``until_ns`` its end plus :data:`LOAD_REACH_NS`, the longest window), so a
reader finds it by the time it covers, however late it was written (one with ``rl.step`` goes to that step's file).
Every file is OTLP-JSON lines, written through ``O_APPEND`` in whole lines, so every process of a run (Ray workers,
a resumed attempt) shares it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opentelemetry.sdk.resources import Resource

from .. import semconv as sc
from ..core._record import FastSpan
from ._clean import clean_text
from ._file import FileWriter, OTLPJsonFileExporter, open_append, write_all
from ._otlp_json import encode_line

LAYOUT_VERSION = 1
INDEX = "index.jsonl"
SUMMARIES = "summaries.jsonl"
MAX_FDS = 32
"""Descriptors one process keeps open (the least recently used is closed first)."""
MAX_TRACES = 65_536
"""Trace ids remembered with their step's segment (the most recent)."""
ROLL_NS = 60 * 10**9
"""An unstepped segment takes spans for this long (write time), then the next one opens."""
ROLL_BYTES = 64 << 20
"""... or until it holds this many bytes."""
LOAD_REACH_NS = 60 * 10**9
"""The longest ``rl.engine.load`` window a ``load-`` segment's index line covers past its period (its ``until_ns``
is the period's end plus this), so a reader asking for a time finds a window that began before it."""
ONE_FILE_SUFFIXES = (".jsonl", ".json")


def run_dir(run_id: object, service: object) -> str:
    """The folder of a run: ``run-`` + 16 hex digits of sha256 of ``id:<run id>`` (a non-empty id), else of
    ``service:<service.name>`` (the run identity of ``analysis._runs.run_key``)."""
    text = f"id:{run_id}" if run_id is not None and str(run_id) else f"service:{'?' if service is None else service}"
    return "run-" + hashlib.sha256(clean_text(text).encode("utf-8")).hexdigest()[:16]


def step_file(step: int, validate: bool) -> str:
    """``step-00000003.jsonl``, ``val-00000002.jsonl``, ``step-m00000001.jsonl`` (step -1)."""
    number = f"m{-step:08d}" if step < 0 else f"{step:08d}"
    return f"{'val' if validate else 'step'}-{number}.jsonl"


def is_one_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``file=`` names one OTLP-JSON-lines file (``.jsonl``, ``.json``) rather than a rolled directory."""
    return os.fspath(path).lower().endswith(ONE_FILE_SUFFIXES)


def file_exporter_for(path: str | os.PathLike[str]) -> OTLPJsonFileExporter | RolledDirectoryExporter:
    """The exporter for ``file=``: one file for ``.jsonl``/``.json``, else the rolled directory."""
    return OTLPJsonFileExporter(path) if is_one_file(path) else RolledDirectoryExporter(path)


@dataclass(frozen=True)
class _Run:
    dir: str
    run: str | None
    service: str
    attempt: str | None


@dataclass(eq=False)
class _Segment:
    rel: str
    run: _Run
    step: int | None
    validate: bool
    opened_ns: int = 0
    written: int = 0
    reach_ns: int = 0

    def index_line(self, opened_ns: int) -> bytes:
        entry: dict[str, object] = {
            "v": LAYOUT_VERSION,
            "segment": self.rel,
            "run": self.run.run,
            "service": self.run.service,
            "attempt": self.run.attempt,
            "step": self.step,
            "validate": self.validate,
            "opened_ns": opened_ns,
            "pid": os.getpid(),
        }
        if self.step is None:
            entry["until_ns"] = self.opened_ns + ROLL_NS + self.reach_ns
        return (json.dumps(entry, separators=(",", ":")) + "\n").encode("utf-8")


_SUMMARY = object()  # the routing key of summary spans


def _text(value: object) -> str | None:
    return None if value is None else clean_text(str(value))


class RolledDirectoryExporter(FileWriter):
    """Writes the rolled directory at ``path`` (see the module docstring).

    Like :class:`OTLPJsonFileExporter`: a failed write returns FAILURE for the batch (counted by the export
    processor), never raises; a span that cannot be encoded is left out and counted in ``spans_unencodable``. At
    most :data:`MAX_FDS` descriptors are open; a forked child closes its copies and opens its own.
    """

    folder = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._traces: dict[int, _Segment] = {}
        self._runs: dict[int, tuple[object, _Run]] = {}
        self._steps: dict[tuple[str, int, bool], _Segment] = {}
        self._others: dict[str, _Segment] = {}
        self._loads: dict[tuple[str, int], _Segment] = {}
        self._indexed: set[str] = set()

    def _after_fork(self) -> None:
        super()._after_fork()
        for fd in self._fds.values():  # the child's copies: the parent's descriptors stay open
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        self._others.clear()  # named by pid: the child opens its own
        self._loads.clear()
        self._indexed.clear()  # the child writes its own index lines

    # -- routing ---------------------------------------------------------------------------------------
    def _run(self, resource: Resource | None) -> _Run:
        cached = self._runs.get(id(resource))
        if cached is not None and cached[0] is resource:
            return cached[1]
        attrs: Mapping[str, object] = getattr(resource, "attributes", None) or {}
        run_id, service = attrs.get(sc.RL_RUN_ID), attrs.get("service.name")
        run = _Run(
            run_dir(run_id, service),
            _text(run_id) if run_id is not None and str(run_id) else None,
            _text(service) or "?",
            _text(attrs.get(sc.RL_RUN_ATTEMPT)),
        )
        if len(self._runs) >= 256:
            self._runs.clear()
        self._runs[id(resource)] = (resource, run)
        return run

    def _step(self, run: _Run, step: int, validate: bool) -> _Segment:
        key = (run.dir, step, validate)
        segment = self._steps.get(key)
        if segment is None or segment.run != run:
            if len(self._steps) >= 4096:
                self._steps.clear()
            segment = self._steps[key] = _Segment(f"{run.dir}/{step_file(step, validate)}", run, step, validate)
        return segment

    def _other(self, run: _Run, now: int) -> _Segment:
        segment = self._others.get(run.dir)
        if segment is None or now - segment.opened_ns > ROLL_NS or segment.written > ROLL_BYTES or segment.run != run:
            name = f"{run.dir}/other-{os.getpid()}-{now}.jsonl"
            segment = self._others[run.dir] = _Segment(name, run, None, False, opened_ns=now)
        return segment

    def _load(self, run: _Run, start_ns: int) -> _Segment:
        """The ``load-`` segment of the :data:`ROLL_NS` period ``start_ns`` falls in."""
        period = start_ns - start_ns % ROLL_NS
        segment = self._loads.get((run.dir, period))
        if segment is None or segment.run != run:
            if len(self._loads) >= 256:
                self._loads.clear()
            name = f"{run.dir}/load-{os.getpid()}-{period}.jsonl"
            segment = _Segment(name, run, None, False, opened_ns=period, reach_ns=LOAD_REACH_NS)
            self._loads[(run.dir, period)] = segment
        return segment

    def _route(self, spans: Sequence[FastSpan], now: int) -> dict[object, list[FastSpan]]:
        """The spans by segment (summaries under ``_SUMMARY``). The last resource's run and the last step's
        segment are kept at hand: a batch is mostly one process's spans of one step."""
        traces = self._traces
        groups: dict[object, list[FastSpan]] = {}
        pending: list[tuple[int, _Run, FastSpan]] = []
        attrs: Mapping[str, object]
        last_resource: object = _SUMMARY
        last_key: tuple[_Run | None, int | None, bool] = (None, None, False)
        run: _Run | None = None
        segment: _Segment | None = None
        for s in spans:
            trace_id, name, attrs, resource = s.trace_id, s.name, s.attributes, s.recorder.resource
            if name == sc.STEP_SUMMARY_SPAN:
                groups.setdefault(_SUMMARY, []).append(s)
                continue
            if resource is not last_resource or run is None:
                run, last_resource = self._run(resource), resource
            step, validate = sc.step_key(attrs)
            if step is None:
                if name == sc.ENGINE_LOAD_SPAN:
                    groups.setdefault(self._load(run, max(s.start_ns, 0)), []).append(s)
                else:
                    pending.append((trace_id, run, s))
                continue
            if last_key != (run, step, validate) or segment is None:
                segment, last_key = self._step(run, step, validate), (run, step, validate)
            if traces.get(trace_id) is not segment:  # a trace seen again in its segment keeps its place
                traces.pop(trace_id, None)
                traces[trace_id] = segment
            group = groups.get(segment)
            if group is None:
                group = groups[segment] = []
            group.append(s)
        for trace_id, span_run, s in pending:  # after the whole batch: a child ended before its parent follows it
            groups.setdefault(traces.get(trace_id) or self._other(span_run, now), []).append(s)
        while len(traces) > MAX_TRACES:
            del traces[next(iter(traces))]
        return groups

    # -- writing ---------------------------------------------------------------------------------------
    def _fd(self, rel: str) -> int:
        fd = self._fds.get(rel)
        if fd is not None:
            self._fds.move_to_end(rel)
            return fd
        while len(self._fds) >= MAX_FDS:
            os.close(self._fds.popitem(last=False)[1])
        fd = self._fds[rel] = open_append(os.path.join(self.path, rel))
        return fd

    def _write(self, key: object, data: bytes, now: int) -> None:
        if not isinstance(key, _Segment):
            write_all(self._fd(SUMMARIES), data)
            return
        if key.rel not in self._indexed:
            write_all(self._fd(INDEX), key.index_line(key.opened_ns or now))
            if len(self._indexed) >= MAX_TRACES:
                self._indexed.clear()  # a second line for a segment is harmless: readers deduplicate
            self._indexed.add(key.rel)
        write_all(self._fd(key.rel), data)
        key.written += len(data)

    def _write_batch(self, spans: Sequence[FastSpan]) -> None:
        now = time.time_ns()
        for key, group in self._route(spans, now).items():
            data = self.encoded(group, encode_line)
            if data is not None:
                self._write(key, data, now)

    def _close_files(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
