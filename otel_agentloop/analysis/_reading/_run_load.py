"""A run's records and steps for ``report --runs`` / ``--run``: what to read from a file, a trace folder or Jaeger
(:func:`load`: every span of a small source, else the step summaries only), and the run's steps with their
summaries (:func:`run_steps`: stored, else rebuilt from the step's spans through the live code)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ... import semconv as sc
from ...metrics._records import SpanRecord
from ...metrics._summary import StepSummary
from ._decode import Skipped, read_jsonl
from ._engine_load import with_unstepped_load
from ._report import stored_summaries, summary_of
from ._runs import Run, RunSteps, StepKey, group_runs, select_run, steps_text
from ._source import JaegerSource
from ._step_view import is_snapshot
from ._store import StoreRun, is_store, read_everything, read_index, read_steps, read_summaries, step_bytes
from ._summary_check import checked, skipped_line
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
    index: list[StoreRun] | None = None
    """A trace directory's runs from its index: the runs, attempts and steps (``None``: not a trace directory)."""

    def add_attempts(self, runs: Sequence[Run]) -> None:
        """Give ``runs`` the attempts the index lists (an attempt that has not collected a step yet included)."""
        by_key = {r.key: r for r in self.index or ()}
        for run in runs:
            indexed = by_key.get(run.key)
            for attempt, ns in (indexed.attempt_starts() if indexed else {}).items():
                run.attempt_start_ns[attempt] = min(run.attempt_start_ns.get(attempt, ns), ns)


def load(source: str | JaegerSource, warn: Note, *, full: bool = False) -> Loaded:
    """The run view's records from ``source`` (a trace file or folder's path, or Jaeger): every span of a file up
    to :data:`FULL_READ_BYTES` (or with ``full``); else only the step summaries when the source holds any.
    ``warn`` gets a line for what was skipped and for Jaeger's search notes."""
    if isinstance(source, str):
        return _load_file(source, warn, full=full)
    jaeger = source
    if not full:
        records = _checked(jaeger.search(warn, sc.STEP_SUMMARY_SPAN), jaeger.label, warn)
        if records:
            return Loaded(records, False, [f"searched Jaeger for {sc.STEP_SUMMARY_SPAN} spans only"])
    records = _checked(jaeger.search(warn), jaeger.label, warn)
    note = "" if full else f"Jaeger holds no {sc.STEP_SUMMARY_SPAN} spans for these services: every trace was fetched"
    return Loaded(records, True, [note] if note else [])


def _load_file(path: str, warn: Note, *, full: bool) -> Loaded:
    """A trace folder (:func:`_load_store`), or a file: whole up to :data:`FULL_READ_BYTES`, else its summaries."""
    if is_store(path):
        return _load_store(path, warn, full=full)
    skipped = Skipped()
    size = os.path.getsize(path)
    if not full and size > FULL_READ_BYTES:
        records = _checked(read_summary_lines(path, skipped), path, warn)
        if records:
            note = f"read the step summaries of {path} ({size / 2**20:.0f} MiB), not its sample spans"
            return _with_skipped(Loaded(records, False, [note]), skipped, path, warn)
    records = _checked(read_jsonl(path, skipped), path, warn)
    return _with_skipped(Loaded(records, True), skipped, path, warn)


def _checked(records: Iterable[SpanRecord], source: str, warn: Note) -> list[SpanRecord]:
    """``records`` without the step summaries that cannot be read (``_summary_check``), with one line for them."""
    bad = Skipped()
    kept = checked(records, bad)
    if bad.count:
        warn(skipped_line(bad, source))
    return kept


def _load_store(path: str, warn: Note, *, full: bool) -> Loaded:
    """A trace directory: its index and summaries only (``full``: every segment, for a run without summaries)."""
    skipped = Skipped()
    if full:
        return _with_skipped(Loaded(list(read_everything(path, skipped, warn)), True), skipped, path, warn)
    runs = read_index(path, warn)
    records = read_summaries(path, skipped, warn)
    note = f"read the index and step summaries of {path}, not its sample spans"
    cheap = step_bytes(path, runs) <= FULL_READ_BYTES
    return _with_skipped(Loaded(records, False, [note], cheap, runs), skipped, path, warn)


def index_runs(loaded: Loaded) -> list[Run]:
    """The runs of a trace directory as ``--runs`` and ``--run`` read them: every run its index lists, with its
    attempts and steps from the index (a step that has no stored summary included), and the step summaries read
    for it (a run whose summaries the index does not list too); the one that started first first."""
    runs = {r.key: r for r in group_runs(loaded.records)}
    for indexed in loaded.index or ():
        run = runs.get(indexed.key)
        if run is None:
            run = runs[indexed.key] = Run(indexed.key, indexed.service, first_ns=indexed.first_ns)
        run.indexed = set(indexed.steps())
        run.first_ns = min(run.first_ns, indexed.first_ns)
        run.last_ns = max(run.last_ns, indexed.last_ns)
    loaded.add_attempts(list(runs.values()))
    return sorted(runs.values(), key=lambda r: (r.first_ns, r.key))


def unsummarized(run: Run) -> list[StepKey]:
    """The steps of ``run`` that its index lists and no stored summary covers."""
    return sorted(run.indexed - set(stored_summaries(run.records)))


