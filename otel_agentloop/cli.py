"""``otel-agentloop``: run the simulated agent loop (``simulate``) or rebuild a step from stored traces (``report``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from . import semconv as sc
from ._configure import Handle, configure
from .analysis._display import Output
from .analysis._display import info_stream as _info
from .analysis._progress import Progress
from .analysis._report import build_report, steps_in
from .analysis._step_view import HUNG, build_step_view, is_snapshot
from .analysis._timeline import TimelineRecorder
from .analysis._timeline_html import jaeger_ui_base, write_html
from .analysis._timeline_png import render_timeline_png
from .analysis._waterfall import render_png
from .config._settings import PROTOCOLS
from .core import _context as ctx
from .core._trainer import trainer_phase
from .demo._agent import SimConfig, run_samples
from .demo._trainer import (
    MISBEHAVE_FROM_STEP,
    SLOWDOWN,
    format_alerts,
    format_generations,
    run_trainer_phases,
    slowdown,
    summary_text,
    trainer_metrics,
    validation_config,
)
from .export._otlp_json import decode_resource_spans, read_jsonl
from .health._training import Alert, HealthMonitor
from .health._validation import ValidationCapture
from .health._watchdog import WatchdogSettings
from .metrics._records import SpanRecord
from .metrics._table import StepMetrics


def _simulate(args: argparse.Namespace) -> int:
    if args.workers:
        from .demo._ray import simulate_on_ray  # needs the ``ray`` extra

        return simulate_on_ray(args)
    cfg = sim_config(args)
    timelines = TimelineRecorder()
    handle = configure(
        args.service_name,
        endpoint=args.endpoint,
        protocol=args.protocol,
        file=args.file,
        trace_per=args.trace_per,
        processors=[timelines],
        watchdog=sim_watchdog(args),
    )
    monitor = HealthMonitor(log=False)  # alerts are printed below
    print(
        f"otel-agentloop simulate: {args.steps} steps x {len(cfg.work())} samples; traces -> {handle.description}",
        file=_info(args),
    )
    results: list[dict[str, Any]] = []
    try:
        for step in range(1, args.steps + 1):
            step_cfg = replace(
                cfg, time_scale=cfg.time_scale * slowdown(step, args.misbehave), **misbehaviour(step, args.misbehave)
            )
            bar = Progress(
                len(cfg.work()),
                f"step {step}",
                enabled=not args.quiet,
                inflight=handle.inflight,
                live_every_s=args.live_every,
            )
            timing_raw: dict[str, float] = {}
            t0 = time.perf_counter()
            with ctx.step(step):
                with trainer_phase("gen", timing_raw):
                    outcomes, metrics = asyncio.run(_rollout_and_collect(step_cfg, step, bar.advance, handle))
                run_trainer_phases(timing_raw, cfg.time_scale)
                step_s = time.perf_counter() - t0  # rollout + update; the validation pass is not counted
                bar.close()
                spans = timelines.pop(step)
                capture = None
                val_outcomes: list[float | BaseException] = []
                if args.val_every and step % args.val_every == 0:
                    capture = ValidationCapture(args.val_generations, seed=args.seed)
                    with ctx.step(step, validate=True), trainer_phase("testing", timing_raw):
                        val_outcomes = asyncio.run(_rollout(validation_config(cfg), step, None, capture))
                    handle.metrics.collect(step, validate=True)
                    timelines.pop(step, validate=True)
                rewards = [o for o in outcomes if isinstance(o, float)]
                val_rewards = [o for o in val_outcomes if isinstance(o, float)] if capture else []
                trainer = trainer_metrics(step, cfg.seed, rewards, step_s, args.misbehave, val_rewards)
                alerts = monitor.observe(step, trainer)  # alerts become events on the step span
            failed = sum(isinstance(o, BaseException) for o in outcomes)
            _report_step(args, results, StepOutcome(step, metrics, failed, trainer, timing_raw, alerts, capture, spans))
    finally:
        flushed = handle.force_flush(args.flush_timeout)
        stats = handle.stats
        handle.shutdown(args.flush_timeout)
    return _finish(args, results, monitor, stats, flushed, handle.description)


@dataclass
class StepOutcome:
    """What one simulated step produced, for printing and for ``--json``."""

    step: int
    metrics: StepMetrics
    failed: int
    trainer: dict[str, float]
    timing_raw: dict[str, float]
    alerts: list[Alert]
    capture: ValidationCapture | None
    spans: dict[tuple[int, int], list[SpanRecord]]


def _report_step(args: argparse.Namespace, results: list[dict[str, Any]], out: StepOutcome, where: str = "") -> None:
    results.append(
        {
            "step": out.step,
            "metrics": dict(out.metrics),
            "slowest_trace_id": out.metrics.slowest_trace_id,
            "hung_trace_ids": list(out.metrics.hung_trace_ids),
            "slow_trace_ids": list(out.metrics.slow_trace_ids),
            "failed_samples": out.failed,
            "trainer": out.trainer,
            "timing_raw": out.timing_raw,
            "alerts": [a.rule for a in out.alerts],
            "validation_generations": out.capture.result() if out.capture else None,
        }
    )
    if args.json:
        return
    show = Output()
    _print_step(show, out.step, out.metrics, out.failed, out.spans, args.png, where=where)
    if out.capture is not None:
        show.line()
        show.line(format_generations(out.capture))
    if out.alerts:
        show.line()
        show.line(format_alerts(out.alerts), style="bold red")


def _finish(
    args: argparse.Namespace,
    results: list[dict[str, Any]],
    monitor: HealthMonitor,
    stats: dict[str, int],
    flushed: bool,
    description: str,
) -> int:
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        show = Output()
        show.line()
        for i, line in enumerate(summary_text(monitor).splitlines()):
            tripped = line.lstrip().startswith("TRIPPED")
            show.line(line, style="bold" if i == 0 else "bold red" if tripped else None)
    print(
        f"\nspans exported: {stats['exported']}, dropped: {stats['dropped']}, failed: {stats['failed']}"
        f"{'' if flushed else ' (flush timed out)'}; traces -> {description}",
        file=_info(args),
    )
    return 0


async def _rollout(
    cfg: SimConfig, step: int, on_done: Callable[[], None] | None, capture: ValidationCapture | None = None
) -> list[float | BaseException]:
    return await run_samples(cfg, step, cfg.work(), on_done=on_done, capture=capture)


async def _rollout_and_collect(
    cfg: SimConfig, step: int, on_done: Callable[[], None] | None, handle: Handle
) -> tuple[list[float | BaseException], StepMetrics]:
    """The rollout, then the step's metrics collected while any hung sample still runs, then it is cancelled
    (what a trainer with a rollout timeout does): the watchdog classifies it hung."""
    stragglers: list[asyncio.Task[float]] = []
    outcomes = await run_samples(cfg, step, cfg.work(), on_done=on_done, stragglers=stragglers)
    metrics = handle.metrics.collect(step)
    for task in stragglers:
        task.cancel()
    await asyncio.gather(*stragglers, return_exceptions=True)
    return outcomes, metrics


WATCH_INTERVAL_S = 0.25
TOOL_THRESHOLD_S = 1.0


def sim_watchdog(args: argparse.Namespace) -> WatchdogSettings | None:
    """Under ``--misbehave``: tool calls over 1 s are reported (checked every 0.25 s); else the defaults."""
    if not args.misbehave:
        return None
    return WatchdogSettings.from_env(interval_s=WATCH_INTERVAL_S, thresholds_s={"tool_calls": TOOL_THRESHOLD_S})


def misbehaviour(step: int, misbehave: bool) -> dict[str, Any]:
    """From step MISBEHAVE_FROM_STEP under ``--misbehave``: sample 0/0's sandbox call hangs (cancelled once the
    step is collected), sample 1/0's takes 1.5x the tool threshold (slow, then done)."""
    if not (misbehave and step >= MISBEHAVE_FROM_STEP):
        return {}
    return {
        "hang": (0, 0),
        "hang_grace_s": TOOL_THRESHOLD_S + 3 * WATCH_INTERVAL_S,
        "slow": (1, 0),
        "slow_tool_s": 1.5 * TOOL_THRESHOLD_S,
    }


