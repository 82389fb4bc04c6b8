"""``report --runs`` (the runs in a source) and ``report --run`` (one run, step by step; ``--html``: the run page).

Per-step data comes from the step summaries the live side wrote with the traces (``rl.step.summary`` spans), so
the cost does not grow with samples: a large file is scanned for summary lines only (other lines are skipped
without being parsed), and Jaeger is searched for the summary operation only. A step whose spans were read but
that has no stored summary is rebuilt from its spans through the live code (:func:`summary_of`); the page says
how many. Timeline pages for steps are written beside the run page (``run.html`` -> ``run.steps/step-N.html``)
for at most ``--step-pages`` steps whose sample spans the source holds.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .. import semconv as sc
from ..metrics._records import SpanRecord
from ..metrics._summary import StepSummary
from ._decode import Skipped, decode_resource_spans, read_jsonl
from ._html import jaeger_ui_base
from ._jaeger import JaegerError
from ._report import stored_summaries, summary_of
from ._runs import Run, RunNotFoundError, RunSteps, StepKey, format_table, group_runs, run_key, runs_table, select_run
from ._source import JaegerSource, NothingFoundError, jaeger_error_line, runs_text
from ._step_view import is_snapshot
from ._store import StoreError, StoreRun, is_store, read_everything, read_index, read_steps, read_summaries, step_bytes
from ._terminal import counted, printable, say, say_json
from ._timeline_html import write_step_pages

FULL_READ_BYTES = 256 << 20
"""A file up to this size is read whole (every span: pages for its steps are cheap); a larger one is scanned
for its step summaries only, unless ``--step-pages`` asks for timeline pages."""
DEFAULT_STEP_PAGES = 100
"""Timeline pages written by default (when the sample spans were read anyway)."""


def _step_range(text: str) -> tuple[int | None, int | None]:
    """An argparse type: ``A:B`` (inclusive), ``A:``, ``:B`` or ``N``."""
    lo, sep, hi = text.partition(":")
    try:
        first = int(lo) if lo.strip() else None
        last = (int(hi) if hi.strip() else None) if sep else first
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a step range (A:B, A:, :B or N)") from None
    if first is not None and last is not None and last < first:
        raise argparse.ArgumentTypeError(f"{text!r}: the range ends before it starts")
    return first, last


def _pages(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer (>= 0)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is out of range (an integer >= 0)")
    return value


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """``report``'s run flags: ``--runs``, ``--run-id``, ``--run``, ``--steps``, ``--step-pages``."""
    parser.add_argument(
        "--runs", action="store_true", help="list the runs in the source (id, attempts, steps, samples, times)"
    )
    parser.add_argument(
        "--run-id", metavar="ID", help="read this run (default: the latest, the one that started last; see --runs)"
    )
    parser.add_argument(
        "--run",
        action="store_true",
        help="the whole run, one line per step; with --html FILE the run page (each step linked to its timeline)",
    )
    parser.add_argument("--steps", metavar="A:B", type=_step_range, help="with --run: only steps A to B (inclusive)")
    parser.add_argument(
        "--step-pages",
        metavar="N",
        type=_pages,
        help="with --run --html: timeline pages for at most N steps (all of the range if it has at most N, else "
        f"the N with the longest rollout wall time; from Jaeger each page's step is fetched); default "
        f"{DEFAULT_STEP_PAGES}, 0 for a file over {FULL_READ_BYTES >> 20} MiB (read for its step summaries only)",
    )


# -- reading ---------------------------------------------------------------------------------------
_NAME = b'"name":"' + sc.STEP_SUMMARY_SPAN.encode() + b'"'
_SPAN_START = b'{"traceId":'
_RESOURCE = b'{"resource":'
_DECODER = json.JSONDecoder()


def _summary_entries(raw: bytes) -> list[Any] | None:
    """The summary spans of one line with their resources, parsed alone (a batch line is ~0.5 MB of sample spans
    around them): each span from its ``{"traceId":`` on, its resource from the enclosing ``{"resource":``, the
    layout the file exporters write. ``None`` when the line is laid out otherwise (then it is parsed whole)."""
    text = raw.decode("utf-8", errors="strict")
    entries: list[Any] = []
    at = text.find(_NAME.decode())
    while at >= 0:
        span_at = text.rfind(_SPAN_START.decode(), 0, at)
        res_at = text.rfind(_RESOURCE.decode(), 0, at)
        if span_at < 0 or res_at < 0:
            return None
        span, _ = _DECODER.raw_decode(text, span_at)
        resource, _ = _DECODER.raw_decode(text, res_at + len(_RESOURCE))
        if not isinstance(span, dict) or span.get("name") != sc.STEP_SUMMARY_SPAN:
            return None
        entries.append({"resource": resource, "scopeSpans": [{"spans": [span]}]})
        at = text.find(_NAME.decode(), at + len(_NAME))
    return entries or None


