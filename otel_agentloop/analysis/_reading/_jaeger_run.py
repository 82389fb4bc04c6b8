"""Which run ``report --jaeger`` reads: the run first, then the step, as from a trace folder.

The run is chosen from the step summaries (``rl.step.summary`` spans: one search, shared with the summary answer
and the steps' windows): ``--run-id``, else the latest, the one ``report --runs`` marks. Then the step's spans are
searched (within that run's window for the step) and only that run's are read: a step the run does not have is
an error naming the runs that have it, never another run's step read as this one's (a relaunch with fewer steps
used to show the older run's step N as today's). Runs without any summary (older traces) are chosen from the
spans, as before. The ``run ...`` line is always printed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from ... import semconv as sc
from ...metrics._records import SpanRecord
from ._runs import MAX_ID_CHARS, Run, RunNotFoundError, StepKey, group_runs, select_run, steps_text
from ._source import JaegerSource
from ._text import printable

Note = Callable[[str], None]


class StepNotInRunError(LookupError):
    """The chosen run has no such step; the message says which steps it has and which runs have that one."""


def summary_run(jaeger: JaegerSource, run_id: str | None, note: Note) -> Run | None:
    """The run ``run_id`` names, else the latest (the one ``report --runs`` marks), among the runs with step
    summaries in ``jaeger``; ``None`` when none has a summary or ``run_id`` names none of them (the run is then
    chosen from the spans). Raises :class:`~._jaeger.JaegerError`."""
    records = jaeger.search(note, operation=sc.STEP_SUMMARY_SPAN)
    try:
        selection = select_run(records, run_id)
    except RunNotFoundError:
        return None
    return selection.run if selection is not None else None


def run_records(
    records: Iterable[SpanRecord], run_id: str | None, note: Note, *, run: Run | None = None
) -> list[SpanRecord]:
    """The records of run ``run`` (chosen first: :func:`summary_run`), else of ``run_id`` (default the latest), each
    step from its latest attempt; ``note`` always gets the ``run ...`` line. Raises :class:`RunNotFoundError`."""
    records = list(records)
    runs = group_runs(records)  # once: 41,000 records of a big step take a second to group
    if run is not None and not any(r.key == run.key for r in runs):
        raise RunNotFoundError(f"run {printable(run.label, max_chars=MAX_ID_CHARS)} has no spans here")
    selection = select_run(records, run_id, key=run.key if run is not None else None, runs=runs)
    if selection is None:
        return []
    for line in selection.notes():
        note(line)
    return selection.records


def check_step(
    records: Sequence[SpanRecord], summaries: Sequence[SpanRecord], run: Run, key: StepKey, source: str
) -> None:
    """Raise :class:`StepNotInRunError` when neither ``records`` (the step's search) nor ``summaries`` hold a
    sample span or a summary of step ``key`` in ``run``, naming the run's steps and the runs that have it."""
    runs = group_runs([*records, *summaries])
    steps = {r.key: set(r.steps()) for r in runs}
    if key in steps.get(run.key, set()):
        return
    step, validate = key
    kind = " (validation)" if validate else ""
    found = steps_text(steps.get(run.key, set()) | set(run.steps()))
    label = printable(run.label, max_chars=MAX_ID_CHARS)
    line = f"no samples for step {step}{kind} in run {label} in {source} (found steps: {found})"
    others = [r for r in runs if r.key != run.key and key in steps[r.key]]
    if others:
        named = ", ".join(printable(r.label, max_chars=MAX_ID_CHARS) for r in others[-5:])
        flag = "--validate " if validate else ""
        line += (
            f"; step {step}{kind} is in run {named} (report --run-id {printable(others[-1].label, MAX_ID_CHARS)} "
            f"{flag}--step {step})"
        )
    raise StepNotInRunError(line)
