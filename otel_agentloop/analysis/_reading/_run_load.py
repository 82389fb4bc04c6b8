"""A run's records and steps for ``report --runs`` / ``--run``: what to read from a file, a trace folder or Jaeger
(:func:`load`: every span of a small source, else the step summaries only), and the run's steps with their
summaries (:func:`run_steps`: stored, else rebuilt from the step's spans through the live code)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ... import semconv as sc
from ...metrics._records import SpanRecord
from ...metrics._summary import StepSummary
from ._decode import Skipped, read_jsonl
from ._engine_load import with_unstepped_load
from ._report import stored_summaries, summary_of
from ._runs import Run, RunSteps, StepKey, run_key, select_run
from ._source import JaegerSource
from ._step_view import is_snapshot
from ._store import StoreRun, is_store, read_everything, read_index, read_summaries, step_bytes
from ._summary_lines import read_summary_lines

Note = Callable[[str], None]

FULL_READ_BYTES = 256 << 20
"""A file up to this size is read whole (every span: pages for its steps are cheap); a larger one is scanned
for its step summaries only, unless ``--step-pages`` asks for timeline pages."""


@dataclass
class Loaded:
    """What a run's file or trace directory gave: its records and what they are enough for."""

    records: list[SpanRecord]
    spans_read: bool
    """Every span was read (not just the summaries): steps without a summary can be rebuilt, pages are cheap."""
    notes: list[str] = field(default_factory=list)
    pages_cheap: bool = False
    """Only summaries were read, but the steps' spans are small enough to read for the default timeline pages."""
    unlisted: list[str] | None = None
    """A trace directory: the runs its index lists that wrote no step summary (``None``: not known)."""
    index: list[StoreRun] = field(default_factory=list)
    """A trace directory's runs from its index (their attempts complete what the summaries say)."""

    def add_attempts(self, runs: Sequence[Run]) -> None:
        """Give ``runs`` the attempts the index lists (an attempt that has not collected a step yet included)."""
        by_key = {r.key: r for r in self.index}
        for run in runs:
            indexed = by_key.get(run.key)
            for attempt, ns in (indexed.attempt_starts() if indexed else {}).items():
                run.attempt_start_ns[attempt] = min(run.attempt_start_ns.get(attempt, ns), ns)


def load(args: argparse.Namespace, jaeger: JaegerSource | None, warn: Note, *, full: bool = False) -> Loaded:
    """The run view's records from ``--file`` or ``jaeger``: every span of a file up to
    :data:`FULL_READ_BYTES` (or with ``full``); else only the step summaries when the source holds any. ``warn``
    gets a line for what was skipped and for Jaeger's search notes."""
    if jaeger is None and is_store(args.file):
        return _load_store(args.file, warn, full=full)
    if jaeger is None:
        skipped = Skipped()
        size = os.path.getsize(args.file)
        if not full and size > FULL_READ_BYTES:
            records = list(read_summary_lines(args.file, skipped))
            if records:
                note = f"read the step summaries of {args.file} ({size / 2**20:.0f} MiB), not its sample spans"
                return _with_skipped(Loaded(records, False, [note]), skipped, args.file, warn)
        records = list(read_jsonl(args.file, skipped))
        return _with_skipped(Loaded(records, True), skipped, args.file, warn)
    if not full:
        records = jaeger.search(warn, sc.STEP_SUMMARY_SPAN)
        if records:
            return Loaded(records, False, [f"searched Jaeger for {sc.STEP_SUMMARY_SPAN} spans only"])
    records = jaeger.search(warn)
    note = "" if full else f"Jaeger holds no {sc.STEP_SUMMARY_SPAN} spans for these services: every trace was fetched"
    return Loaded(records, True, [note] if note else [])


