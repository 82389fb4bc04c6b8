"""``otel-agentloop report``: where it reads (a file, a trace folder or Jaeger), which mode it runs (the runs, one
run, a comparison, one step), and the one-line failures (:class:`~._errors.CliError`, exit 1)."""

from __future__ import annotations

import argparse

from .. import semconv as sc
from ..analysis._reading._decode import Skipped, read_jsonl
from ..analysis._reading._jaeger import JaegerError
from ..analysis._reading._jaeger_run import StepNotInRunError, check_step, run_records, summary_run
from ..analysis._reading._report import steps_in
from ..analysis._reading._runs import RunNotFoundError, one_run
from ..analysis._reading._source import JaegerSource, NothingFoundError, jaeger_error_line, open_jaeger, runs_text
from ..analysis._reading._step_view import is_snapshot
from ..analysis._reading._store import StoreError, is_store, read_steps
from ..analysis._reading._stored_step import StepAnswer, from_summary, wants_spans
from ..analysis._reading._summary_check import checked, skipped_line
from ..analysis._reading._text import printable
from ..analysis._rendering._terminal import say
from ..metrics._records import SpanRecord
from ._compare import run_compare
from ._errors import CliError, fail, note
from ._run import run_command
from ._step import print_step, report_step

StepKey = tuple[int, bool]


def report(args: argparse.Namespace) -> int:
    """The ``report`` command: its exit status (a :class:`CliError` is printed as one line, exit 1)."""
    try:
        return _report_or_fail(args)
    except CliError as exc:
        say(f"report: {exc}", err=True)
        return 1


def _report_or_fail(args: argparse.Namespace) -> int:
    if not (args.file or args.jaeger):
        say("report: give --file PATH or --jaeger URL", err=True)
        return 2
    if args.file and args.opensearch:
        say("report: --opensearch reads the store of a Jaeger (--jaeger URL), not a trace file", err=True)
        return 2
    jaeger = _open_source(args)
    try:
        return _report_from(args, jaeger)
    finally:
        if jaeger is not None:
            jaeger.close()


def _report_from(args: argparse.Namespace, jaeger: JaegerSource | None) -> int:
    if args.runs or args.run:
        return run_command(args, jaeger)
    if jaeger is not None and wants_spans(args):  # Jaeger reads the step's traces while the run is chosen
        for step in dict.fromkeys(args.compare or ([args.step] if args.step is not None else [])):
            jaeger.start_step(step)
    source = printable(args.file if jaeger is None else jaeger.label, max_chars=None)
    read = _read(args, jaeger, source)
    if isinstance(read, StepAnswer):  # the step's summary holds all this command prints: its spans are not read
        return print_step(args, read, [], source)
    everything, indexed = read
    loaded = _one_run(args, everything, jaeger, source)
    records = [r for r in loaded if not is_snapshot(r)]  # snapshots of open samples are never counted
    if args.compare:
        return run_compare(
            records,
            *args.compare,
            validate=args.validate,
            top=args.top,
            as_json=args.json,
            html=args.html,
            source=source,
            jaeger_ui=args.jaeger_ui,
        )
    available = _available(loaded, records, indexed)
    if not available:
        raise _nothing_found(args, jaeger, everything)
    return report_step(args, loaded, records, available, source)


def _read(
    args: argparse.Namespace, jaeger: JaegerSource | None, source: str
) -> StepAnswer | tuple[list[SpanRecord], list[StepKey] | None]:
    """From Jaeger, the step's stored summary when it answers the command; else the records (see
    :func:`_load_records`), with a line on stderr for what was skipped."""
    skipped = Skipped()
    try:
        stored = from_summary(args, jaeger, note) if jaeger is not None else None
        if stored is not None:
            return stored
        everything, indexed = _load_records(args, skipped, jaeger)
    except JaegerError as exc:
        raise CliError(jaeger_error_line(exc, args.jaeger)) from None
    if skipped.count:
        say(f"report: {printable(skipped.summary(source), max_chars=400)}", err=True)
    bad = Skipped()
    everything = checked(everything, bad)  # a step summary that cannot be read is no step and verdicts nothing
    if bad.count:
        say(f"report: {printable(skipped_line(bad, source), max_chars=600)}", err=True)
    return everything, indexed