def store_run_steps(
    path: str, run_id: str | None, steps: tuple[int | None, int | None] | None, warn: Note
) -> tuple[Loaded, RunSteps | None]:
    """``report --run`` from a trace directory: the run (``run_id``, default the latest) and its steps from the
    index, each with its stored summary; a step without one is rebuilt from its step file when the files of such
    steps hold at most :data:`FULL_READ_BYTES` (what ``--step N`` reads), else listed without figures
    (:attr:`RunSteps.unsummarized`). Raises ``RunNotFoundError``, ``StoreError``."""
    loaded = _load_store(path, warn, full=False)
    runs = index_runs(loaded)
    selection = select_run((), run_id, runs=runs)
    if selection is None:
        return loaded, None
    run = selection.run
    missing = {k for k in unsummarized(run) if _within(k, steps)}
    indexed = [r for r in loaded.index or () if r.key == run.key]
    size = step_bytes(path, [StoreRun(run.key, 0, [s for r in indexed for s in r.segments if s.key in missing])])
    unread: list[StepKey] = []
    if missing and size <= FULL_READ_BYTES:
        skipped = Skipped()
        read = read_steps(path, None, missing, False, skipped, warn, run_key_=run.key)
        for rec in read.records:
            if rec.name != sc.STEP_SUMMARY_SPAN and sc.step_key(rec.attributes)[0] is not None:
                run.add(rec)
        _with_skipped(loaded, skipped, path, warn)
        loaded.notes[0] += f", except the step files of the {len(missing)} step(s) without a summary"
    elif missing:
        unread = sorted(missing)
    found = run_steps(run.records, None, steps, False, runs=[run])
    if found is not None and unread:
        found.notes.append(
            f"{_steps_phrase(unread)} no stored summary, and their files ({size / 2**20:.0f} MiB) were not read "
            f"(over {FULL_READ_BYTES >> 20} MiB): listed without figures; report --step N reads one"
        )
    return loaded, found


def _within(key: StepKey, steps: tuple[int | None, int | None] | None) -> bool:
    lo, hi = steps or (None, None)
    return (lo is None or key[0] >= lo) and (hi is None or key[0] <= hi)


def _steps_phrase(keys: Sequence[StepKey]) -> str:
    """``step 3 has`` / ``steps 3, 4; validation: 2 have``."""
    return f"{'step' if len(keys) == 1 else 'steps'} {steps_text(keys)} {'has' if len(keys) == 1 else 'have'}"


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
    records: Sequence[SpanRecord],
    run_id: str | None,
    steps: tuple[int | None, int | None] | None,
    spans_read: bool,
    *,
    runs: Sequence[Run] | None = None,
) -> RunSteps | None:
    """Run ``run_id``'s steps (``steps``: that range) from ``records``, or from ``runs`` (a trace directory's,
    from its index: then every step it lists is shown, rebuilt from its spans or listed without figures)."""
    selection = select_run(records, run_id, runs=runs)
    if selection is None:
        return None
    by_step: dict[StepKey, list[SpanRecord]] = {}
    for rec in selection.records:
        step, validate = sc.step_key(rec.attributes)
        if step is not None and rec.name != sc.STEP_SUMMARY_SPAN:
            key = (step, validate)
            if _within(key, steps):
                by_step.setdefault(key, []).append(rec)
    by_step = with_unstepped_load(by_step, [*selection.records, *_engine_guests(records)])  # issue 36
    summaries = {k: s for k, s in stored_summaries(selection.records).items() if _within(k, steps)}
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
    bare = sorted(k for k in selection.run.indexed if k not in summaries and _within(k, steps))
    read = [k for k in bare if k in by_step]
    if read:
        notes.append(
            f"{_steps_phrase(read)} no stored summary and no finished sample span in their files (trainer spans "
            "only, or samples that never ended): listed without figures"
        )
    if runs is None:
        notes += _gap_notes(summaries, spans_read)
    return RunSteps(selection.run, dict(sorted(summaries.items())), rebuilt, by_step, notes, bare)


def _gap_notes(summaries: dict[StepKey, StepSummary], spans_read: bool) -> list[str]:
    missing = _gaps(summaries) if not spans_read else []
    if not missing:
        return []
    shown = ", ".join(map(str, missing[:20])) + (f" and {len(missing) - 20} more" if len(missing) > 20 else "")
    one = len(missing) == 1
    return [
        f"{'step' if one else 'steps'} {shown} {'has' if one else 'have'} no stored summary and "
        f"{'is' if one else 'are'} not shown (only step summaries were read; report --step N reads a step's "
        "spans)"
    ]


def _engine_guests(records: Sequence[SpanRecord]) -> list[SpanRecord]:
    """The engines' load spans of processes without a run id (an engine server's), drawn with any run's steps."""
    return [r for r in records if r.name == sc.ENGINE_LOAD_SPAN and not r.resource.get(sc.RL_RUN_ID)]


def _gaps(summaries: dict[StepKey, StepSummary]) -> list[int]:
    """The training steps between the first and the last with a summary that have none (only summaries were
    read: a step without one is not known unless it leaves a gap)."""
    train = {step for step, validate in summaries if not validate}
    return [s for s in range(min(train), max(train)) if s not in train] if train else []
