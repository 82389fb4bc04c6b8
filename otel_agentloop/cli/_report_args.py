"""``otel-agentloop report``'s flags: the source (a file or Jaeger), the step, the outputs, and the run flags; and
the one place they become :class:`~._options.ReportOptions` (:func:`options_of`)."""

from __future__ import annotations

import argparse

from ..analysis._reading._opensearch import DEFAULT_INDEX
from ..analysis._reading._options import DEFAULT_SEARCH_DEPTH, DEFAULT_TIMEOUT_S, JaegerOptions, StepOptions
from ..analysis._rendering._terminal import say
from ..config import _local_stack
from ..config._environment import variable
from ._args import MAX_SINCE_MINUTES, Parser, ShowDefaults, count, number, output_file, since_minutes
from ._options import Mode, Outputs, ReportOptions, RunOptions
from ._report import report
from ._run_args import add_run_arguments


def add_report_parser(sub: argparse._SubParsersAction[Parser]) -> None:
    """``report`` and its flags under ``sub``."""
    rep = sub.add_parser(
        "report",
        help="rebuild a step's metrics and waterfalls from a trace file or Jaeger",
        formatter_class=ShowDefaults,
    )
    _add_source_arguments(rep)
    _add_step_arguments(rep)
    _add_output_arguments(rep)
    add_run_arguments(rep)
    rep.set_defaults(func=_command)


def _command(args: argparse.Namespace) -> int:
    """The ``report`` command: 2 with a line for flags that do not go together, else :func:`report`'s status."""
    if not (args.file or args.jaeger):
        say("report: give --file PATH or --jaeger URL", err=True)
        return 2
    if args.file and args.opensearch:
        say("report: --opensearch reads the store of a Jaeger (--jaeger URL), not a trace file", err=True)
        return 2
    return report(options_of(args))


def _mode(args: argparse.Namespace) -> Mode:
    """The view the flags ask for: ``--runs``, else ``--run``, else ``--compare``, else one step."""
    return "runs" if args.runs else "run" if args.run else "compare" if args.compare else "step"


def options_of(args: argparse.Namespace) -> ReportOptions:
    """``report``'s flags (a source given: ``--file`` or ``--jaeger``) as the options every view reads."""
    source: str | JaegerOptions = args.file or JaegerOptions(
        args.jaeger,
        service=args.service,
        since_minutes=args.since_minutes,
        search_depth=args.search_depth,
        timeout_s=args.timeout,
        opensearch=args.opensearch,
        opensearch_index=args.opensearch_index,
    )
    out = Outputs(args.json, args.html, args.png, args.timeline_png, args.perfetto, args.jaeger_ui)
    spans = bool(args.from_spans or args.compare or args.html or args.perfetto or args.timeline_png)
    step = StepOptions(
        args.step, args.validate, args.run_id, args.sample, args.rollout, args.top, all_failed=args.json, spans=spans
    )
    compare = (args.compare[0], args.compare[1]) if args.compare else None
    return ReportOptions(_mode(args), source, step, compare, out, RunOptions(args.steps, args.step_pages))


def _add_source_arguments(rep: argparse.ArgumentParser) -> None:
    """Where to read: ``--file`` or ``--jaeger``, and how to search Jaeger."""
    src = rep.add_mutually_exclusive_group()
    src.add_argument("--file", help="OTLP-JSON lines (the embedded exporter's or the Collector's file exporter's)")
    local = _local_stack.jaeger_url(variable(_local_stack.VARIABLE))  # checked at import: a valid name or unset
    src.add_argument(
        "--jaeger",
        nargs="?",
        const=local,
        metavar="URL",
        help=f"Jaeger query URL; without one, the local stack's ({local}: `make up`, OTEL_AGENTLOOP_STACK's)",
    )
    local_index = _local_stack.opensearch_url(variable(_local_stack.VARIABLE))
    rep.add_argument(
        "--opensearch",
        nargs="?",
        const=local_index,
        metavar="URL",
        help="with --jaeger: read a step's traces straight from the OpenSearch (or Elasticsearch) Jaeger stores "
        f"in, several times faster than through Jaeger; without a URL, the local stack's ({local_index}: "
        "`make up STORE=opensearch`, which `report --jaeger` without a URL also tries)",
    )
    rep.add_argument(
        "--opensearch-index",
        default=DEFAULT_INDEX,
        metavar="PATTERN",
        help="Jaeger's span indices there (its index prefix + jaeger-span-*)",
    )
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
        type=number(0, MAX_SINCE_MINUTES, above=True),
        help="--since in minutes (default: all that Jaeger stores)",
    )
    rep.add_argument(
        "--search-depth",
        type=count(1),
        default=DEFAULT_SEARCH_DEPTH,
        help="traces per Jaeger search (below its limit); a full page is split in time and searched again",
    )
    rep.add_argument(
        "--timeout",
        type=number(0, 3600, above=True),
        default=DEFAULT_TIMEOUT_S,
        help="seconds per Jaeger call (a search for N > 1000 traces: N/1000 times that)",
    )


def _add_step_arguments(rep: argparse.ArgumentParser) -> None:
    """Which step (or two, ``--compare``) and which sample."""
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
    rep.add_argument("--top", type=count(0), default=5, help="how many slowest samples to list")


def _add_output_arguments(rep: argparse.ArgumentParser) -> None:
    """What to write besides the tables: PNGs, pages, Perfetto, JSON; summary or spans."""
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
        type=output_file,
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