def sim_config(args: argparse.Namespace) -> SimConfig:
    return SimConfig(
        prompts=args.prompts,
        rollout_n=args.rollout_n,
        max_turns=args.max_turns,
        time_scale=args.time_scale,
        seed=args.seed,
    )


def _print_step(
    show: Output,
    step: int,
    metrics: StepMetrics,
    failed: int,
    spans: dict[tuple[int, int], list[SpanRecord]],
    png: str | None,
    where: str = "",
) -> None:
    show.line()
    show.metrics(metrics, title=f"== step {step}: agent_loop metrics{where} ({failed} failed samples)")
    for kind, items in (("hung", metrics.hung_samples), ("slow", metrics.slow_samples)):
        for item in items:
            show.line(
                f"watchdog: {kind}: sample {item.sample_index}/{item.rollout_n} in {item.phase}"
                f"{' ' + item.tool if item.tool else ''}, trace {item.trace_id}",
                style="bold red" if kind == "hung" else "yellow",
            )
    key = metrics.slowest_sample
    if key is not None and spans.get(key):
        title = f"slowest sample {key[0]} (rollout {key[1]}), trace {metrics.slowest_trace_id}"
        show.line()
        show.waterfall(spans[key], title=title)
        if png:
            show.line(f"waterfall written to {render_png(spans[key], png, title=title)}")


