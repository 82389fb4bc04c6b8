"""Training-health signals from each step's metric dict (verl's key names), with alerts and a summary.

The rules follow the checks of verl's training guide: reward mean rising, policy loss settling near 0, KL
within about 0.005-0.02 (alarm above 0.03), entropy falling gradually (alarm on collapse or a sudden drop),
grad norm below 1.0 (alarm on a jump), seconds per iteration stable (alarm on a 3x swing or a steady rise),
GPU memory stable, validation reward tracking training reward. Every threshold is a field of
:class:`HealthThresholds`; a rule whose key is missing from a step's dict is skipped. Memory is bounded: a
fixed window of history per key plus running sums.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import statistics
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from opentelemetry import trace

from .. import semconv as sc
from ..core._guard import internal_error, safe_str, warn_once

logger = logging.getLogger("otel_agentloop.health")
ALERT_EVENT = sc.RL_HEALTH_ALERT


def _as_step(step: Any) -> int:  # Any: the user's step, whatever it is, read by int() and float()
    """``step`` as an int64 (``int(step)`` of an integral value), else -1."""
    try:
        number = step if type(step) is int else int(step) if float(step).is_integer() else -1
    except Exception:
        return -1
    return number if -(1 << 63) <= number < (1 << 63) else -1


@dataclass(frozen=True)
class HealthThresholds:
    """When each rule trips. Defaults follow verl's training guide."""

    window: int = 5  # steps of history the rules look back over
    reward_drop: float = 0.2  # reward mean fell this fraction below its recent best
    pg_loss_max: float = 1.0  # |policy loss| above this after warm-up: not settling
    kl_max: float = 0.03  # KL loss above this
    entropy_min: float = 0.1  # entropy below this: collapse
    entropy_drop: float = 0.5  # entropy fell this fraction in one step
    grad_norm_max: float = 1.0  # grad norm above this
    grad_norm_jump: float = 3.0  # grad norm above this multiple of its recent median
    step_time_swing: float = 3.0  # seconds/step this many times above or below its recent median
    step_time_rise: float = 0.5  # seconds/step rose every step of the window, by this fraction overall
    memory_growth: float = 0.1  # GPU memory grew every step of the window, by this fraction overall
    val_gap: float = 0.2  # validation reward this fraction below training reward
    warmup_steps: int = 3  # steps before the trend rules start

    def __post_init__(self) -> None:
        for name in ("window", "warmup_steps"):
            value = getattr(self, name)
            if type(value) is not int or value < (1 if name == "window" else 0):
                raise ValueError(f"health {name} must be an int >= {1 if name == 'window' else 0}, not {value!r}")
        for name, value in asdict(self).items():
            if name in ("window", "warmup_steps"):
                continue
            if not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ValueError(f"health {name} must be a finite number >= 0, not {value!r}")
        if self.step_time_swing <= 0:
            raise ValueError(f"health step_time_swing must be > 0, not {self.step_time_swing!r}")


@dataclass(frozen=True)
class HealthKeys:
    """Which metric keys the rules read (verl's names by default)."""

    reward: tuple[str, ...] = ("critic/score/mean", "critic/rewards/mean")
    pg_loss: tuple[str, ...] = ("actor/pg_loss",)
    kl: tuple[str, ...] = ("actor/kl_loss", "actor/ppo_kl")
    entropy: tuple[str, ...] = ("actor/entropy", "actor/entropy_loss")
    grad_norm: tuple[str, ...] = ("actor/grad_norm",)
    step_time: tuple[str, ...] = ("timing_s/step",)
    memory: tuple[str, ...] = ("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb")
    val_reward_prefix: str = "val-core/"


@dataclass(frozen=True)
class Alert:
    rule: str
    step: int
    key: str
    value: float
    threshold: float
    message: str


@dataclass
class HealthSummary:
    steps: int
    final: dict[str, float]
    means: dict[str, float]
    tripped: dict[str, list[int]] = field(default_factory=dict)
    alerts: list[Alert] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "steps": self.steps,
            "final": self.final,
            "means": self.means,
            "tripped": self.tripped,
            "alerts": [asdict(a) for a in self.alerts],
        }

    def to_text(self) -> str:
        lines = [f"training health over {self.steps} steps"]
        for key in sorted(self.final):
            lines.append(f"  {key:<34} final {self.final[key]:>10.4g}   mean {self.means[key]:>10.4g}")
        if not self.tripped:
            lines.append("  no rule tripped")
        for rule, steps in sorted(self.tripped.items()):
            lines.append(f"  TRIPPED {rule} at step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))}")
        return "\n".join(lines)


_Reading = tuple[str, float] | None
"""One rule's input: the metric key it was read from and its value (``None``: the step did not log it)."""
_Alert = Callable[[str, str, float, float, str], None]
"""Adds an alert of this step: ``(rule, key, value, threshold, message)``."""


