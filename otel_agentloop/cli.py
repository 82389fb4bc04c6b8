"""``otel-agentloop``: run the simulated agent loop (``simulate``) or rebuild a step from stored traces (``report``)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from . import semconv as sc
from .analysis._compare import run_compare
from .analysis._decode import Skipped, read_jsonl
from .analysis._display import Output
from .analysis._html import jaeger_ui_base
from .analysis._jaeger import JaegerError
from .analysis._perfetto import write_perfetto
from .analysis._report import build_report, step_verdicts, steps_in, stored_summaries
from .analysis._run_report import add_run_arguments, run_command
from .analysis._runs import RunNotFoundError, one_run, steps_text
from .analysis._source import (
    MAX_SINCE_MINUTES,
    JaegerSource,
    NothingFoundError,
    jaeger_error_line,
    open_jaeger,
    runs_text,
    since_minutes,
)
from .analysis._step_view import build_step_view, is_snapshot
from .analysis._store import StoreError, is_store, read_steps
from .analysis._stored_step import SUMMARY, StepAnswer, from_report, from_summary
from .analysis._terminal import printable, say, say_json
from .analysis._timeline_html import write_html
from .analysis._timeline_png import render_timeline_png
from .analysis._waterfall import render_png
from .config._settings import DEFAULT_FILE, PROTOCOLS
from .demo._main import simulate as simulate_in_process
from .demo._trainer import (
    MISBEHAVE_FROM_STEP,
    SLOWDOWN,
)
from .export._rolled import INDEX, is_one_file
from .metrics._records import SpanRecord


def _simulate(args: argparse.Namespace) -> int:
    if args.workers:
        from .demo._ray import simulate_on_ray  # needs the ``ray`` extra

        return simulate_on_ray(args)
    return simulate_in_process(args)


class CliError(Exception):
    """A failure the user can act on: printed as one line on stderr (``report: ...``), exit 1."""


def _fail(what: str, path: str, exc: OSError) -> CliError:
    reason = exc.strerror or type(exc).__name__
    return CliError(f"{what} {printable(path)}: {printable(reason)}")


def _note(line: str) -> None:
    say(f"report: {printable(line, max_chars=1000)}", err=True)


def _load_records(
    args: argparse.Namespace, skipped: Skipped, jaeger: JaegerSource | None
) -> tuple[list[SpanRecord], list[tuple[int, bool]] | None]:
    """The records to report, and the run's steps when a trace directory's index lists them (else ``None``)."""
    if jaeger is not None:
        if args.compare:  # each step's own window (see JaegerSource.step_window); a span in both once
            both = [r for step in dict.fromkeys(args.compare) for r in jaeger.search(_note, step=step)]
            return list({(r.trace_id, r.span_id): r for r in both}.values()), None
        return jaeger.search(_note, step=args.step), None
    if is_store(args.file):
        keys = None
        if args.compare:
            keys = [(args.compare[0], args.validate), (args.compare[1], args.validate)]
        elif args.step is not None:
            keys = [(args.step, args.validate)]
        try:
            read = read_steps(args.file, args.run_id, keys, args.validate, skipped, _note)
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
        raise _fail("cannot read", args.file, exc) from None


def _nothing(args: argparse.Namespace, jaeger: JaegerSource | None, found: list[SpanRecord]) -> str:
    """``no sample spans found``, with what was searched and what exists."""
    what = "no sample spans" + (f" for step {args.step}" if args.step is not None else "")
    if jaeger is None:
        return f"{what} found in {printable(args.file, 200)}; {runs_text(found)}"
    if not found and args.step is not None:  # the search was for that step: list the steps there are
        found = jaeger.search(_note, operation=sc.STEP_SUMMARY_SPAN) or jaeger.search(_note)
    if not found:
        return jaeger.nothing(what)
    return f"{what} found in Jaeger {printable(jaeger.label, 300)} over {jaeger.window_text()}; {runs_text(found)}"


def _write(what: str, path: str, render: Callable[[], str]) -> str:
    try:
        return render()
    except OSError as exc:  # a missing folder, no permission, a directory
        raise _fail(f"cannot write {what}", path, exc) from None


def _report(args: argparse.Namespace) -> int:
    try:
        return _report_or_fail(args)
    except CliError as exc:
        say(f"report: {exc}", err=True)
        return 1


def _open_source(args: argparse.Namespace) -> JaegerSource | None:
    if not args.jaeger:
        return None
    try:
        return open_jaeger(args, _note)
    except JaegerError as exc:
        raise CliError(jaeger_error_line(exc, args.jaeger)) from None
    except NothingFoundError as exc:
        raise CliError(printable(str(exc), max_chars=1000)) from None


def _report_or_fail(args: argparse.Namespace) -> int:
    if not (args.file or args.jaeger):
        say("report: give --file PATH or --jaeger URL", err=True)
        return 2
    jaeger = _open_source(args)
    if args.runs or args.run:
        return run_command(args, jaeger)
    source = printable(args.file if jaeger is None else jaeger.label, max_chars=None)
    skipped = Skipped()
    try:
        stored = from_summary(args, jaeger, _note) if jaeger is not None else None
        if stored is not None:  # the step's summary holds all this command prints: its spans are not read
            return _print_step(args, stored, [], source)
        everything, indexed = _load_records(args, skipped, jaeger)
    except JaegerError as exc:
        raise CliError(jaeger_error_line(exc, args.jaeger)) from None
    if skipped.count:
        say(f"report: {printable(skipped.summary(source), max_chars=400)}", err=True)
    try:  # one run (--run-id, default the latest), each step from its latest attempt: runs are never merged
        loaded = one_run(everything, args.run_id, _note)
    except RunNotFoundError as exc:
        raise CliError(printable(str(exc), max_chars=1000)) from None
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
    snapshot_keys = [sc.step_key(r.attributes) for r in loaded if is_snapshot(r)]
    available = sorted(set(steps_in(records)) | {(s, v) for s, v in snapshot_keys if s is not None})
    if indexed is not None:  # a trace directory: the steps its index lists (only the asked ones were read)
        available = sorted(set(indexed) | set(available))
    if not available:
        try:
            raise CliError(_nothing(args, jaeger, everything))
        except JaegerError as exc:
            raise CliError(jaeger_error_line(exc, args.jaeger)) from None
    return _report_step(args, loaded, records, available, source)


def _report_step(
    args: argparse.Namespace,
    loaded: list[SpanRecord],
    records: list[SpanRecord],
    available: list[tuple[int, bool]],
    source: str,
) -> int:
    validate_steps = [s for s, v in available if v == args.validate]
    step = args.step if args.step is not None else max(validate_steps or [s for s, _ in available])
    # one verdict per sample, from the step's stored summary when the live side wrote one, else from snapshots
    verdicts = step_verdicts(loaded, step, args.validate, stored_summaries(loaded).get((step, args.validate)))
    report = build_report(records, step, args.validate, verdicts)
    view = build_step_view(loaded, step, args.validate, verdicts) if (args.html or args.timeline_png) else None
    if not len(report.table) and not (view and view.samples):
        kind = " (validation)" if args.validate else ""
        say(f"report: no samples for step {step}{kind} in {source} (found steps: {steps_text(available)})", err=True)
        return 1
    written = []
    if view is not None and args.html:
        jaeger_ui = args.jaeger_ui
        if jaeger_ui and jaeger_ui_base(jaeger_ui) is None:
            say(f"report: --jaeger-ui {jaeger_ui!r} is not an http(s) URL; the page has no Jaeger links", err=True)
        page = _write("--html", args.html, lambda: write_html(view, args.html, source=source, jaeger_ui=jaeger_ui))
        written.append(f"timeline page written to {page}")
    if args.perfetto:
        trace = _write(
            "--perfetto",
            args.perfetto,
            lambda: write_perfetto(loaded, step, args.validate, args.perfetto, source=source),
        )
        written.append(f"Perfetto trace written to {trace} (open it in ui.perfetto.dev or chrome://tracing)")
    if view is not None and args.timeline_png:
        png = _write("--timeline-png", args.timeline_png, lambda: render_timeline_png(view, args.timeline_png))
        written.append(f"timeline PNG written to {png}")
    return _print_step(args, from_report(report, args.top), written, source)


def _print_step(args: argparse.Namespace, answer: StepAnswer, written: list[str], source: str) -> int:
    """Print one step's answer (``--json`` or tables and the waterfall); ``written``: the files' lines."""
    step = answer.step
    if args.json:
        say_json(
            {
                "step": step,
                "metrics": dict(answer.metrics),
                "slowest": answer.rows,
                "slowest_trace_id": answer.slowest_trace_id,
                "verdicts": answer.verdicts,
                "read_from": answer.read_from,
            },
            indent=1,
        )
        for line in written:
            say(line, err=True)
        return 0
    how = "as collected (its rl.step.summary)" if answer.read_from == SUMMARY else "rebuilt"
    show = Output()
    show.metrics(
        answer.metrics,
        title=f"== step {step}{' (validation)' if args.validate else ''}: agent_loop metrics {how} from {source}",
    )
    show.line()
    show.slowest(answer.rows)
    if answer.hung:
        hung = [
            f"{s.sample_index}/{s.rollout_n} ({printable(s.phase)}{' ' + printable(s.tool) if s.tool else ''}, "
            f"trace {s.trace_id})"
            for s in answer.hung
        ]
        show.line()
        show.line(
            f"hung samples (still running when the step was collected; not in its metrics): {', '.join(hung)}",
            style="bold red",
        )
    for line in written:
        show.line(line)
    key = (args.sample, args.rollout) if args.sample is not None else answer.slowest_sample
    spans = answer.samples.get(key) if key is not None else None
    if not spans or key is None:
        say(f"\nno spans stored for sample {key}", err=True)
        return 1
    title = f"sample {key[0]} (rollout {key[1]}), step {step}, trace {spans[0].trace_id_hex}"
    show.line()
    show.waterfall(spans, title=title)
    if args.png:
        png = _write("--png", args.png, lambda: render_png(spans, args.png, title=title))
        show.line(f"waterfall written to {png}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error: ``otel-agentloop simulate: error: argument --time-scale: ...``, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class _ShowDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each option's default (``(default: 3)``); an option without one (``None``, a flag) says in
    its own help what happens without it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or action.default is False or "default" in text:
            return text
        return super()._get_help_string(action) or text


def _number(low: float, high: float, *, above: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite float in [low, high] (``(low, high]`` with ``above``)."""
    span = f"{'>' if above else '>='} {low:g} and <= {high:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number (a finite number {span})") from None
        if not math.isfinite(value) or value < low or (above and value == low) or value > high:
            raise argparse.ArgumentTypeError(f"{text!r} is out of range (a finite number {span})")
        return value

    return parse