def _load_records(args: argparse.Namespace) -> list[SpanRecord]:
    if args.file:
        return list(read_jsonl(args.file))
    from .analysis._jaeger import JaegerClient  # stdlib-only client

    client = JaegerClient(args.jaeger, timeout_s=args.timeout)
    end = datetime.now(timezone.utc)
    start = end - timedelta(minutes=args.since_minutes)
    attributes = {sc.RL_STEP: str(args.step)} if args.step is not None else None
    resource_spans = client.find_traces(args.service, start, end, attributes=attributes, search_depth=args.search_depth)
    return list(decode_resource_spans(resource_spans))


def _report(args: argparse.Namespace) -> int:
    if not (args.file or args.jaeger):
        print("report: give --file PATH or --jaeger URL", file=sys.stderr)
        return 2
    loaded = _load_records(args)
    records = [r for r in loaded if not is_snapshot(r)]  # snapshots of open samples are never counted
    available = sorted(
        set(steps_in(records))
        | {
            (r.attributes[sc.RL_STEP], bool(r.attributes.get(sc.RL_VALIDATE, False)))
            for r in loaded
            if is_snapshot(r) and isinstance(r.attributes.get(sc.RL_STEP), int)
        }
    )
    if not available:
        print("report: no sample spans found", file=sys.stderr)
        return 1
    validate_steps = [s for s, v in available if v == args.validate]
    step = args.step if args.step is not None else max(validate_steps or [s for s, _ in available])
    report = build_report(records, step, args.validate)
    view = build_step_view(loaded, step, args.validate) if (args.html or args.timeline_png) else None
    if not len(report.table) and not (view and view.samples):
        print(f"report: no samples for step {step} (found steps: {[s for s, _ in available]})", file=sys.stderr)
        return 1
    source = args.file or f"{args.jaeger} (service {args.service})"
    written = []
    if view is not None and args.html:
        jaeger_ui = args.jaeger_ui or args.jaeger
        if jaeger_ui and jaeger_ui_base(jaeger_ui) is None:
            print(
                f"report: --jaeger-ui {jaeger_ui!r} is not an http(s) URL; the page has no Jaeger links",
                file=sys.stderr,
            )
        written.append(f"timeline page written to {write_html(view, args.html, source=source, jaeger_ui=jaeger_ui)}")
    if view is not None and args.timeline_png:
        written.append(f"timeline PNG written to {render_timeline_png(view, args.timeline_png)}")
    if args.json:
        print(
            json.dumps(
                {
                    "step": step,
                    "metrics": dict(report.metrics),
                    "slowest": report.slowest(args.top),
                    "slowest_trace_id": report.metrics.slowest_trace_id,
                },
                indent=1,
            )
        )
        for line in written:
            print(line, file=sys.stderr)
        return 0
    show = Output()
    show.metrics(
        report.metrics,
        title=f"== step {step}{' (validation)' if args.validate else ''}: agent_loop metrics rebuilt from {source}",
    )
    show.line()
    show.slowest(report.slowest(args.top))
    if view is not None and view.counts.get(HUNG):
        hung = [
            f"{s.index}/{s.rollout} ({s.current_phase}, trace {s.trace_id})" for s in view.samples if s.state == HUNG
        ]
        show.line()
        show.line(f"hung samples (a snapshot, no end): {', '.join(hung)}", style="bold red")
    for line in written:
        show.line(line)
    key = (args.sample, args.rollout) if args.sample is not None else report.metrics.slowest_sample
    spans = report.samples.get(key) if key is not None else None
    if not spans or key is None:
        print(f"\nno spans stored for sample {key}", file=sys.stderr)
        return 1
    title = f"sample {key[0]} (rollout {key[1]}), step {step}, trace {spans[0].trace_id_hex}"
    show.line()
    show.waterfall(spans, title=title)
    if args.png:
        show.line(f"waterfall written to {render_png(spans, args.png, title=title)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="otel-agentloop", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="run the simulated agent loop and print per-step metrics")
    sim.add_argument("--steps", type=int, default=3)
    sim.add_argument("--prompts", type=int, default=16, help="prompts per step")
    sim.add_argument("--rollout-n", type=int, default=4, help="rollouts per prompt")
    sim.add_argument(
        "--workers",
        type=int,
        default=0,
        help="run as a manager plus N Ray actor workers on a local Ray cluster (0: in-process)",
    )
    sim.add_argument("--max-turns", type=int, default=3)
    sim.add_argument("--time-scale", type=float, default=1.0, help="multiply every simulated latency")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--service-name", default="otel-agentloop-sim")
    sim.add_argument("--endpoint", help="OTLP endpoint (default: OTEL_EXPORTER_OTLP_ENDPOINT, else a file)")
    sim.add_argument("--protocol", choices=PROTOCOLS)
    sim.add_argument("--file", help="also write OTLP-JSON lines here")
    sim.add_argument("--trace-per", choices=("sample", "step"))
    sim.add_argument("--png", help="write the slowest sample's waterfall as a PNG")
    sim.add_argument("--json", action="store_true", help="print the metric dicts as JSON")
    sim.add_argument("--quiet", action="store_true", help="no progress bar")
    sim.add_argument("--flush-timeout", type=float, default=10.0)
    sim.add_argument("--val-every", type=int, default=2, help="a validation pass every N steps (0: none)")
    sim.add_argument("--val-generations", type=int, default=4, help="validation generations to keep")
    sim.add_argument(
        "--misbehave",
        action="store_true",
        help=f"from step {MISBEHAVE_FROM_STEP}: KL spike, a {SLOWDOWN:.0f}x slower rollout, a hung and a "
        "slow tool call (reported by the watchdog, classified hung/slow)",
    )
    sim.add_argument(
        "--live-every", type=float, default=5.0, help="seconds between live-view lines when stderr is not a terminal"
    )
    sim.set_defaults(func=_simulate)

    rep = sub.add_parser("report", help="rebuild a step's metrics and waterfalls from a trace file or Jaeger")
    src = rep.add_mutually_exclusive_group()
    src.add_argument("--file", help="OTLP-JSON lines (the embedded exporter's or the Collector's file exporter's)")
    src.add_argument("--jaeger", help="Jaeger query URL, e.g. http://127.0.0.1:16686")
    rep.add_argument("--service", default="otel-agentloop-sim", help="service name to search in Jaeger")
    rep.add_argument("--since-minutes", type=float, default=60.0, help="Jaeger search window")
    rep.add_argument("--search-depth", type=int, default=500, help="max traces fetched from Jaeger (< its limit)")
    rep.add_argument("--timeout", type=float, default=10.0)
    rep.add_argument("--step", type=int, help="default: the last step found")
    rep.add_argument("--validate", action="store_true", help="the validation pass of that step")
    rep.add_argument("--sample", type=int, help="draw this sample index (default: the slowest)")
    rep.add_argument("--rollout", type=int, default=0)
    rep.add_argument("--top", type=int, default=5, help="how many slowest samples to list")
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
        "--jaeger-ui", metavar="URL", help="Jaeger UI base URL for the page's trace links (default: --jaeger)"
    )
    rep.add_argument("--json", action="store_true")
    rep.set_defaults(func=_report)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