def _one_run(
    args: argparse.Namespace, everything: list[SpanRecord], jaeger: JaegerSource | None, source: str
) -> list[SpanRecord]:
    """One run (``--run-id``, default the latest), each step from its latest attempt: runs are never merged.
    From Jaeger: the run chosen first (``_jaeger_run``), its line always printed, a step it lacks an error."""
    try:
        if jaeger is None:
            return one_run(everything, args.run_id, note)
        run = jaeger.run
        if run is not None and args.step is not None and not args.compare:
            summaries = jaeger.search(lambda _: None, operation=sc.STEP_SUMMARY_SPAN)  # kept: noted once
            check_step(everything, summaries, run, (args.step, args.validate), source)
        return run_records(everything, args.run_id, note, run=run)
    except (RunNotFoundError, StepNotInRunError) as exc:
        raise CliError(printable(str(exc), max_chars=1000)) from None


def _available(loaded: list[SpanRecord], records: list[SpanRecord], indexed: list[StepKey] | None) -> list[StepKey]:
    """The steps there are: with finished spans or snapshots, and those a trace folder's index lists."""
    snapshot_keys = [sc.step_key(r.attributes) for r in loaded if is_snapshot(r)]
    available = sorted(set(steps_in(records)) | {(s, v) for s, v in snapshot_keys if s is not None})
    if indexed is not None:  # a trace directory: the steps its index lists (only the asked ones were read)
        available = sorted(set(indexed) | set(available))
    return available


def _nothing_found(args: argparse.Namespace, jaeger: JaegerSource | None, everything: list[SpanRecord]) -> CliError:
    try:
        return CliError(_nothing(args, jaeger, everything))
    except JaegerError as exc:
        return CliError(jaeger_error_line(exc, args.jaeger))


def _load_records(
    args: argparse.Namespace, skipped: Skipped, jaeger: JaegerSource | None
) -> tuple[list[SpanRecord], list[tuple[int, bool]] | None]:
    """The records to report, and the run's steps when a trace directory's index lists them (else ``None``)."""
    if jaeger is not None:
        jaeger.run = summary_run(jaeger, args.run_id, note)  # the run first (the one --runs marks), then its step
        if args.compare:  # each step's own window (see JaegerSource.step_window); a span in both once
            both = [r for step in dict.fromkeys(args.compare) for r in jaeger.search(note, step=step)]
            return list({(r.trace_id, r.span_id): r for r in both}.values()), None
        return jaeger.search(note, step=args.step), None
    if is_store(args.file):
        keys = None
        if args.compare:
            keys = [(args.compare[0], args.validate), (args.compare[1], args.validate)]
        elif args.step is not None:
            keys = [(args.step, args.validate)]
        try:
            read = read_steps(args.file, args.run_id, keys, args.validate, skipped, note)
            if keys is None and read.chosen is not None:
                args.step = read.chosen[0]  # the step it read: the latest, or the latest with samples
        except StoreError as exc:
            raise CliError(str(exc)) from None
        except RunNotFoundError as exc:
            raise CliError(printable(str(exc), max_chars=1000)) from None
        return read.records, read.steps
    try:
        return list(read_jsonl(args.file, skipped)), None
    except OSError as exc:  # missing, not readable
        raise fail("cannot read", args.file, exc) from None


def _nothing(args: argparse.Namespace, jaeger: JaegerSource | None, found: list[SpanRecord]) -> str:
    """``no sample spans found``, with what was searched and what exists."""
    what = "no sample spans" + (f" for step {args.step}" if args.step is not None else "")
    if jaeger is None:
        return f"{what} found in {printable(args.file, 200)}; {runs_text(found)}"
    if not found and args.step is not None:  # the search was for that step: list the steps there are
        found = jaeger.search(note, operation=sc.STEP_SUMMARY_SPAN) or jaeger.search(note)
    if not found:
        return jaeger.nothing(what)
    return f"{what} found in Jaeger {printable(jaeger.label, 300)} over {jaeger.window_text()}; {runs_text(found)}"


def _open_source(args: argparse.Namespace) -> JaegerSource | None:
    if not args.jaeger:
        return None
    try:
        return open_jaeger(args, note)
    except JaegerError as exc:
        raise CliError(jaeger_error_line(exc, args.jaeger)) from None
    except NothingFoundError as exc:
        raise CliError(printable(str(exc), max_chars=1000)) from None
