"""``report --runs`` (the runs in a source) and ``report --run`` (one run, step by step; ``--html``: the run page).

Per-step data comes from the step summaries the live side wrote with the traces (``rl.step.summary`` spans), so
the cost does not grow with samples: a large file is scanned for summary lines only (other lines are skipped
without being parsed), and Jaeger is searched for the summary operation only. A trace folder's runs, attempts and
steps come from its index: a step it lists without a readable summary is rebuilt from its step file, or listed
without figures (:func:`store_run_steps`). A step whose spans were read but that has no stored summary is rebuilt
from its spans through the live code (:func:`summary_of`); the page says how many. Timeline pages for steps are
written beside the run page (``run.html`` -> ``run.steps/step-N.html``) for at most ``--step-pages`` steps whose
sample spans the source holds."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from .. import semconv as sc
from ..analysis._reading._decode import Skipped, read_jsonl
from ..analysis._reading._engine_load import with_unstepped_load
from ..analysis._reading._jaeger import JaegerError
from ..analysis._reading._run_load import Loaded, index_runs, load, run_steps, store_run_steps, unsummarized
from ..analysis._reading._runs import Run, RunNotFoundError, RunSteps, StepKey, group_runs, select_run, steps_text
from ..analysis._reading._source import JaegerSource, NothingFoundError, jaeger_error_line, runs_text
from ..analysis._reading._store import StoreError, is_store, read_steps
from ..analysis._reading._text import printable
from ..analysis._rendering._html import jaeger_ui_base
from ..analysis._rendering._run_page import RunPage, write_run_page
from ..analysis._rendering._runs_text import format_table, run_steps_rows, runs_table
from ..analysis._rendering._terminal import counted, say, say_json
from ..analysis._rendering._timeline_html import write_step_pages
from ..metrics._records import SpanRecord
from ._options import ReportOptions, View

DEFAULT_STEP_PAGES = 100
"""Timeline pages written by default (when the sample spans were read anyway)."""


def _warn(line: str) -> None:
    say(f"report: {printable(line, max_chars=600)}", err=True)


def _page_steps(steps: RunSteps, limit: int) -> list[StepKey]:
    """The steps that get a timeline page: all when at most ``limit``, else the ``limit`` slowest by wall time."""
    keys = list(steps.summaries)
    if len(keys) <= limit:
        return keys
    return sorted(sorted(keys, key=lambda k: -steps.summaries[k].wall_s)[:limit])


# -- the views -------------------------------------------------------------------------------------
def runs_view(o: ReportOptions, jaeger: JaegerSource | None) -> int:
    """``report --runs`` from ``--file`` or ``jaeger``: prints the runs; returns the exit status."""
    return _guarded(_runs, o, jaeger)


def run_view(o: ReportOptions, jaeger: JaegerSource | None) -> int:
    """``report --run`` from ``--file`` or ``jaeger``: prints the run's steps, writes the page; returns the exit
    status."""
    return _guarded(_run, o, jaeger)


def _guarded(view: View, o: ReportOptions, jaeger: JaegerSource | None) -> int:
    """``view``'s status; a failure it can name printed as one line on stderr, exit 1."""
    try:
        return view(o, jaeger)
    except StoreError as exc:
        say(f"report: {printable(str(exc), max_chars=1000)}", err=True)
        return 1
    except OSError as exc:
        say(f"report: {printable(exc.filename or '')}: {printable(exc.strerror or type(exc).__name__)}", err=True)
        return 1
    except JaegerError as exc:
        say(f"report: {jaeger_error_line(exc, o.jaeger_url)}", err=True)
        return 1
    except (RunNotFoundError, NothingFoundError) as exc:
        say(f"report: {printable(str(exc), max_chars=1000)}", err=True)
        return 1


