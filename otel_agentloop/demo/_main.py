"""The simulated main job in one process (``otel-agentloop simulate --workers 0``), and the per-step
reporting the Ray version (:mod:`._ray`) shares: what a trainer does with otel_agentloop around its rollouts."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..analysis._reading._timeline import TimelineRecorder
from ..analysis._rendering._display import Output
from ..analysis._rendering._display import info_stream as _info
from ..analysis._rendering._progress import Progress
from ..analysis._rendering._terminal import counted
from ..analysis._rendering._waterfall import render_png
from ..core import _context as ctx
from ..core._trainer import trainer_phase
from ..health._training import Alert, HealthMonitor
from ..health._validation import ValidationCapture
from ..health._watchdog import WatchdogSettings
from ..metrics._records import SpanRecord
from ..metrics._summary import FAILED, HUNG, OK, SLOW, verdict
from ..metrics._table import StepMetrics
from ..metrics._verdicts import count_verdicts, sample_key
from ..setup import Handle, configure
from ._agent import SimConfig, failed, run_samples
from ._trainer import (
    MISBEHAVE_FROM_STEP,
    format_alerts,
    format_generations,
    run_trainer_phases,
    slowdown,
    summary_text,
    trainer_metrics,
    validation_config,
)


def simulate(args: argparse.Namespace) -> int:
    """Run ``args.steps`` simulated steps in this process, printing each step's metrics (or JSON at the end)."""
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
        f"otel-agentloop simulate: {counted(args.steps, 'step')} x {counted(len(cfg.work()), 'sample')}; "
        f"traces -> {handle.description}",
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
                step=step,
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
            counts = verdict_counts(
                cfg.work(), {k for k, o in zip(cfg.work(), outcomes, strict=True) if failed(o)}, metrics
            )
            report_step(args, results, StepOutcome(step, metrics, counts, trainer, timing_raw, alerts, capture, spans))
    finally:
        flushed = handle.force_flush(args.flush_timeout)
        stats = handle.stats
        handle.shutdown(args.flush_timeout)
    return finish(args, results, monitor, stats, flushed, handle.description)


@dataclass
class StepOutcome:
    """What one simulated step produced, for printing and for ``--json``."""

    step: int
    metrics: StepMetrics
    verdicts: dict[str, int]
    """How many samples of each verdict (``verdict_counts``)."""
    trainer: dict[str, float]
    timing_raw: dict[str, float]
    alerts: list[Alert]
    capture: ValidationCapture | None
    spans: dict[tuple[int, int], list[SpanRecord]]


def report_step(args: argparse.Namespace, results: list[dict[str, Any]], out: StepOutcome, where: str = "") -> None:
    results.append(
        {
            "step": out.step,
            "metrics": dict(out.metrics),
            "slowest_trace_id": out.metrics.slowest_trace_id,
            "hung_trace_ids": list(out.metrics.hung_trace_ids),
            "slow_trace_ids": list(out.metrics.slow_trace_ids),
            "failed_samples": out.verdicts[FAILED],
            "verdicts": out.verdicts,
            "trainer": out.trainer,
            "timing_raw": out.timing_raw,
            "alerts": [a.rule for a in out.alerts],
            "validation_generations": out.capture.result() if out.capture else None,
        }
    )
    if args.json:  # stdout is the JSON document; the step's verdicts still reach the person, on stderr
        print_verdicts(Output(_info(args)), out.step, out.metrics, out.verdicts, where)
        return
    show = Output()
    print_step(show, out.step, out.metrics, out.verdicts, out.spans, args.png, where=where)
    if out.capture is not None:
        show.line()
        show.line(format_generations(out.capture))
    if out.alerts:
        show.line()
        show.line(format_alerts(out.alerts), style="bold red")


def finish(
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


def verdict_counts(
    work: list[tuple[int, int]], failed_keys: set[tuple[int, int]], metrics: StepMetrics
) -> dict[str, int]:
    """Each sample's one verdict (``metrics._summary.verdict``), counted: ``failed_keys`` are the samples whose
    sample span ended with an error, the watchdog's hung/slow samples come from the collected ``metrics``. A hung
    sample is hung, not failed, whatever happened to it after the collect."""
    hung = {sample_key(s) for s in metrics.hung_samples}
    reported = hung | {sample_key(s) for s in metrics.slow_samples}
    return count_verdicts(
        verdict(error=key in failed_keys, reported=key in reported, finished=key not in hung) for key in work
    )


def verdict_text(counts: dict[str, int]) -> str:
    """``"63 samples: 61 ok, 0 failed, 1 slow; 1 hung, left out"``: a hung sample is not in the step's metrics."""
    collected = counts[OK] + counts[FAILED] + counts[SLOW]
    text = f"{collected} samples: {counts[OK]} ok, {counts[FAILED]} failed, {counts[SLOW]} slow"
    return text + (f"; {counts[HUNG]} hung, left out" if counts[HUNG] else "")


def sim_config(args: argparse.Namespace) -> SimConfig:
    return SimConfig(
        prompts=args.prompts,
        rollout_n=args.rollout_n,
        max_turns=args.max_turns,
        time_scale=args.time_scale,
        seed=args.seed,
    )


def step_title(step: int, verdicts: dict[str, int], where: str = "") -> str:
    return f"== step {step}: agent_loop metrics{where} ({verdict_text(verdicts)})"


def watchdog_lines(show: Output, metrics: StepMetrics) -> None:
    """One line per sample the watchdog reported, with its verdict (hung: still running at collect)."""
    for kind, items in ((HUNG, metrics.hung_samples), (SLOW, metrics.slow_samples)):
        for item in items:
            show.line(
                f"watchdog: {kind}: sample {item.sample_index}/{item.rollout_n} in {item.phase}"
                f"{' ' + item.tool if item.tool else ''}, trace {item.trace_id}",
                style="bold red" if kind == HUNG else "yellow",
            )


def print_verdicts(show: Output, step: int, metrics: StepMetrics, verdicts: dict[str, int], where: str = "") -> None:
    """The step's title with its verdict counts and the watchdog's lines (no metrics table: ``--json``)."""
    show.line(step_title(step, verdicts, where))
    watchdog_lines(show, metrics)


def print_step(
    show: Output,
    step: int,
    metrics: StepMetrics,
    verdicts: dict[str, int],
    spans: dict[tuple[int, int], list[SpanRecord]],
    png: str | None,
    where: str = "",
) -> None:
    show.line()
    show.metrics(metrics, title=step_title(step, verdicts, where))
    watchdog_lines(show, metrics)
    key = metrics.slowest_sample
    if key is not None and spans.get(key):
        title = f"slowest sample {key[0]} (rollout {key[1]}), trace {metrics.slowest_trace_id}"
        show.line()
        show.waterfall(spans[key], title=title)
        if png:
            show.line(f"waterfall written to {render_png(spans[key], png, title=title)}")
