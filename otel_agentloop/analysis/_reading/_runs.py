"""Runs in stored traces: which records belong to which run, and one run's records with each step read once.

A run is the resource attribute ``rl.run.id`` (:data:`semconv.RL_RUN_ID`); records without one (older files,
code configured without a run id) form one run per ``service.name``, labelled ``(no run id) service NAME`` (a run
whose id is that text is a different run: runs are keyed by id or by its absence, never by the label). A
run's launches are its attempts (``rl.run.attempt``; a resume from a checkpoint is a new attempt and re-runs the
steps after the checkpoint). Every view reads ONE run (default the latest: the one that started last) and never
merges runs; within it, a step recorded by more than one attempt is read from its latest attempt only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ... import semconv as sc
from ...export._clean import clean_text
from ...metrics._records import SpanRecord
from ...metrics._summary import StepSummary
from ._report import stored_summaries
from ._text import printable

NO_RUN_ID = "(no run id)"
"""The label's prefix of a run made of records without ``rl.run.id``: ``(no run id) service NAME``."""

StepKey = tuple[int, bool]
"""A :data:`semconv.StepKey` whose step is an int: the steps a run lists (spans of no step are in none)."""


MAX_ID_CHARS = 120
"""The longest a run id or service name is printed in a listing (a 10,000-character id is cut, ending ``…``)."""

RunKey = tuple[bool, str]
"""A run's identity: (True, its id), or (False, its service name) for records without a run id."""


def run_key(resource: Mapping[str, object]) -> RunKey:
    """The run a record belongs to: its resource's ``rl.run.id``, else one run per service name."""
    run_id = resource.get(sc.RL_RUN_ID)
    if run_id is not None and str(run_id):
        return True, str(run_id)
    return False, str(resource.get("service.name", "?"))


def key_label(key: RunKey) -> str:
    """A run's name for people: its id, else ``(no run id) service NAME``."""
    return key[1] if key[0] else f"{NO_RUN_ID} service {key[1]}"


def steps_text(keys: Iterable[StepKey]) -> str:
    """Steps for people, each once: ``1, 2, 3; validation: 2`` (``none`` without any)."""
    keys = sorted(set(keys))
    train = [str(s) for s, v in keys if not v]
    val = [str(s) for s, v in keys if v]
    text = ", ".join(train) if train else "none"
    return text + (f"; validation: {', '.join(val)}" if val else "")


def attempt_of(resource: Mapping[str, object]) -> str:
    """The record's attempt (``rl.run.attempt`` as text; ``""`` when not set)."""
    attempt = resource.get(sc.RL_RUN_ATTEMPT)
    return "" if attempt is None else str(attempt)


def _step_key(rec: SpanRecord) -> StepKey | None:
    step, validate = sc.step_key(rec.attributes)
    return (step, validate) if step is not None else None


@dataclass
class Run:
    """One run's records and what the listing shows. ``attempts`` are ordered by when each started."""

    key: RunKey
    service: str
    records: list[SpanRecord] = field(default_factory=list)
    attempt_start_ns: dict[str, int] = field(default_factory=dict)
    first_ns: int = 0
    last_ns: int = 0
    indexed: set[StepKey] = field(default_factory=set)
    """The steps a trace folder's index lists for this run (whether or not a summary was read for them)."""

    @property
    def label(self) -> str:
        return key_label(self.key)

    @property
    def has_id(self) -> bool:
        return self.key[0]

    def named(self, run_id: str) -> bool:
        """Whether ``--run-id run_id`` names this run: its id, cleaned as the exporter cleans it (a byte that
        is not UTF-8, read as a lone surrogate, is U+FFFD in the stored id)."""
        return self.key == (True, clean_text(run_id))

    @property
    def attempts(self) -> list[str]:
        return sorted(self.attempt_start_ns, key=lambda a: (self.attempt_start_ns[a], a))

    def steps(self) -> list[StepKey]:
        """(step, validate) pairs with a sample span or a step summary in this run, or in a trace folder's
        index (:attr:`indexed`)."""
        names = (sc.SAMPLE_SPAN, sc.STEP_SUMMARY_SPAN)
        found = {k for r in self.records if r.name in names and (k := _step_key(r)) is not None}
        return sorted(found | self.indexed)

    def samples(self) -> int:
        """Finished sample spans (snapshots of open samples are not counted); when only the step summaries were
        read, the samples they count."""
        spans = sum(r.name == sc.SAMPLE_SPAN and r.attributes.get(sc.RL_SNAPSHOT) is not True for r in self.records)
        if spans:
            return spans
        return sum(s.num_samples for s in stored_summaries(self.records).values())

    def add(self, rec: SpanRecord) -> None:
        self.records.append(rec)
        start = rec.start_ns or rec.end_ns
        attempt = attempt_of(rec.resource)
        known = self.attempt_start_ns.get(attempt)
        if known is None or start < known:
            self.attempt_start_ns[attempt] = start
        self.first_ns = start if not self.first_ns else min(self.first_ns, start)
        self.last_ns = max(self.last_ns, rec.end_ns)


def group_runs(records: Iterable[SpanRecord]) -> list[Run]:
    """The runs of ``records``, the one that started first first."""
    runs: dict[RunKey, Run] = {}
    for rec in records:
        key = run_key(rec.resource)
        run = runs.get(key)
        if run is None:
            run = runs[key] = Run(key, str(rec.resource.get("service.name", "")))
        run.add(rec)
    return sorted(runs.values(), key=lambda r: (r.first_ns, r.key))


