"""``otel-agentloop report``: where it reads (a file, a trace folder or Jaeger), the view its options ask for, run
from one table (:data:`VIEWS`: the runs, one run, a comparison, one step), and the one-line failures
(:class:`~._errors.CliError`, exit 1)."""

from __future__ import annotations

from dataclasses import replace

from .. import semconv as sc
from ..analysis._reading._decode import Skipped, read_jsonl
from ..analysis._reading._jaeger import JaegerError
from ..analysis._reading._jaeger_run import StepNotInRunError, check_step, run_records, summary_run
from ..analysis._reading._report import steps_in
from ..analysis._reading._runs import RunNotFoundError, one_run
from ..analysis._reading._source import JaegerSource, NothingFoundError, jaeger_error_line, open_jaeger, runs_text
from ..analysis._reading._step_view import is_snapshot
from ..analysis._reading._store import StoreError, is_store, read_steps
from ..analysis._reading._stored_step import StepAnswer, from_summary
from ..analysis._reading._summary_check import checked, skipped_line
from ..analysis._reading._text import printable
from ..analysis._rendering._terminal import say
from ..metrics._records import SpanRecord
from ._compare import run_compare
from ._errors import CliError, fail, note
from ._options import Mode, ReportOptions, View
from ._run import run_view, runs_view
from ._step import print_step, report_step

StepKey = tuple[int, bool]


def report(options: ReportOptions) -> int:
    """The ``report`` command: its exit status (a :class:`CliError` is printed as one line, exit 1)."""
    try:
        jaeger = _open_source(options)
        try:
            if jaeger is not None and options.step.spans:  # Jaeger reads the step's traces while the run is chosen
                for step in _steps_read(options):
                    jaeger.start_step(step)
            return VIEWS[options.mode](options, jaeger)
        finally:
            if jaeger is not None:
                jaeger.close()
    except CliError as exc:
        say(f"report: {exc}", err=True)
        return 1


def _steps_read(o: ReportOptions) -> list[int]:
    """The steps whose spans a step or compare view reads, when known before the run is (none for the runs)."""
    if o.mode == "compare" and o.compare is not None:
        return list(dict.fromkeys(o.compare))
    if o.mode == "step" and o.step.number is not None:
        return [o.step.number]
    return []


def _step(o: ReportOptions, jaeger: JaegerSource | None) -> int:
    """One step: from Jaeger its stored summary when that answers; else rebuilt from the step's spans."""
    source = _source_text(o, jaeger)
    stored = _from_summary(o, jaeger)
    if stored is not None:  # the step's summary holds all this command prints: its spans are not read
        return print_step(o, stored, [], source)
    everything, indexed, number = _read(o, jaeger, source)
    o = replace(o, step=replace(o.step, number=number))  # a trace folder's: the step it read
    loaded = _one_run(o, everything, jaeger, source, check=True)
    records = [r for r in loaded if not is_snapshot(r)]  # snapshots of open samples are never counted
    available = _available(loaded, records, indexed)
    if not available:
        raise _nothing_found(o, jaeger, everything)
    return report_step(o, loaded, records, available, source)


def _compare(o: ReportOptions, jaeger: JaegerSource | None) -> int:
    """Two steps of one run side by side (``--compare A B``), from their spans."""
    assert o.compare is not None  # Mode "compare" is made from it
    source = _source_text(o, jaeger)
    everything, _, _ = _read(o, jaeger, source)
    loaded = _one_run(o, everything, jaeger, source, check=False)
    return run_compare(
        [r for r in loaded if not is_snapshot(r)],  # snapshots of open samples are never counted
        *o.compare,
        validate=o.step.validate,
        top=o.step.top,
        as_json=o.out.as_json,
        html=o.out.html,
        source=source,
        jaeger_ui=o.out.jaeger_ui,
    )


VIEWS: dict[Mode, View] = {"runs": runs_view, "run": run_view, "compare": _compare, "step": _step}
"""Each :data:`~._options.Mode`'s view."""


def _source_text(o: ReportOptions, jaeger: JaegerSource | None) -> str:
    return printable(o.file if jaeger is None else jaeger.label, max_chars=None)


def _from_summary(o: ReportOptions, jaeger: JaegerSource | None) -> StepAnswer | None:
    """From Jaeger, the step's stored summary when it answers the command (``_stored_step``)."""
    if jaeger is None:
        return None
    try:
        return from_summary(o.step, jaeger, note)
    except JaegerError as exc:
        raise CliError(jaeger_error_line(exc, o.jaeger_url)) from None


def _read(
    o: ReportOptions, jaeger: JaegerSource | None, source: str
) -> tuple[list[SpanRecord], list[StepKey] | None, int | None]:
    """The records (see :func:`_load_records`), with a line on stderr for what was skipped; the run's steps when
    a trace folder's index lists them; the step asked, or the one a trace folder's read chose."""
    skipped = Skipped()
    try:
        everything, indexed, number = _load_records(o, skipped, jaeger)
    except JaegerError as exc:
        raise CliError(jaeger_error_line(exc, o.jaeger_url)) from None
    if skipped.count:
        say(f"report: {printable(skipped.summary(source), max_chars=400)}", err=True)
    bad = Skipped()
    everything = checked(everything, bad)  # a step summary that cannot be read is no step and verdicts nothing
    if bad.count:
        say(f"report: {printable(skipped_line(bad, source), max_chars=600)}", err=True)
    return everything, indexed, number