def _output_file(text: str) -> str:
    """An argparse type: a file path that can be written now (its folder exists and is writable, and the path is
    not a folder), checked up front so that a long run does not fail at its end."""
    folder = os.path.dirname(text) or "."
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{text!r}: no such folder {folder!r}")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder (give a file path)")
    if not os.access(folder, os.W_OK) or (os.path.exists(text) and not os.access(text, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text!r} is not writable")
    return text


def _trace_path(text: str) -> str:
    """An argparse type: where ``simulate --file`` writes, checked up front: one file (``.jsonl``/``.json``), else
    a trace folder: a writable one that is empty or already one (its ``index.jsonl``), or a new one in a writable
    folder."""
    if is_one_file(text):
        return _output_file(text)
    if os.path.isdir(text):
        try:
            entries = os.listdir(text)
        except OSError:
            raise argparse.ArgumentTypeError(f"{text!r} is not readable") from None
        if entries and not os.path.exists(os.path.join(text, INDEX)):
            raise argparse.ArgumentTypeError(
                f"{text!r} is a folder that is neither empty nor a trace folder (no index.jsonl): give a new or "
                "empty folder, or a path ending .jsonl for one file"
            )
        if not os.access(text, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"{text!r} is not writable")
        return text
    if os.path.exists(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a file (give a folder, or a path ending .jsonl for one file)")
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: its folder {folder!r} is missing or not writable")
    return text


def _count(low: int, high: int = 1 << 31) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer (an integer >= {low})") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range (an integer >= {low} and <= {high})")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="otel-agentloop", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser(
        "simulate", help="run the simulated agent loop and print per-step metrics", formatter_class=_ShowDefaults
    )
    sim.add_argument("--steps", type=_count(1), default=3, help="training steps")
    sim.add_argument("--prompts", type=_count(1), default=16, help="prompts per step")
    sim.add_argument("--rollout-n", type=_count(1), default=4, help="rollouts per prompt")
    sim.add_argument(
        "--workers",
        type=_count(0, 1024),
        default=0,
        help="run as a manager plus N Ray actor workers on a local Ray cluster (0: in-process)",
    )
    sim.add_argument("--max-turns", type=_count(1), default=3, help="generation turns per sample, at most")
    sim.add_argument("--time-scale", type=_number(0, 1000), default=1.0, help="multiply every simulated latency")
    sim.add_argument("--seed", type=int, default=0, help="random seed of the simulated latencies")
    sim.add_argument("--service-name", default="otel-agentloop-sim", help="the traces' service.name")
    sim.add_argument("--endpoint", help="OTLP endpoint (default: OTEL_EXPORTER_OTLP_ENDPOINT, else a file)")
    sim.add_argument(
        "--protocol", choices=PROTOCOLS, help="OTLP protocol (default: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc)"
    )
    sim.add_argument(
        "--file",
        type=_trace_path,
        help="also write OTLP-JSON lines here: a directory rolled per step, or one file for a path ending .jsonl "
        f"or .json (default: OTEL_AGENTLOOP_FILE; without an endpoint, ./{DEFAULT_FILE})",
    )
    sim.add_argument(
        "--trace-per",
        choices=("sample", "step"),
        help="one trace per sample or per step (default: OTEL_AGENTLOOP_TRACE_PER, else sample)",
    )
    sim.add_argument("--png", type=_output_file, help="write the slowest sample's waterfall as a PNG")
    sim.add_argument("--json", action="store_true", help="print the metric dicts as JSON")
    sim.add_argument("--quiet", action="store_true", help="no progress bar")
    sim.add_argument("--flush-timeout", type=_number(0, 3600), default=10.0, help="seconds")
    sim.add_argument("--val-every", type=_count(0), default=2, help="a validation pass every N steps (0: none)")
    sim.add_argument("--val-generations", type=_count(0), default=4, help="validation generations to keep")
    sim.add_argument(
        "--misbehave",
        action="store_true",
        help=f"from step {MISBEHAVE_FROM_STEP}: KL spike, a {SLOWDOWN:.0f}x slower rollout, a hung and a "
        "slow tool call (reported by the watchdog, classified hung/slow)",
    )
    sim.add_argument(
        "--live-every",
        type=_number(0.1, 3600),
        default=5.0,
        help="seconds between live-view lines when stderr is not a terminal",
    )
    sim.set_defaults(func=_simulate)

    rep = sub.add_parser(
        "report",
        help="rebuild a step's metrics and waterfalls from a trace file or Jaeger",
        formatter_class=_ShowDefaults,
    )
    src = rep.add_mutually_exclusive_group()
    src.add_argument("--file", help="OTLP-JSON lines (the embedded exporter's or the Collector's file exporter's)")
    src.add_argument("--jaeger", help="Jaeger query URL, e.g. http://127.0.0.1:16686")
    rep.add_argument(
        "--service",
        help="the service to read in Jaeger (default: OTEL_SERVICE_NAME when set, else every service with "
        "agent-loop spans; stderr says which)",
    )
    since = rep.add_mutually_exclusive_group()
    since.add_argument(
        "--since",
        metavar="DURATION",
        dest="since_minutes",
        type=since_minutes,
        help="read Jaeger's traces of the last DURATION only: 90s, 30m, 2h, 7d, 1w (default: all that Jaeger stores)",
    )
    since.add_argument(
        "--since-minutes",
        type=_number(0, MAX_SINCE_MINUTES, above=True),
        help="--since in minutes (default: all that Jaeger stores)",
    )
    rep.add_argument(
        "--search-depth",
        type=_count(1),
        default=500,
        help="traces per Jaeger search (below its limit); a full page is split in time and searched again",
    )
    rep.add_argument(
        "--timeout",
        type=_number(0, 3600, above=True),
        default=10.0,
        help="seconds per Jaeger call (a search for N > 1000 traces: N/1000 times that)",
    )
    rep.add_argument("--step", type=int, help="the step to read (default: the last step found)")
    rep.add_argument("--validate", action="store_true", help="the validation pass of that step")
    rep.add_argument(
        "--compare",
        nargs=2,
        type=int,
        metavar=("A", "B"),
        help="compare step A with step B: per phase and tool side by side, what explains the step-time change, "
        "the samples that moved (--json, --html FILE)",
    )
    rep.add_argument("--sample", type=int, help="draw this sample index (default: the slowest)")
    rep.add_argument("--rollout", type=int, default=0, help="with --sample: the rollout to draw")
    rep.add_argument("--top", type=_count(0), default=5, help="how many slowest samples to list")
    rep.add_argument("--png", help="also write the waterfall as a PNG (needs matplotlib: the plot extra)")
    rep.add_argument(
        "--html",
        metavar="FILE",
        help="write the step timeline page: every sample on one time axis, one self-contained HTML file",
    )
    rep.add_argument(
        "--timeline-png", metavar="FILE", help="write the step timeline as a PNG (needs matplotlib: the plot extra)"
    )
    rep.add_argument(
        "--perfetto",
        metavar="FILE",
        type=_output_file,
        help="write the step as a Chrome Trace Event Format JSON file (Perfetto UI, chrome://tracing): a track "
        "per sample, grouped by worker",
    )
    rep.add_argument(
        "--jaeger-ui",
        metavar="URL",
        help="link the pages' trace ids to the Jaeger UI at URL (default: to each sample's waterfall on the step's "
        "own timeline page; a natively built Jaeger serves no UI)",
    )
    rep.add_argument("--json", action="store_true", help="print JSON instead of tables")
    rep.add_argument(
        "--from-spans",
        action="store_true",
        help="from Jaeger: rebuild the step from every sample's spans, not from the step's stored summary (what "
        "collect() returned; read by default when it holds all that is asked)",
    )
    add_run_arguments(rep)
    rep.set_defaults(func=_report)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