@dataclass
class Selection:
    """One run's records as every view reads them: each step from its latest attempt only. ``rerun`` says which
    steps more than one attempt recorded (step -> the attempts, oldest first; the last one is read)."""

    run: Run
    records: list[SpanRecord]
    rerun: dict[StepKey, list[str]]
    other_runs: int

    def notes(self) -> list[str]:
        """Lines for people (stderr, the pages): which run, and what was left out of it."""
        run = self.run
        attempts = run.attempts
        what = f"run {printable(run.label, max_chars=MAX_ID_CHARS)}" + (
            f" ({len(attempts)} attempts)" if len(attempts) > 1 else ""
        )
        lines = [
            what + (f"; {self.other_runs} other run(s) in the source (see --runs, --run-id)" if self.other_runs else "")
        ]
        if self.rerun:
            steps = sorted(self.rerun)
            shown = ", ".join(f"{s}{' (validation)' if v else ''}" for s, v in steps[:10])
            more = f" and {len(steps) - 10} more" if len(steps) > 10 else ""
            latest = sorted({self.rerun[k][-1] for k in steps})
            lines.append(
                f"steps {shown}{more} were recorded by more than one attempt (a resume re-runs steps): each is read "
                f"from its latest attempt ({', '.join(latest)}), the earlier attempts' records of them are left out"
            )
        return lines


@dataclass
class RunSteps:
    """One run's steps in order: a summary per (step, validate), the ones rebuilt from spans, and the spans by
    step when they were read."""

    run: Run
    summaries: dict[StepKey, StepSummary]
    rebuilt: set[StepKey]
    spans: dict[StepKey, list[SpanRecord]]
    notes: list[str]
    unsummarized: list[StepKey] = field(default_factory=list)
    """Steps a trace folder's index lists that have neither a stored summary nor finished sample spans read to
    rebuild one: shown as steps without figures, never as zeros."""


class RunNotFoundError(LookupError):
    """``--run-id`` names a run the source does not hold."""


def select_run(
    records: Iterable[SpanRecord],
    run_id: str | None = None,
    *,
    key: RunKey | None = None,
    runs: Sequence[Run] | None = None,
) -> Selection | None:
    """The records of run ``run_id`` (default: the latest, the one with steps that started last; ``key``: that
    run), each step read from its latest attempt, with the spans of :func:`_guests`; ``None`` when there are no
    records. ``run_id`` is a run's id, or the label ``(no run id) service NAME`` of a run without one when no
    run has that id. ``runs``: the runs to choose from, already grouped (a trace folder's, from its index; then
    ``records`` is not read). Raises :class:`RunNotFoundError` for an unknown id."""
    runs = group_runs(records) if runs is None else list(runs)
    if not runs:
        if run_id is not None:
            raise RunNotFoundError(f"no run '{printable(run_id)}': the source holds no spans")
        return None
    if key is not None:
        found = [r for r in runs if r.key == key]
    elif run_id is None:  # the latest run with steps: an engine's own spans (no run id, no step) are no run
        found = [max([r for r in runs if r.steps()] or runs, key=lambda r: (r.first_ns, r.key))]
    else:
        found = [r for r in runs if r.named(run_id)] or [r for r in runs if not r.has_id and r.label == run_id]
    if not found:
        known = ", ".join(printable(r.label, max_chars=MAX_ID_CHARS) for r in runs[:20])
        raise RunNotFoundError(f"no run '{printable(run_id or '')}' (runs: {known})")
    run = found[0]
    kept, rerun = latest_attempts(run.records, run.attempts)
    return Selection(run, kept + _guests(runs, run, kept), rerun, len(runs) - 1)


def _guests(runs: Sequence[Run], run: Run, kept: Sequence[SpanRecord]) -> list[SpanRecord]:
    """Spans without a run id and without a step in ``run``'s traces: an engine's own spans (vLLM's
    ``llm_request`` under a turn) exported by the engine's provider, which knows no run id."""
    traces = {rec.trace_id for rec in kept}
    return [
        rec
        for other in runs
        if other is not run and not other.has_id
        for rec in other.records
        if rec.trace_id in traces and _step_key(rec) is None
    ]


def latest_attempts(
    records: Sequence[SpanRecord], attempts: Sequence[str]
) -> tuple[list[SpanRecord], dict[StepKey, list[str]]]:
    """``records`` of one run with each (step, validate) read from the latest of ``attempts`` (oldest first)
    that recorded it; records without a step are all kept. Returns them and the steps recorded more than once."""
    order = {a: i for i, a in enumerate(attempts)}
    by_step: dict[StepKey, set[str]] = {}
    for rec in records:
        key = _step_key(rec)
        if key is not None:
            by_step.setdefault(key, set()).add(attempt_of(rec.resource))
    rerun = {k: sorted(a, key=order.__getitem__) for k, a in by_step.items() if len(a) > 1}
    if not rerun:
        return list(records), {}
    latest = {k: a[-1] for k, a in rerun.items()}
    kept = [
        r
        for r in records
        if (key := _step_key(r)) is None or key not in latest or attempt_of(r.resource) == latest[key]
    ]
    return kept, rerun


def one_run(records: Iterable[SpanRecord], run_id: str | None, note: Callable[[str], None]) -> list[SpanRecord]:
    """The records every ``report`` mode reads: run ``run_id`` (default the latest), each step from its latest
    attempt; ``note`` gets a line when the source holds other runs or re-run steps (nothing for a lone run)."""
    selection = select_run(records, run_id)
    if selection is None:
        return []
    if selection.other_runs or selection.rerun or run_id is not None:
        for line in selection.notes():
            note(line)
    return selection.records
