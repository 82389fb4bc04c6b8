"""Each health rule trips on a bad sequence and stays quiet on a healthy one; thresholds, events, summary."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_agentloop.health._training import ALERT_EVENT, HealthMonitor, HealthThresholds


def healthy(step: int) -> dict[str, float]:
    return {
        "critic/score/mean": 0.3 + 0.02 * step,
        "actor/pg_loss": 0.05 / (step + 1),
        "actor/kl_loss": 0.01,
        "actor/entropy": 1.2 - 0.03 * step,
        "actor/grad_norm": 0.5 + 0.01 * (step % 3),
        "timing_s/step": 60.0 + (step % 3),
        "perf/max_memory_allocated_gb": 40.0 + 0.1 * (step % 2),
    }


def run(overrides: dict[int, dict[str, float]], steps: int = 12, **thresholds) -> HealthMonitor:
    monitor = HealthMonitor(HealthThresholds(**thresholds), emit_events=False, log=False)
    for step in range(steps):
        metrics = healthy(step)
        metrics.update(overrides.get(step, {}))
        monitor.observe(step, metrics)
    return monitor


CASES = {
    "reward_falling": {8: {"critic/score/mean": 0.2}},
    "pg_loss_not_settling": {9: {"actor/pg_loss": -2.5}},
    "kl_high": {6: {"actor/kl_loss": 0.08}},
    "entropy_collapse": {7: {"actor/entropy": 0.05}},
    "entropy_drop": {7: {"actor/entropy": 0.4}},
    "grad_norm_high": {5: {"actor/grad_norm": 1.4}},
    "grad_norm_jump": {6: {"actor/grad_norm": 0.95 * 3.1 / 1.9 * 1.9}},
    "step_time_swing": {9: {"timing_s/step": 200.0}},
    "step_time_rise": {s: {"timing_s/step": 60.0 * 1.15 ** (s - 4)} for s in range(4, 12)},
    "memory_growth": {s: {"perf/max_memory_allocated_gb": 40.0 * 1.05 ** (s - 4)} for s in range(4, 12)},
    "val_gap": {10: {"val-core/gsm8k/reward/mean@1": 0.2}},
}


def test_a_healthy_run_trips_nothing() -> None:
    monitor = run({10: {"val-core/gsm8k/reward/mean@1": 0.48}})
    assert monitor.summary().tripped == {}


@pytest.mark.parametrize("rule", sorted(CASES))
def test_each_rule_trips_on_its_bad_sequence(rule: str) -> None:
    tripped = run(CASES[rule]).summary().tripped
    assert rule in tripped, tripped
    first_bad = min(CASES[rule])
    assert all(step >= first_bad for step in tripped[rule])


@pytest.mark.parametrize(
    ("rule", "loosened"),
    [
        ("kl_high", {"kl_max": 0.1}),
        ("grad_norm_high", {"grad_norm_max": 2.0}),
        ("step_time_swing", {"step_time_swing": 5.0}),
        ("val_gap", {"val_gap": 0.9}),
        ("entropy_collapse", {"entropy_min": 0.01}),
    ],
)
def test_thresholds_are_configurable(rule: str, loosened: dict[str, float]) -> None:
    assert rule in run(CASES[rule]).summary().tripped
    assert rule not in run(CASES[rule], **loosened).summary().tripped


def test_missing_and_bad_values_are_skipped_not_raised() -> None:
    monitor = HealthMonitor(emit_events=False, log=False)
    assert monitor.observe(0, {"actor/kl_loss": "n/a", "unrelated": 1.0}) == []
    assert monitor.observe(1, {"actor/kl_loss": float("nan")}) == []
    assert monitor.observe(2, {}) == []


def test_alerts_become_span_events_and_the_summary_tells_what_tripped_when() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    monitor = HealthMonitor(log=False)
    for step in range(8):
        metrics = healthy(step)
        if step == 5:
            metrics["actor/kl_loss"] = 0.05
        with tracer.start_as_current_span(f"step {step}"):
            monitor.observe(step, metrics)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    (event,) = spans["step 5"].events
    assert event.name == ALERT_EVENT and event.attributes["rule"] == "kl_high" and event.attributes["value"] == 0.05
    assert all(not spans[f"step {s}"].events for s in range(8) if s != 5)
    summary = monitor.summary()
    assert summary.tripped == {"kl_high": [5]}
    assert summary.final["actor/kl_loss"] == 0.01
    assert summary.means["actor/kl_loss"] == pytest.approx((0.01 * 7 + 0.05) / 8)
    text = summary.to_text()
    assert "TRIPPED kl_high at step 5" in text and "actor/kl_loss" in text
    data = json.loads(monitor.summary_json())
    assert data["tripped"] == {"kl_high": [5]} and data["alerts"][0]["rule"] == "kl_high"


def test_history_is_bounded() -> None:
    monitor = HealthMonitor(HealthThresholds(window=4), emit_events=False, log=False)
    for step in range(500):
        monitor.observe(step, healthy(step % 10))
    assert all(len(h) <= 5 for h in monitor._history.values())
