"""The simulated trainer around the rollout: its phases as spans, its metric dict, health and validation output.

Shared by the in-process and the Ray main job. The metric dict uses verl's key names; with ``misbehave`` the
KL loss spikes and the rollout slows down from step 3 on, so the health monitor has something to say.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import MutableMapping, Sequence
from dataclasses import replace

from ..core._trainer import trainer_phase
from ..health._training import Alert, HealthMonitor
from ..health._validation import ValidationCapture
from ._agent import SimConfig

MISBEHAVE_FROM_STEP = 3
SLOWDOWN = 4.0
# (phase, seconds before time_scale): what follows the rollout in a verl PPO step
TRAINER_PHASES = (("old_log_prob", 0.04), ("ref", 0.03), ("adv", 0.005), ("update_actor", 0.12))


def slowdown(step: int, misbehave: bool) -> float:
    return SLOWDOWN if misbehave and step >= MISBEHAVE_FROM_STEP else 1.0


def validation_config(cfg: SimConfig) -> SimConfig:
    """The validation pass: the same prompts, other draws (a validation set is not the training batch)."""
    return replace(cfg, seed=cfg.seed + 1_000_003)


def run_trainer_phases(timing_raw: MutableMapping[str, float], time_scale: float) -> None:
    """The phases after the rollout, each a ``rl.train.<name>`` span (and a ``timing_raw`` entry)."""
    for name, seconds in TRAINER_PHASES:
        with trainer_phase(name, timing_raw):
            time.sleep(seconds * time_scale)


def trainer_metrics(
    step: int, seed: int, rewards: Sequence[float], step_s: float, misbehave: bool, val_rewards: Sequence[float] = ()
) -> dict[str, float]:
    """One step's trainer metrics under verl's names (losses are simulated; reward and time are measured)."""
    rng = random.Random(hash((seed, step, "trainer")) & 0xFFFFFFFF)
    bad = misbehave and step >= MISBEHAVE_FROM_STEP
    metrics = {
        "critic/score/mean": statistics.fmean(rewards) if rewards else 0.0,
        "actor/pg_loss": rng.gauss(0.0, 0.02),
        "actor/kl_loss": 0.08 if bad else 0.01 + rng.gauss(0.0, 0.002),
        "actor/entropy": max(0.2, 1.0 - 0.02 * step + rng.gauss(0.0, 0.01)),
        "actor/grad_norm": 0.4 + rng.gauss(0.0, 0.03),
        "timing_s/step": step_s,
        "perf/max_memory_allocated_gb": 12.0,
    }
    if val_rewards:
        metrics["val-core/sim/reward/mean@1"] = statistics.fmean(val_rewards)
    return metrics


def format_alerts(alerts: Sequence[Alert]) -> str:
    return "\n".join(f"HEALTH step {a.step}: {a.rule}: {a.message}" for a in alerts)


def format_generations(capture: ValidationCapture, limit: int = 4) -> str:
    rows = capture.result()[:limit]
    lines = [f"validation generations ({len(capture)} kept of {capture.offered} offered, seeded, all batches):"]
    lines += [f"  [{score:.2f}] {inp!r} -> {out!r}" for inp, out, score in rows]
    return "\n".join(lines)


def summary_text(monitor: HealthMonitor) -> str:
    return monitor.summary().to_text()
