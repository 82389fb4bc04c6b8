"""Reading the rolled trace directory (layout v1, written by ``export._rolled``) at the cost of what is asked.

One step (``report --step N``, the default latest step, ``--perfetto``, the pages) reads ``index.jsonl``, the
chosen run's ``step-N`` (``val-N``) file, the run's lines of ``summaries.jsonl``, and the ``other-*`` segments
(spans of no step) whose ``[opened_ns - 60 s, until_ns]`` overlaps the step's spans' time range: the run's own,
and those of runs without a run id (an engine's own spans under a turn). ``--compare A B``: the same for two
steps. ``--run``/``--runs``: ``index.jsonl`` and ``summaries.jsonl`` only. Nothing else is opened.

The index is untrusted input: a line that does not parse is skipped with a note; a segment it names that is gone
is skipped with a note; a step file that cannot be read is an error (:class:`StoreError`, one line).
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from ... import semconv as sc
from ...export._rolled import INDEX, ROLL_NS, SUMMARIES
from ...metrics._records import SpanRecord
from ._decode import Skipped, read_jsonl
from ._report import stored_summaries
from ._runs import MAX_ID_CHARS, RunKey, RunNotFoundError, StepKey, key_label, run_key
from ._summary_check import checked, skipped_line
from ._text import printable

Note = Callable[[str], None]


class StoreError(OSError):
    """The directory, its index or a step file it needs cannot be read; the message is one line for people."""


@dataclass
class Segment:
    """One segment as the index describes it (every process's line for it merged)."""

    rel: str
    run: RunKey
    step: int | None
    validate: bool
    opened_ns: int
    until_ns: int = 0
    attempts: dict[str, int] = field(default_factory=dict)
    """Each attempt that wrote into it (``""``: none set) -> when it first did."""
    service: str = "?"

    @property
    def key(self) -> StepKey | None:
        return (self.step, self.validate) if self.step is not None else None


@dataclass
class StoreRun:
    """One run of the index: its segments and when it first wrote."""

    key: RunKey
    first_ns: int
    segments: list[Segment] = field(default_factory=list)
    service: str = "?"

    @property
    def last_ns(self) -> int:
        """When its last segment opened (the index holds no end times)."""
        return max((s.opened_ns for s in self.segments), default=self.first_ns)

    @property
    def label(self) -> str:
        return key_label(self.key)

    def steps(self) -> list[StepKey]:
        return sorted({k for s in self.segments if (k := s.key) is not None})

    def attempt_starts(self) -> dict[str, int]:
        """Each attempt of the run -> when it first wrote (from the index)."""
        out: dict[str, int] = {}
        for seg in self.segments:
            for attempt, ns in seg.attempts.items():
                out[attempt] = min(out.get(attempt, ns), ns)
        return out


def is_store(path: str) -> bool:
    """Whether ``--file`` names a directory (the rolled layout) rather than one file."""
    return os.path.isdir(path)


def _entry(line: bytes) -> Segment:
    obj = json.loads(line)
    if not isinstance(obj, dict) or obj.get("v") != 1:
        raise ValueError("not a layout v1 entry")
    rel, step, opened = obj.get("segment"), obj.get("step"), obj.get("opened_ns")
    run, service = obj.get("run"), obj.get("service")
    if not isinstance(rel, str) or not rel.endswith(".jsonl") or ".." in rel.split("/") or rel.startswith("/"):
        raise ValueError("no valid segment path")
    if (step is not None and type(step) is not int) or type(opened) is not int:
        raise ValueError("step or opened_ns is not an integer")
    service = service if isinstance(service, str) else "?"
    resource: dict[str, object] = {"service.name": service}
    if isinstance(run, str) and run:
        resource[sc.RL_RUN_ID] = run
    until = obj.get("until_ns")
    until = until if type(until) is int else 0
    attempt = obj.get("attempt")
    attempts = {"" if attempt is None else str(attempt): opened}
    key = run_key(resource)
    return Segment(rel, key, step, obj.get("validate") is True, opened, until, attempts, service)


def read_index(path: str, note: Note) -> list[StoreRun]:
    """The runs of the directory ``path`` from its index, the one that started first first; a line that does not
    parse is skipped (one note with the count and the first). Raises :class:`StoreError`."""
    try:
        with open(os.path.join(path, INDEX), "rb") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        reason = "no index.jsonl (not a trace directory)" if exc.errno == errno.ENOENT else exc.strerror
        raise StoreError(f"cannot read {printable(path, 200)}: {reason}") from None
    segments: dict[str, Segment] = {}
    bad = Skipped()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            seg = _entry(line)
        except (ValueError, RecursionError) as exc:
            bad.add(f"{INDEX} line {number}: {exc}")
            continue
        known = segments.get(seg.rel)
        if known is None:
            segments[seg.rel] = seg
        else:  # another process's line for the same segment
            known.opened_ns = min(known.opened_ns, seg.opened_ns)
            known.until_ns = max(known.until_ns, seg.until_ns)
            for attempt, ns in seg.attempts.items():
                known.attempts[attempt] = min(known.attempts.get(attempt, ns), ns)
    if bad.count:
        note(bad.summary(printable(path, 200)).replace("malformed record", "malformed index line"))
    runs: dict[RunKey, StoreRun] = {}
    for seg in segments.values():
        run = runs.setdefault(seg.run, StoreRun(seg.run, seg.opened_ns, service=seg.service))
        run.first_ns = min(run.first_ns, seg.opened_ns)
        run.segments.append(seg)
    return sorted(runs.values(), key=lambda r: (r.first_ns, r.key))


def choose_run(runs: list[StoreRun], run_id: str | None) -> StoreRun:
    """Run ``run_id`` (its id, or the label of a run without one), default the latest run with steps (the one
    whose first segment opened last). Raises :class:`RunNotFoundError`."""
    if run_id is None:
        stepped = [r for r in runs if r.steps()] or runs
        if stepped:
            return max(stepped, key=lambda r: (r.first_ns, r.key))
        raise RunNotFoundError("the directory's index lists no segments")
    found = [r for r in runs if r.key == (True, run_id)] or [r for r in runs if not r.key[0] and r.label == run_id]
    if not found:
        known = ", ".join(printable(r.label, max_chars=MAX_ID_CHARS) for r in runs[:20]) or "none"
        raise RunNotFoundError(f"no run '{printable(run_id)}' (runs: {known})")
    return found[0]


def _read(path: str, rel: str, skipped: Skipped, note: Note, *, required: bool) -> list[SpanRecord]:
    """A segment's spans. A segment that is gone: a note; one that cannot be read: :class:`StoreError` when
    ``required`` (a step asked for), else a note."""
    full = os.path.join(path, rel)
    try:
        return list(read_jsonl(full, skipped, f"{rel} "))
    except OSError as exc:
        reason = printable(exc.strerror or type(exc).__name__)
        if required and exc.errno != errno.ENOENT:
            raise StoreError(f"cannot read {printable(full, 300)}: {reason}") from None
        note(f"segment {printable(rel, 200)} listed in the index cannot be read ({reason}): skipped")
        return []


def read_summaries(path: str, skipped: Skipped, note: Note, run: RunKey | None = None) -> list[SpanRecord]:
    """The step summary spans of ``summaries.jsonl`` (of run ``run`` only, when given), each checked
    (``_summary_check.checked``: one that cannot be read is left out, with a note)."""
    if not os.path.lexists(os.path.join(path, SUMMARIES)):
        return []
    bad = Skipped()
    records = checked(_read(path, SUMMARIES, skipped, note, required=False), bad)
    if bad.count:
        note(skipped_line(bad, printable(os.path.join(path, SUMMARIES), 200)))
    return records if run is None else [r for r in records if run_key(r.resource) == run]


@dataclass
class StepRead:
    """What one-step reading found: the records, and the run's steps (from the index)."""

    records: list[SpanRecord]
    steps: list[StepKey]
    run: StoreRun
    chosen: StepKey | None = None
    """The step read when none was asked for."""


def default_step(run: StoreRun, validate: bool) -> StepKey | None:
    """The latest step of ``run`` (of the validation passes with ``validate``, when it has any), as ``report``
    without ``--step`` reads it."""
    steps = run.steps()
    wanted = [k for k in steps if k[1] == validate] or steps
    return max(wanted) if wanted else None


def read_steps(
    path: str,
    run_id: str | None,
    keys: Iterable[StepKey] | None,
    validate: bool,
    skipped: Skipped,
    note: Note,
    *,
    run_key_: RunKey | None = None,
) -> StepRead:
    """The records ``report`` needs for steps ``keys`` (default: the latest step, or when its file holds no
    sample span, the latest with a stored summary that counts samples) of run ``run_id`` (default: the latest run;
    ``run_key_``: that run). Raises :class:`StoreError`, :class:`RunNotFoundError`."""
    runs = read_index(path, note)
    keyed = [r for r in runs if r.key == run_key_]
    run = keyed[0] if keyed else choose_run(runs, run_id)
    summaries = read_summaries(path, skipped, note, run.key)
    chosen = None
    if keys is not None:
        records = _step_records(path, run, set(keys), skipped, note)
    else:  # the latest step; when its file holds no sample (trainer spans only), the latest summarized one
        chosen = default_step(run, validate)
        records = _step_records(path, run, {chosen}, skipped, note) if chosen is not None else []
        if chosen is not None and not any(r.name == sc.SAMPLE_SPAN for r in records):
            counted = [k for k, s in stored_summaries(summaries).items() if s.num_samples and k[1] == chosen[1]]
            if counted and max(counted) != chosen:
                chosen = max(counted)
                records = _step_records(path, run, {chosen}, skipped, note)
    if records:
        lo = min(r.start_ns for r in records)
        hi = max(r.end_ns for r in records)
        for other in runs:
            if other is not run and other.key[0]:
                continue  # another run's own spans: never read
            for seg in other.segments:
                if seg.step is None and seg.opened_ns - ROLL_NS <= hi and (seg.until_ns or seg.opened_ns) >= lo:
                    records += _read(path, seg.rel, skipped, note, required=False)
    return StepRead(records + summaries, run.steps(), run, chosen)


def _step_records(path: str, run: StoreRun, wanted: set[StepKey], skipped: Skipped, note: Note) -> list[SpanRecord]:
    records: list[SpanRecord] = []
    for seg in run.segments:
        if seg.key in wanted:
            records += _read(path, seg.rel, skipped, note, required=True)
    return records


def read_everything(path: str, skipped: Skipped, note: Note) -> Iterator[SpanRecord]:
    """Every span of the directory: each segment the index lists, then the summaries (for a run that wrote no
    summaries, and :func:`read_traces`)."""
    for run in read_index(path, note):
        for seg in run.segments:
            yield from _read(path, seg.rel, skipped, note, required=False)
    yield from read_summaries(path, skipped, note)


def step_bytes(path: str, runs: list[StoreRun]) -> int:
    """The bytes of every segment of ``runs`` (``stat`` only: nothing is read)."""
    total = 0
    for run in runs:
        for seg in run.segments:
            try:
                total += os.stat(os.path.join(path, seg.rel)).st_size
            except OSError:
                continue
    return total


def read_traces(path: str, skipped: Skipped | None = None) -> Iterator[SpanRecord]:
    """Every span stored at ``path``: one OTLP-JSON-lines file, or a rolled trace directory (every segment).
    Opening may raise ``OSError``."""
    if not is_store(path):
        yield from read_jsonl(path, skipped)
        return
    yield from read_everything(path, skipped if skipped is not None else Skipped(), lambda _line: None)