def _one_run(
    o: ReportOptions, everything: list[SpanRecord], jaeger: JaegerSource | None, source: str, *, check: bool
) -> list[SpanRecord]:
    """One run (``--run-id``, default the latest), each step from its latest attempt: runs are never merged.
    From Jaeger: the run chosen first (``_jaeger_run``), its line always printed; with ``check``, a step asked
    that the run lacks an error."""
    try:
        if jaeger is None:
            return one_run(everything, o.step.run_id, note)
        run = jaeger.run
        if run is not None and o.step.number is not None and check:
            summaries = jaeger.search(lambda _: None, operation=sc.STEP_SUMMARY_SPAN)  # kept: noted once
            check_step(everything, summaries, run, (o.step.number, o.step.validate), source)
        return run_records(everything, o.step.run_id, note, run=run)
    except (RunNotFoundError, StepNotInRunError) as exc:
        raise CliError(printable(str(exc), max_chars=1000)) from None


def _available(loaded: list[SpanRecord], records: list[SpanRecord], indexed: list[StepKey] | None) -> list[StepKey]:
    """The steps there are: with finished spans or snapshots, and those a trace folder's index lists."""
    snapshot_keys = [sc.step_key(r.attributes) for r in loaded if is_snapshot(r)]
    available = sorted(set(steps_in(records)) | {(s, v) for s, v in snapshot_keys if s is not None})
    if indexed is not None:  # a trace directory: the steps its index lists (only the asked ones were read)
        available = sorted(set(indexed) | set(available))
    return available


def _nothing_found(o: ReportOptions, jaeger: JaegerSource | None, everything: list[SpanRecord]) -> CliError:
    try:
        return CliError(_nothing(o, jaeger, everything))
    except JaegerError as exc:
        return CliError(jaeger_error_line(exc, o.jaeger_url))


def _load_records(
    o: ReportOptions, skipped: Skipped, jaeger: JaegerSource | None
) -> tuple[list[SpanRecord], list[StepKey] | None, int | None]:
    """The records to report; the run's steps when a trace directory's index lists them (else ``None``); the step
    asked, or the one a trace directory's read chose when none was."""
    asked = o.step
    if jaeger is not None:
        jaeger.run = summary_run(jaeger, asked.run_id, note)  # the run first (the one --runs marks), then its step
        if o.compare:  # each step's own window (see JaegerSource.step_window); a span in both once
            both = [r for step in dict.fromkeys(o.compare) for r in jaeger.search(note, step=step)]
            return list({(r.trace_id, r.span_id): r for r in both}.values()), None, asked.number
        return jaeger.search(note, step=asked.number), None, asked.number
    path = o.file or ""
    if is_store(path):
        keys = None
        if o.compare:
            keys = [(o.compare[0], asked.validate), (o.compare[1], asked.validate)]
        elif asked.number is not None:
            keys = [(asked.number, asked.validate)]
        try:
            read = read_steps(path, asked.run_id, keys, asked.validate, skipped, note)
        except StoreError as exc:
            raise CliError(str(exc)) from None
        except RunNotFoundError as exc:
            raise CliError(printable(str(exc), max_chars=1000)) from None
        chosen = read.chosen[0] if keys is None and read.chosen is not None else asked.number  # the latest read
        return read.records, read.steps, chosen
    try:
        return list(read_jsonl(path, skipped)), None, asked.number
    except OSError as exc:  # missing, not readable
        raise fail("cannot read", path, exc) from None


def _nothing(o: ReportOptions, jaeger: JaegerSource | None, found: list[SpanRecord]) -> str:
    """``no sample spans found``, with what was searched and what exists."""
    number = o.step.number
    what = "no sample spans" + (f" for step {number}" if number is not None else "")
    if jaeger is None:
        return f"{what} found in {printable(o.file or '', 200)}; {runs_text(found)}"
    if not found and number is not None:  # the search was for that step: list the steps there are
        found = jaeger.search(note, operation=sc.STEP_SUMMARY_SPAN) or jaeger.search(note)
    if not found:
        return jaeger.nothing(what)
    return f"{what} found in Jaeger {printable(jaeger.label, 300)} over {jaeger.window_text()}; {runs_text(found)}"


def _open_source(o: ReportOptions) -> JaegerSource | None:
    if o.jaeger is None:
        return None
    try:
        return open_jaeger(o.jaeger, note)
    except JaegerError as exc:
        raise CliError(jaeger_error_line(exc, o.jaeger_url)) from None
    except NothingFoundError as exc:
        raise CliError(printable(str(exc), max_chars=1000)) from None