def _nothing(
    what: str, source: str, jaeger: JaegerSource | None, records: Sequence[SpanRecord], loaded: Loaded | None = None
) -> str:
    if jaeger is not None and not records:
        return jaeger.nothing(what)
    if loaded is not None and loaded.index:  # a trace folder whose index lists runs, none with a step
        labels = ", ".join(printable(r.label, max_chars=80) for r in loaded.index[-8:])
        return f"{what} found in {printable(source, 200)}; its index lists runs without steps: {labels}"
    return f"{what} found in {printable(source, 200)}; {runs_text(records)}"


def _source(o: ReportOptions, jaeger: JaegerSource | None) -> str:
    return (o.file or "") if jaeger is None else jaeger.label


def _read_from(o: ReportOptions, jaeger: JaegerSource | None) -> str | JaegerSource:
    """What :func:`load` reads: ``jaeger``, else the trace file's or folder's path."""
    return (o.file or "") if jaeger is None else jaeger


def _run(o: ReportOptions, jaeger: JaegerSource | None) -> int:
    source, html = _source(o, jaeger), o.out.html
    if html and not os.path.isdir(os.path.dirname(html) or "."):
        say(f"report: cannot write --html {printable(html)}: no such folder", err=True)
        return 1
    loaded, steps = _steps(o, jaeger)
    if steps is None or not (steps.summaries or steps.unsummarized):
        raise NothingFoundError(_nothing("no steps", source, jaeger, loaded.records, loaded))
    loaded.add_attempts([steps.run])
    notes = loaded.notes + steps.notes
    for line in notes:
        _warn(line)
    if o.out.as_json:
        body = {
            "run": steps.run.label,
            "attempts": steps.run.attempts,
            "steps": [json.loads(s.to_json()) for s in steps.summaries.values()],
            "rebuilt": [list(k) for k in sorted(steps.rebuilt)],
            "unsummarized": [list(k) for k in steps.unsummarized],
        }
        say_json(body)
    if not html:
        if not o.out.as_json:
            say(format_table(_with_bare_steps(run_steps_rows(steps), steps)))
        return 0
    if not steps.summaries:
        raise NothingFoundError(
            f"run {printable(steps.run.label, 200)}: no step has a stored summary or finished sample spans to "
            f"rebuild one (steps {steps_text(steps.unsummarized)}); report --step N reads a step's spans"
        )
    return _write_run_page(o, jaeger, steps, loaded, notes)


def _runs(o: ReportOptions, jaeger: JaegerSource | None) -> int:
    """``report --runs``: from a trace folder, the runs, attempts and steps of its index (a step without a stored
    summary included, its samples not counted); else the runs the records name."""
    source = _source(o, jaeger)
    loaded = load(_read_from(o, jaeger), _warn)
    if loaded.index is not None:
        runs = index_runs(loaded)
    else:
        runs = group_runs(loaded.records)
        loaded.add_attempts(runs)
    if not runs:
        raise NothingFoundError(_nothing("no spans", source, jaeger, loaded.records))
    say(format_table(runs_table(runs)))
    for run in runs if loaded.index is not None else ():
        bare = unsummarized(run)
        if bare:
            _warn(
                f"run {printable(run.label, 80)}: {counted(len(bare), 'step')} of its index ({steps_text(bare)}) "
                "without a stored summary: the samples column leaves them out; report --run reads them from "
                "their spans"
            )
    if not loaded.spans_read and loaded.index is None:
        _warn(
            f"{loaded.notes[0]}: runs that wrote no step summaries (older traces) are not listed; "
            "report --step N --run-id ID still reads them"
        )
    return 0


def _steps(o: ReportOptions, jaeger: JaegerSource | None) -> tuple[Loaded, RunSteps | None]:
    """The run's steps: from a trace folder, its index's (:func:`store_run_steps`); else from the summaries, or
    every span when the run wrote none."""
    run_id, steps = o.step.run_id, o.run.steps
    source = _read_from(o, jaeger)
    if isinstance(source, str) and is_store(source):
        return store_run_steps(source, run_id, steps, _warn)
    loaded = load(source, _warn)
    try:
        return loaded, run_steps(loaded.records, run_id, steps, loaded.spans_read)
    except RunNotFoundError:
        if loaded.spans_read:
            raise
        loaded = load(source, _warn, full=True)  # a run that wrote no summaries: read its spans
        return loaded, run_steps(loaded.records, run_id, steps, loaded.spans_read)