class HealthMonitor:
    """``observe(step, metrics)`` after each step; ``summary()`` at the end. Never raises on bad values."""

    MAX_ALERTS = 1000

    def __init__(
        self,
        thresholds: HealthThresholds | None = None,
        keys: HealthKeys | None = None,
        *,
        emit_events: bool = True,
        log: bool = True,
    ) -> None:
        self.t = thresholds or HealthThresholds()
        self.keys = keys or HealthKeys()
        self.emit_events = emit_events
        self.log = log
        self._history: dict[str, deque[float]] = {}
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._final: dict[str, float] = {}
        self._alerts: deque[Alert] = deque(maxlen=self.MAX_ALERTS)
        self._tripped: dict[str, list[int]] = {}
        self._steps = 0

    # -- helpers --------------------------------------------------------------------------------
    @staticmethod
    def _number(name: str, raw: Any) -> float | None:  # Any: the user's value (a tensor too), read by float()
        """``float(raw)``, or ``None`` (warned once per key) when it cannot be converted: any exception of the
        value's own conversion (a multi-element tensor, a huge int, a broken ``__float__``) is caught. NaN is
        ``None`` too (silently: verl writes NaN for "no value")."""
        try:
            value = float(raw)
        except Exception:
            warn_once(
                "health-bad:" + name,
                "otel_agentloop.health: %s (a %s) is not a number; skipped",
                name,
                safe_str(type(raw).__qualname__),
            )
            return None
        return None if math.isnan(value) else value

    def _value(self, metrics: Mapping[str, object], names: tuple[str, ...]) -> tuple[str, float] | None:
        for name in names:
            if name in metrics:
                value = self._number(name, metrics[name])
                return None if value is None else (name, value)
        return None

    def _val_reward(self, metrics: Mapping[str, object]) -> tuple[str, float] | None:
        prefix = self.keys.val_reward_prefix
        found = [
            (k, v)
            for k, v in metrics.items()
            if k.startswith(prefix) and ("/reward/" in k or "/score/" in k) and "/mean@" in k
        ]
        values = [x for x in (self._number(k, v) for k, v in found) if x is not None]
        return (found[0][0], sum(values) / len(values)) if values else None  # not fmean: fsum raises on overflow

    @staticmethod
    def _plain(metrics: Any) -> dict[str, object]:  # Any: the user's metrics, any mapping-like object
        """The str-keyed items of ``metrics`` as a plain dict; ``{}`` (warned once) when it cannot be read."""
        try:
            return {k: v for k, v in metrics.items() if isinstance(k, str)}
        except Exception:
            warn_once(
                "health-bad-metrics",
                "otel_agentloop.health: observe() got a %s, not a readable mapping; step skipped",
                safe_str(type(metrics).__qualname__),
            )
            return {}

    def _past(self, rule: str) -> list[float]:
        return list(self._history.get(rule, ()))

    def _record(self, rule: str, value: float) -> None:
        hist = self._history.setdefault(rule, deque(maxlen=self.t.window + 1))
        hist.append(value)

    # -- rules ----------------------------------------------------------------------------------
    def observe(self, step: int, metrics: Mapping[str, object]) -> list[Alert]:
        """Check ``metrics`` of ``step``; returns this step's alerts (also logged and sent as span events).

        Never raises: keys that are not ``str`` are ignored; a value that does not convert to a float (or is
        NaN) is skipped, with one warning per key; a ``step`` that is not an int is recorded as -1."""
        try:
            return self._observe(_as_step(step), self._plain(metrics))
        except Exception:  # a bug of ours: never the user's training loop
            internal_error("HealthMonitor.observe")
            return []

    def _observe(self, step: int, metrics: dict[str, object]) -> list[Alert]:
        """The rules over one step's readings, in a fixed order (the alerts' order); then the readings join the
        history and the summary, and the alerts are reported."""
        self._steps += 1
        alerts: list[Alert] = []

        def alert(rule: str, key: str, value: float, threshold: float, message: str) -> None:
            alerts.append(Alert(rule, step, key, value, threshold, message))

        warm = self._steps > self.t.warmup_steps
        got = {
            name: self._value(metrics, getattr(self.keys, name))
            for name in ("reward", "pg_loss", "kl", "entropy", "grad_norm", "step_time", "memory")
        }
        val = self._val_reward(metrics)
        self._check_reward(got["reward"], val, warm, alert)
        self._check_losses(got["pg_loss"], got["kl"], warm, alert)
        self._check_entropy(got["entropy"], alert)
        self._check_grad_norm(got["grad_norm"], alert)
        self._check_step_time(got["step_time"], alert)
        if (r := got["memory"]) is not None:
            key, value = r
            self._steady_rise(
                "memory_growth", key, [*self._past("memory"), value], self.t.memory_growth, alert, "GPU memory"
            )
        for name, r in got.items():
            if r is not None:
                self._record(name, r[1])
                self._account(r[0], r[1])
        if val is not None:
            self._account(val[0], val[1])
        for a in alerts:
            self._report(a)
        return alerts

    def _check_reward(self, r: _Reading, val: _Reading, warm: bool, alert: _Alert) -> None:
        t = self.t
        if r is None:
            return
        key, value = r
        past = self._past("reward")
        if warm and past and max(past) > 0 and value < max(past) * (1 - t.reward_drop):
            alert(
                "reward_falling",
                key,
                value,
                max(past) * (1 - t.reward_drop),
                f"reward mean {value:.4g} fell over {t.reward_drop:.0%} below its recent best {max(past):.4g}",
            )
        if val is not None and value != 0 and (value - val[1]) / abs(value) > t.val_gap:
            alert(
                "val_gap",
                val[0],
                val[1],
                value * (1 - t.val_gap),
                f"validation reward {val[1]:.4g} trails training reward {value:.4g} by more than {t.val_gap:.0%}",
            )

    def _check_losses(self, pg_loss: _Reading, kl: _Reading, warm: bool, alert: _Alert) -> None:
        t = self.t
        if (r := pg_loss) is not None and warm and abs(r[1]) > t.pg_loss_max:
            alert("pg_loss_not_settling", r[0], r[1], t.pg_loss_max, f"|policy loss| {abs(r[1]):.4g} > {t.pg_loss_max}")
        if (r := kl) is not None and r[1] > t.kl_max:
            alert("kl_high", r[0], r[1], t.kl_max, f"KL loss {r[1]:.4g} above {t.kl_max} (healthy: ~0.005-0.02)")

    def _check_entropy(self, r: _Reading, alert: _Alert) -> None:
        t = self.t
        if r is None:
            return
        key, value = r
        past = self._past("entropy")
        if value < t.entropy_min:
            alert("entropy_collapse", key, value, t.entropy_min, f"entropy {value:.4g} below {t.entropy_min}")
        elif past and past[-1] > 0 and value < past[-1] * (1 - t.entropy_drop):
            alert(
                "entropy_drop",
                key,
                value,
                past[-1] * (1 - t.entropy_drop),
                f"entropy fell from {past[-1]:.4g} to {value:.4g} in one step",
            )

    def _check_grad_norm(self, r: _Reading, alert: _Alert) -> None:
        t = self.t
        if r is None:
            return
        key, value = r
        past = self._past("grad_norm")
        if value > t.grad_norm_max:
            alert("grad_norm_high", key, value, t.grad_norm_max, f"grad norm {value:.4g} above {t.grad_norm_max}")
        med = statistics.median(past) if len(past) >= 2 else 0.0
        if med > 0 and value > t.grad_norm_jump * med:  # from a median of 0 (no update), no jump to speak of
            alert(
                "grad_norm_jump",
                key,
                value,
                t.grad_norm_jump * med,
                f"grad norm jumped to {value:.4g} ({value / med:.1f}x its recent median)",
            )

    def _check_step_time(self, r: _Reading, alert: _Alert) -> None:
        t = self.t
        if r is None:
            return
        key, value = r
        past = self._past("step_time")
        if len(past) >= 2:
            med = statistics.median(past)
            if med > 0 and (value > t.step_time_swing * med or value < med / t.step_time_swing):
                alert(
                    "step_time_swing",
                    key,
                    value,
                    t.step_time_swing * med,
                    f"step took {value:.3g} s against a recent median of {med:.3g} s",
                )
        self._steady_rise("step_time_rise", key, [*past, value], t.step_time_rise, alert, "seconds per step")

    def _steady_rise(self, rule: str, key: str, series: list[float], fraction: float, alert: _Alert, what: str) -> None:
        window = series[-(self.t.window + 1) :]
        if len(window) < self.t.window + 1 or window[0] <= 0:
            return
        rising = all(b > a for a, b in itertools.pairwise(window))
        if rising and window[-1] > window[0] * (1 + fraction):
            alert(
                rule,
                key,
                window[-1],
                window[0] * (1 + fraction),
                f"{what} rose every step for {self.t.window} steps: {window[0]:.4g} -> {window[-1]:.4g}",
            )

    def _account(self, key: str, value: float) -> None:
        self._final[key] = value
        self._sums[key] = self._sums.get(key, 0.0) + value
        self._counts[key] = self._counts.get(key, 0) + 1

    def _report(self, a: Alert) -> None:
        self._alerts.append(a)
        steps = self._tripped.setdefault(a.rule, [])
        if len(steps) < 100:
            steps.append(a.step)
        if self.log:
            logger.warning("step %s: %s: %s", a.step, a.rule, a.message)
        if self.emit_events:
            span = trace.get_current_span()
            if span.is_recording():
                span.add_event(
                    ALERT_EVENT,
                    {"rule": a.rule, "key": a.key, "value": a.value, "threshold": a.threshold, sc.RL_STEP: a.step},
                )

    def summary(self) -> HealthSummary:
        means = {k: self._sums[k] / self._counts[k] for k in self._sums}
        return HealthSummary(
            self._steps, dict(self._final), means, {k: list(v) for k, v in self._tripped.items()}, list(self._alerts)
        )

    def summary_json(self) -> str:
        return json.dumps(self.summary().to_json(), indent=1)