def _load_store(path: str, warn: Note, *, full: bool) -> Loaded:
    """A trace directory: its index and summaries only (``full``: every segment, for a run without summaries)."""
    skipped = Skipped()
    if full:
        return _with_skipped(Loaded(list(read_everything(path, skipped, warn)), True), skipped, path, warn)
    runs = read_index(path, warn)
    records = read_summaries(path, skipped, warn)
    note = f"read the index and step summaries of {path}, not its sample spans"
    cheap = step_bytes(path, runs) <= FULL_READ_BYTES
    summarized = {run_key(r.resource) for r in records}
    unlisted = [r.label for r in runs if r.key not in summarized and r.steps()]
    return _with_skipped(Loaded(records, False, [note], cheap, unlisted, runs), skipped, path, warn)


def _with_skipped(loaded: Loaded, skipped: Skipped, source: str, warn: Note) -> Loaded:
    if skipped.count:
        warn(skipped.summary(source))
    return loaded


def _timed(summary: StepSummary, spans: Sequence[SpanRecord]) -> StepSummary:
    """``summary`` with its wall-clock times taken from its finished sample spans when it has none."""
    if summary.start_ns:
        return summary
    roots = [s for s in spans if s.name == sc.SAMPLE_SPAN and not is_snapshot(s)]
    if not roots:
        return summary
    ends = np.sort(np.array([s.end_ns for s in roots], dtype=np.int64))
    return replace(
        summary,
        start_ns=min(s.start_ns for s in roots),
        median_end_ns=int(ends[(len(ends) - 1) // 2]),
        end_ns=int(ends[-1]),
    )


def run_steps(
    records: Sequence[SpanRecord], run_id: str | None, steps: tuple[int | None, int | None] | None, spans_read: bool
) -> RunSteps | None:
    selection = select_run(records, run_id)
    if selection is None:
        return None
    lo, hi = steps or (None, None)

    def wanted(key: StepKey) -> bool:
        return (lo is None or key[0] >= lo) and (hi is None or key[0] <= hi)

    by_step: dict[StepKey, list[SpanRecord]] = {}
    for rec in selection.records:
        step, validate = sc.step_key(rec.attributes)
        if step is not None and rec.name != sc.STEP_SUMMARY_SPAN:
            key = (step, validate)
            if wanted(key):
                by_step.setdefault(key, []).append(rec)
    by_step = with_unstepped_load(by_step, [*selection.records, *_engine_guests(records)])  # issue 36
    summaries = {k: s for k, s in stored_summaries(selection.records).items() if wanted(k)}
    rebuilt: set[StepKey] = set()
    for key, spans in by_step.items():
        finished = [s for s in spans if not is_snapshot(s)]
        if key not in summaries and any(s.name == sc.SAMPLE_SPAN for s in finished):
            summaries[key] = summary_of(finished, key[0], key[1])
            rebuilt.add(key)
        if key in summaries:
            summaries[key] = _timed(summaries[key], finished)
    notes = selection.notes()
    if rebuilt:
        notes.append(f"{len(rebuilt)} of {len(summaries)} steps had no stored summary: rebuilt from their spans")
    missing = _gaps(summaries) if not spans_read else []
    if missing:
        shown = ", ".join(map(str, missing[:20])) + (f" and {len(missing) - 20} more" if len(missing) > 20 else "")
        one = len(missing) == 1
        notes.append(
            f"{'step' if one else 'steps'} {shown} {'has' if one else 'have'} no stored summary and "
            f"{'is' if one else 'are'} not shown (only step summaries were read; report --step N reads a step's "
            "spans)"
        )
    ordered = dict(sorted(summaries.items()))
    return RunSteps(selection.run, ordered, rebuilt, by_step, notes)


def _engine_guests(records: Sequence[SpanRecord]) -> list[SpanRecord]:
    """The engines' load spans of processes without a run id (an engine server's), drawn with any run's steps."""
    return [r for r in records if r.name == sc.ENGINE_LOAD_SPAN and not r.resource.get(sc.RL_RUN_ID)]


def _gaps(summaries: dict[StepKey, StepSummary]) -> list[int]:
    """The training steps between the first and the last with a summary that have none (only summaries were
    read: a step without one is not known unless it leaves a gap)."""
    train = {step for step, validate in summaries if not validate}
    return [s for s in range(min(train), max(train)) if s not in train] if train else []