def _with_bare_steps(rows: list[list[str]], steps: RunSteps) -> list[list[str]]:
    """``rows`` with a row per step that has no figures (:attr:`RunSteps.unsummarized`), in step order: the step
    is listed, marked, never shown as zeros."""
    bare = {key: [f"{key[0]}{' val' if key[1] else ''}", "no summary", *(["-"] * (len(rows[0]) - 2))]
            for key in steps.unsummarized}  # fmt: skip
    if not bare:
        return rows
    known = dict(zip(steps.summaries, rows[1:], strict=True))
    return [rows[0], *(known.get(k) or bare[k] for k in sorted({*known, *bare}))]


def _write_run_page(
    o: ReportOptions, jaeger: JaegerSource | None, steps: RunSteps, loaded: Loaded, notes: list[str]
) -> int:
    """The run page and its steps' timeline pages: by default as many as :data:`DEFAULT_STEP_PAGES`, from a file
    read whole or from Jaeger (each chosen step's spans fetched); none from a large file read for its summaries."""
    source, html = _source(o, jaeger), o.out.html or ""
    default = DEFAULT_STEP_PAGES if (loaded.spans_read or loaded.pages_cheap or jaeger is not None) else 0
    page_count = o.run.step_pages if o.run.step_pages is not None else default
    chosen = _page_steps(steps, page_count)
    pages = _write_step_pages(o, jaeger, steps, chosen, loaded.spans_read, source) if chosen else {}
    if len(pages) < len(steps.summaries):
        notes.append(
            f"timeline pages for {len(pages)} of {len(steps.summaries)} steps (--step-pages {page_count}); "
            "for another step: report --step N --html FILE"
        )
    jaeger_ui = jaeger_ui_base(o.out.jaeger_ui)
    write_run_page(RunPage(steps, pages, source, jaeger_ui, notes), html)
    say(f"run page written to {html} ({counted(len(steps.summaries), 'step')}, {counted(len(pages), 'timeline page')})")
    return 0


def _write_step_pages(
    o: ReportOptions,
    jaeger: JaegerSource | None,
    steps: RunSteps,
    chosen: Sequence[StepKey],
    spans_read: bool,
    source: str,
) -> dict[StepKey, str]:
    """Write the chosen steps' timeline pages beside the run page (``--html``); returns their paths relative to
    it."""
    spans = steps.spans
    if not spans_read:  # only summaries were read: fetch the chosen steps' spans now
        spans = _fetch_step_spans(o.file or "", jaeger, steps.run, chosen)
    wanted = {key: spans[key] for key in chosen if spans.get(key)}
    return write_step_pages(wanted, o.out.html or "", source=source, jaeger_ui=o.out.jaeger_ui)


def _fetch_step_spans(
    path: str, jaeger: JaegerSource | None, run: Run, chosen: Sequence[StepKey]
) -> dict[StepKey, list[SpanRecord]]:
    """The chosen steps' spans of ``run``: from Jaeger (each step searched), else from the file at ``path``."""
    wanted = set(chosen)
    out: dict[StepKey, list[SpanRecord]] = {}
    if jaeger is None and is_store(path):
        read = read_steps(path, None, wanted, False, Skipped(), _warn, run_key_=run.key)
        records: list[SpanRecord] = read.records
    elif jaeger is None:
        records = list(read_jsonl(path, Skipped()))
    else:
        records = [r for step in sorted({k[0] for k in wanted}) for r in jaeger.search(_warn, None, step)]
    selection = select_run(records, key=run.key)
    for rec in selection.records if selection else ():
        step, validate = sc.step_key(rec.attributes)
        if step is not None and rec.name != sc.STEP_SUMMARY_SPAN:
            key = (step, validate)
            if key in wanted:
                out.setdefault(key, []).append(rec)
    return with_unstepped_load(out, records)  # the engines' load spans without rl.step, by time (issue 36)
