"""``report --step N`` (the default mode): one step's metrics, its slowest samples and a sample's waterfall, from
the step's spans or its stored summary (:class:`~..analysis._reading._stored_step.StepAnswer`); with ``--html``,
``--timeline-png``, ``--perfetto`` and ``--png`` the files too."""

from __future__ import annotations

from dataclasses import dataclass

from ..analysis._reading._gc import gc_paused
from ..analysis._reading._report import build_report, step_verdicts, stored_summaries
from ..analysis._reading._runs import steps_text
from ..analysis._reading._step_view import StepView, build_step_view
from ..analysis._reading._stored_step import SUMMARY, StepAnswer, from_report
from ..analysis._reading._text import printable
from ..analysis._rendering._display import Output
from ..analysis._rendering._html import jaeger_ui_base
from ..analysis._rendering._perfetto import step_trace, write_perfetto
from ..analysis._rendering._terminal import say, say_json
from ..analysis._rendering._timeline_html import write_html
from ..analysis._rendering._timeline_png import render_timeline_png
from ..analysis._rendering._waterfall import render_png
from ..metrics._records import SpanRecord
from ..metrics._verdicts import SampleKey, StepVerdicts
from ._errors import write
from ._options import Outputs, ReportOptions


def report_step(
    o: ReportOptions,
    loaded: list[SpanRecord],
    records: list[SpanRecord],
    available: list[tuple[int, bool]],
    source: str,
) -> int:
    """Rebuild the asked step (default: the last) from its spans, write the asked files, print it."""
    with gc_paused():  # the report, the page and their rows: many objects, few cycles (collected after)
        validate, out = o.step.validate, o.out
        validate_steps = [s for s, v in available if v == validate]
        step = o.step.number if o.step.number is not None else max(validate_steps or [s for s, _ in available])
        # one verdict per sample, from the step's stored summary when the live side wrote one, else from snapshots
        verdicts = step_verdicts(loaded, step, validate, stored_summaries(loaded).get((step, validate)))
        report = build_report(records, step, validate, verdicts)
        view, causes = None, None
        if out.html or out.timeline_png or out.perfetto:  # the report's causes where it read the same spans (no
            causes = report.causes() if len(records) == len(loaded) else None  # snapshots): the report built once
        if out.html or out.timeline_png:
            view = build_step_view(loaded, step, validate, verdicts, causes)
        if not len(report.table) and not (view and view.samples):
            kind = " (validation)" if validate else ""
            say(
                f"report: no samples for step {step}{kind} in {source} (found steps: {steps_text(available)})", err=True
            )
            return 1
        files = _Files(view, loaded, step, validate, source, verdicts, causes)
        return print_step(o, from_report(report, o.step.top), _write_files(out, files), source)


@dataclass
class _Files:
    """What the files of one step are made from: its view (pages), its spans, and its verdicts and causes (the
    report's, ``None`` where they must be made from ``loaded``)."""

    view: StepView | None
    loaded: list[SpanRecord]
    step: int
    validate: bool
    source: str
    verdicts: StepVerdicts
    causes: dict[SampleKey, str] | None


def _write_files(out: Outputs, files: _Files) -> list[str]:
    """``--html``, ``--perfetto`` and ``--timeline-png``: the files asked for; their lines for the output."""
    written = []
    view, loaded, step, source = files.view, files.loaded, files.step, files.source
    html, perfetto, timeline_png = out.html, out.perfetto, out.timeline_png
    if view is not None and html:
        jaeger_ui = out.jaeger_ui
        if jaeger_ui and jaeger_ui_base(jaeger_ui) is None:
            say(f"report: --jaeger-ui {jaeger_ui!r} is not an http(s) URL; the page has no Jaeger links", err=True)
        page = write("--html", html, lambda: write_html(view, html, source=source, jaeger_ui=jaeger_ui))
        written.append(f"timeline page written to {page}")
    if perfetto:
        trace = write(
            "--perfetto",
            perfetto,
            lambda: write_perfetto(
                step_trace(loaded, step, files.validate, source=source, verdicts=files.verdicts, causes=files.causes),
                perfetto,
            ),
        )
        written.append(f"Perfetto trace written to {trace} (open it in ui.perfetto.dev or chrome://tracing)")
    if view is not None and timeline_png:
        png = write("--timeline-png", timeline_png, lambda: render_timeline_png(view, timeline_png))
        written.append(f"timeline PNG written to {png}")
    return written


def print_step(o: ReportOptions, answer: StepAnswer, written: list[str], source: str) -> int:
    """Print one step's answer (``--json`` or tables and the waterfall); ``written``: the files' lines."""
    if o.out.as_json:
        _print_json(answer, written)
        return 0
    show = Output()
    _print_tables(o.step.validate, answer, show, source)
    for line in written:
        show.line(line)
    return _print_waterfall(o, answer, show)


def _print_json(answer: StepAnswer, written: list[str]) -> None:
    say_json(
        {
            "step": answer.step,
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


def _print_tables(validate: bool, answer: StepAnswer, show: Output, source: str) -> None:
    """The step's metrics, its slowest samples and its hung samples."""
    how = "as collected (its rl.step.summary)" if answer.read_from == SUMMARY else "rebuilt"
    show.metrics(
        answer.metrics,
        title=f"== step {answer.step}{' (validation)' if validate else ''}: agent_loop metrics {how} from {source}",
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


def _print_waterfall(o: ReportOptions, answer: StepAnswer, show: Output) -> int:
    """The asked sample's waterfall (default: the slowest), and ``--png``; 1 when it has no spans."""
    asked, png_path = o.step, o.out.png
    key = (asked.sample, asked.rollout) if asked.sample is not None else answer.slowest_sample
    spans = answer.samples.get(key) if key is not None else None
    if not spans or key is None:
        say(f"\nno spans stored for sample {key}", err=True)
        return 1
    title = f"sample {key[0]} (rollout {key[1]}), step {answer.step}, trace {spans[0].trace_id_hex}"
    show.line()
    show.waterfall(spans, title=title)
    if png_path:
        png = write("--png", png_path, lambda: render_png(spans, png_path, title=title))
        show.line(f"waterfall written to {png}")
    return 0