def _whole_line_entries(raw: bytes) -> list[Any]:
    obj = json.loads(raw)
    entries = obj.get("resourceSpans") if isinstance(obj, dict) else None
    picked: list[Any] = []
    for rs in entries if isinstance(entries, list) else ():
        if not isinstance(rs, dict):
            continue
        spans = [
            s
            for ss in rs.get("scopeSpans") or ()
            if isinstance(ss, dict)
            for s in ss.get("spans") or ()
            if isinstance(s, dict) and s.get("name") == sc.STEP_SUMMARY_SPAN
        ]
        if spans:
            picked.append({"resource": rs.get("resource"), "scopeSpans": [{"spans": spans}]})
    return picked


def lines_with(path: str, needle: bytes) -> Iterator[tuple[int, bytes]]:
    """The lines of the file at ``path`` that contain ``needle``, with their byte offsets. The file is searched
    as one mapped buffer (no per-line work for the lines without it: several GB/s, not Python's ~0.8 GB/s of
    line iteration). Opening the file may raise ``OSError``."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if not size:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            at = mm.find(needle)
            while at >= 0:
                start = mm.rfind(b"\n", 0, at) + 1
                end = mm.find(b"\n", at)
                end = size if end < 0 else end
                yield start, mm[start:end]
                at = mm.find(needle, end)


def read_summary_lines(path: str, skipped: Skipped) -> Iterator[SpanRecord]:
    """The ``rl.step.summary`` spans of an OTLP-JSON-lines file. A line without one is skipped unparsed; in a line
    with one, only the summary spans and their resources are parsed when the layout allows (else the whole line).
    A malformed record is counted in ``skipped`` (``"byte N: ..."``, the line's offset)."""
    for offset, raw in lines_with(path, sc.STEP_SUMMARY_SPAN.encode()):
        where = f"byte {offset}: "
        try:
            try:
                entries = _summary_entries(raw)
            except (ValueError, RecursionError):
                entries = None
            if entries is None:
                entries = _whole_line_entries(raw)
        except (ValueError, RecursionError):
            skipped.add(f"{where}not JSON")
            continue
        yield from decode_resource_spans(entries, skipped, where)


@dataclass
class Loaded:
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


def load(args: argparse.Namespace, jaeger: JaegerSource | None, *, full: bool = False) -> Loaded:
    """The run view's records from ``--file`` or ``jaeger``: every span of a file up to
    :data:`FULL_READ_BYTES` (or with ``full``); else only the step summaries when the source holds any."""
    if jaeger is None and is_store(args.file):
        return _load_store(args.file, full=full)
    if jaeger is None:
        skipped = Skipped()
        size = os.path.getsize(args.file)
        if not full and size > FULL_READ_BYTES:
            records = list(read_summary_lines(args.file, skipped))
            if records:
                note = f"read the step summaries of {args.file} ({size / 2**20:.0f} MiB), not its sample spans"
                return _with_skipped(Loaded(records, False, [note]), skipped, args.file)
        records = list(read_jsonl(args.file, skipped))
        return _with_skipped(Loaded(records, True), skipped, args.file)
    if not full:
        records = jaeger.search(_warn, sc.STEP_SUMMARY_SPAN)
        if records:
            return Loaded(records, False, [f"searched Jaeger for {sc.STEP_SUMMARY_SPAN} spans only"])
    records = jaeger.search(_warn)
    note = "" if full else f"Jaeger holds no {sc.STEP_SUMMARY_SPAN} spans for these services: every trace was fetched"
    return Loaded(records, True, [note] if note else [])


def _load_store(path: str, *, full: bool) -> Loaded:
    """A trace directory: its index and summaries only (``full``: every segment, for a run without summaries)."""
    skipped = Skipped()
    if full:
        return _with_skipped(Loaded(list(read_everything(path, skipped, _warn)), True), skipped, path)
    runs = read_index(path, _warn)
    records = read_summaries(path, skipped, _warn)
    note = f"read the index and step summaries of {path}, not its sample spans"
    cheap = step_bytes(path, runs) <= FULL_READ_BYTES
    summarized = {run_key(r.resource) for r in records}
    unlisted = [r.label for r in runs if r.key not in summarized and r.steps()]
    return _with_skipped(Loaded(records, False, [note], cheap, unlisted, runs), skipped, path)


def _with_skipped(loaded: Loaded, skipped: Skipped, source: str) -> Loaded:
    if skipped.count:
        _warn(skipped.summary(source))
    return loaded


def _warn(line: str) -> None:
    say(f"report: {printable(line, max_chars=600)}", err=True)


# -- the run's steps -------------------------------------------------------------------------------
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


def _gaps(summaries: dict[StepKey, StepSummary]) -> list[int]:
    """The training steps between the first and the last with a summary that have none (only summaries were
    read: a step without one is not known unless it leaves a gap)."""
    train = {step for step, validate in summaries if not validate}
    return [s for s in range(min(train), max(train)) if s not in train] if train else []


def _page_steps(steps: RunSteps, limit: int) -> list[StepKey]:
    """The steps that get a timeline page: all when at most ``limit``, else the ``limit`` slowest by wall time."""
    keys = list(steps.summaries)
    if len(keys) <= limit:
        return keys
    return sorted(sorted(keys, key=lambda k: -steps.summaries[k].wall_s)[:limit])


# -- the command -----------------------------------------------------------------------------------
def run_command(args: argparse.Namespace, jaeger: JaegerSource | None) -> int:
    """``report --runs`` / ``report --run`` from ``--file`` or ``jaeger``: prints, writes the page; returns the
    exit status."""
    try:
        return _run_command(args, jaeger)
    except StoreError as exc:
        say(f"report: {printable(str(exc), max_chars=1000)}", err=True)
        return 1
    except OSError as exc:
        say(f"report: {printable(exc.filename or '')}: {printable(exc.strerror or type(exc).__name__)}", err=True)
        return 1
    except JaegerError as exc:
        say(f"report: {jaeger_error_line(exc, args.jaeger)}", err=True)
        return 1
    except (RunNotFoundError, NothingFoundError) as exc:
        say(f"report: {printable(str(exc), max_chars=1000)}", err=True)
        return 1


def _nothing(what: str, source: str, jaeger: JaegerSource | None, records: Sequence[SpanRecord]) -> str:
    if jaeger is not None and not records:
        return jaeger.nothing(what)
    return f"{what} found in {printable(source, 200)}; {runs_text(records)}"


def _run_command(args: argparse.Namespace, jaeger: JaegerSource | None) -> int:
    source = args.file if jaeger is None else jaeger.label
    if args.runs:
        loaded = load(args, jaeger)
        runs = group_runs(loaded.records)
        loaded.add_attempts(runs)
        if not runs:
            raise NothingFoundError(_nothing("no spans", source, jaeger, loaded.records))
        say(format_table(runs_table(runs)))
        if loaded.unlisted:
            _warn(
                f"runs {', '.join(printable(r, 80) for r in loaded.unlisted[:8])} in the index wrote no step "
                "summaries and are not listed; report --step N --run-id ID reads them"
            )
        elif not loaded.spans_read and loaded.unlisted is None:
            _warn(
                f"{loaded.notes[0]}: runs that wrote no step summaries (older traces) are not listed; "
                "report --step N --run-id ID still reads them"
            )
        return 0
    if args.html and not os.path.isdir(os.path.dirname(args.html) or "."):
        say(f"report: cannot write --html {printable(args.html)}: no such folder", err=True)
        return 1
    loaded = load(args, jaeger)
    try:
        steps = run_steps(loaded.records, args.run_id, args.steps, loaded.spans_read)
    except RunNotFoundError:
        if loaded.spans_read:
            raise
        loaded = load(args, jaeger, full=True)  # a run that wrote no summaries: read its spans
        steps = run_steps(loaded.records, args.run_id, args.steps, loaded.spans_read)
    if steps is None or not steps.summaries:
        raise NothingFoundError(_nothing("no steps", source, jaeger, loaded.records))
    loaded.add_attempts([steps.run])
    notes = loaded.notes + steps.notes
    for line in notes:
        _warn(line)
    if args.json:
        body = {
            "run": steps.run.label,
            "attempts": steps.run.attempts,
            "steps": [json.loads(s.to_json()) for s in steps.summaries.values()],
            "rebuilt": [list(k) for k in sorted(steps.rebuilt)],
        }
        say_json(body)
    if not args.html:
        if not args.json:
            say(format_table(_terminal_rows(steps)))
        return 0
    return _write_run_page(args, jaeger, steps, loaded, notes)


def _write_run_page(
    args: argparse.Namespace, jaeger: JaegerSource | None, steps: RunSteps, loaded: Loaded, notes: list[str]
) -> int:
    """The run page and its steps' timeline pages: by default as many as :data:`DEFAULT_STEP_PAGES`, from a file
    read whole or from Jaeger (each chosen step's spans fetched); none from a large file read for its summaries."""
    source = args.file if jaeger is None else jaeger.label
    default = DEFAULT_STEP_PAGES if (loaded.spans_read or loaded.pages_cheap or jaeger is not None) else 0
    page_count = args.step_pages if args.step_pages is not None else default
    chosen = _page_steps(steps, page_count)
    pages = _write_step_pages(args, jaeger, steps, chosen, loaded.spans_read, source) if chosen else {}
    if len(pages) < len(steps.summaries):
        notes.append(
            f"timeline pages for {len(pages)} of {len(steps.summaries)} steps (--step-pages {page_count}); "
            "for another step: report --step N --html FILE"
        )
    from ._run_page import write_run_page  # the page's template is only loaded when a page is written

    jaeger_ui = jaeger_ui_base(args.jaeger_ui)
    write_run_page(steps, args.html, pages=pages, source=source, jaeger_ui=jaeger_ui, notes=notes)
    say(
        f"run page written to {args.html} ({counted(len(steps.summaries), 'step')}, "
        f"{counted(len(pages), 'timeline page')})"
    )
    return 0


def _write_step_pages(
    args: argparse.Namespace,
    jaeger: JaegerSource | None,
    steps: RunSteps,
    chosen: Sequence[StepKey],
    spans_read: bool,
    source: str,
) -> dict[StepKey, str]:
    """Write the chosen steps' timeline pages beside ``args.html``; returns their paths relative to it."""
    spans = steps.spans
    if not spans_read:  # only summaries were read: fetch the chosen steps' spans now
        spans = _fetch_step_spans(args, jaeger, steps.run, chosen)
    wanted = {key: spans[key] for key in chosen if spans.get(key)}
    return write_step_pages(wanted, args.html, source=source, jaeger_ui=args.jaeger_ui)


def _fetch_step_spans(
    args: argparse.Namespace, jaeger: JaegerSource | None, run: Run, chosen: Sequence[StepKey]
) -> dict[StepKey, list[SpanRecord]]:
    wanted = set(chosen)
    out: dict[StepKey, list[SpanRecord]] = {}
    if jaeger is None and is_store(args.file):
        read = read_steps(args.file, None, wanted, False, Skipped(), _warn, run_key_=run.key)
        records: list[SpanRecord] = read.records
    elif jaeger is None:
        records = list(read_jsonl(args.file, Skipped()))
    else:
        records = [r for step in sorted({k[0] for k in wanted}) for r in jaeger.search(_warn, None, step)]
    selection = select_run(records, key=run.key)
    for rec in selection.records if selection else ():
        step, validate = sc.step_key(rec.attributes)
        if step is not None and rec.name != sc.STEP_SUMMARY_SPAN:
            key = (step, validate)
            if key in wanted:
                out.setdefault(key, []).append(rec)
    return out


def _terminal_rows(steps: RunSteps) -> list[list[str]]:
    rows = [
        ["step", "samples", "wall s", "to median", "tail", "slowest", "gen/tool/score s", "failed/hung/slow", "trace"]
    ]
    for (step, validate), s in steps.summaries.items():
        slow = s.slowest
        rows.append(
            [
                f"{step}{' val' if validate else ''}{' *' if (step, validate) in steps.rebuilt else ''}",
                str(s.num_samples),
                f"{s.wall_s:.2f}",
                f"{s.median_s:.2f}",
                f"{s.tail_s:.2f}",
                f"{slow.index}/{slow.rollout}" if slow else "-",
                f"{slow.generate_s:.2f}/{slow.tool_s:.2f}/{slow.score_s:.2f}" if slow else "-",
                f"{s.counts.get('failed', 0)}/{s.counts.get('hung', 0)}/{s.counts.get('slow', 0)}",
                (slow.trace_id or "-") if slow else "-",
            ]
        )
    return rows
