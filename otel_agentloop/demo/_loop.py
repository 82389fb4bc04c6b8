"""The simulated main job's step loop, one for both main jobs (in this process: :mod:`._main`; on Ray:
:mod:`._ray`), and its per-step report: what a trainer does with otel_agentloop around its rollouts."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol, TypedDict

from ..analysis._rendering._display import Output
from ..analysis._rendering._display import info_stream as _info
from ..analysis._rendering._progress import Progress
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
from ._agent import SimConfig
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

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor

    from ..core._inflight import InflightSample

StepResult = dict[str, object]
"""One step's entry in ``--json``'s document (:func:`report_step`)."""


class Misbehaviour(TypedDict, total=False):
    """What ``--misbehave`` changes in a step's :class:`~._agent.SimConfig` (:func:`misbehaviour`)."""

    hang: tuple[int, int]
    hang_grace_s: float
    slow: tuple[int, int]
    slow_tool_s: float


def sim_configure(args: argparse.Namespace, processors: Sequence[SpanProcessor] = ()) -> Handle:
    """This process's tracing for the simulated main job (``processors`` added: a timeline's recorder)."""
    return configure(
        args.service_name,
        endpoint=args.endpoint,
        protocol=args.protocol,
        file=args.file,
        trace_per=args.trace_per,
        processors=list(processors),
        watchdog=sim_watchdog(args),
    )


class Rollouts(Protocol):
    """Where a step's samples run (this process, or Ray workers): what :func:`run_steps` asks of it."""

    where: str
    """How the step's title says where it ran (``" over 4 workers"``; ``""`` in this process)."""

    def progress(self, step: int) -> tuple[Callable[[], Sequence[InflightSample]], Callable[[], int] | None]:
        """The live view's sources for ``step``: its running samples, and how many finished (``None``: the bar
        counts them)."""
        ...

    def rollout(self, cfg: SimConfig, step: int, bar: Progress) -> tuple[set[tuple[int, int]], list[float]]:
        """The step's rollout, inside its ``gen`` phase (``bar`` advanced as samples finish): the samples that
        failed and the rewards."""
        ...

    def collect(self, step: int) -> tuple[StepMetrics, dict[tuple[int, int], list[SpanRecord]]]:
        """After the trainer phases, inside the step: its metrics and the slowest sample's spans."""
        ...

    def validate(self, cfg: SimConfig, step: int) -> list[float]:
        """The validation pass's rollout, inside its validation step and ``testing`` phase: the rewards."""
        ...

    def finish_validation(self, step: int) -> ValidationCapture:
        """After the validation pass: its metrics collected (its ``rl.step.summary``), its generations."""
        ...


def run_steps(args: argparse.Namespace, cfg: SimConfig, rollouts: Rollouts, monitor: HealthMonitor) -> list[StepResult]:
    """``args.steps`` steps, each reported as it ends (:func:`report_step`); their ``--json`` results."""
    results: list[StepResult] = []
    for step in range(1, args.steps + 1):
        report_step(args, results, run_step(args, cfg, rollouts, monitor, step), where=rollouts.where)
    return results


def run_step(
    args: argparse.Namespace, cfg: SimConfig, rollouts: Rollouts, monitor: HealthMonitor, step: int
) -> StepOutcome:
    """One step as verl's trainer runs it: rollout (``gen``), trainer phases, metrics, the validation pass every
    ``args.val_every`` steps (``testing``), then the health monitor (its alerts are events on the step span)."""
    step_cfg = replace(
        cfg, time_scale=cfg.time_scale * slowdown(step, args.misbehave), **misbehaviour(step, args.misbehave)
    )
    inflight, finished = rollouts.progress(step)
    bar = Progress(
        len(cfg.work()),
        f"step {step}",
        enabled=not args.quiet,
        inflight=inflight,
        finished=finished,
        step=step,
        live_every_s=args.live_every,
    )
    timing_raw: dict[str, float] = {}
    t0 = time.perf_counter()
    with ctx.step(step):
        with trainer_phase("gen", timing_raw):
            failed_keys, rewards = rollouts.rollout(step_cfg, step, bar)
        run_trainer_phases(timing_raw, cfg.time_scale)
        step_s = time.perf_counter() - t0  # rollout + update; the validation pass is not counted
        bar.close()
        metrics, spans = rollouts.collect(step)
        capture: ValidationCapture | None = None
        val_rewards: list[float] = []
        if args.val_every and step % args.val_every == 0:
            with ctx.step(step, validate=True), trainer_phase("testing", timing_raw):
                val_rewards = rollouts.validate(validation_config(cfg), step)
            capture = rollouts.finish_validation(step)
        trainer = trainer_metrics(step, cfg.seed, rewards, step_s, args.misbehave, val_rewards)
        alerts = monitor.observe(step, trainer)  # alerts become events on the step span
    counts = verdict_counts(cfg.work(), failed_keys, metrics)
    return StepOutcome(step, metrics, counts, trainer, timing_raw, alerts, capture, spans)


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


def report_step(args: argparse.Namespace, results: list[StepResult], out: StepOutcome, where: str = "") -> None:
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
    results: list[StepResult],
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


WATCH_INTERVAL_S = 0.25
TOOL_THRESHOLD_S = 1.0


def sim_watchdog(args: argparse.Namespace) -> WatchdogSettings | None:
    """Under ``--misbehave``: tool calls over 1 s are reported (checked every 0.25 s); else the defaults."""
    if not args.misbehave:
        return None
    return WatchdogSettings.from_env(interval_s=WATCH_INTERVAL_S, thresholds_s={"tool_calls": TOOL_THRESHOLD_S})


def misbehaviour(step: int, misbehave: bool) -> Misbehaviour:
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
