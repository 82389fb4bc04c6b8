"""Each health rule trips on a bad sequence and stays quiet on a healthy one; thresholds, events, summary."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_agentloop.health import HealthMonitor, HealthThresholds
from otel_agentloop.health._training import ALERT_EVENT


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


# -- never raises (issue 21) -------------------------------------------------------------------------------
class TensorLike:
    """Like a multi-element tensor: ``float()`` raises what torch raises."""

    def __float__(self) -> float:
        raise RuntimeError("a Tensor with 2 elements cannot be converted to Scalar")


class Hostile:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def __float__(self) -> float:
        raise self.exc

    def __repr__(self) -> str:
        raise self.exc

    __str__ = __repr__


def test_a_zero_median_grad_norm_is_no_jump_and_no_crash() -> None:
    monitor = HealthMonitor(emit_events=False, log=False)
    for step, norm in enumerate([0.0, 0.0, 0.0, 0.4]):  # no update for 3 steps (e.g. all-equal rewards), then one
        alerts = monitor.observe(step, {"actor/grad_norm": norm})
    assert [a.rule for a in alerts] == []
    assert monitor.observe(4, {"actor/grad_norm": 1.5})[0].rule == "grad_norm_high"


def test_a_tensor_like_value_whose_float_raises_is_skipped_with_one_warning(caplog) -> None:
    monitor = HealthMonitor(emit_events=False, log=False)
    for step in range(3):
        assert monitor.observe(step, {"actor/kl_loss": TensorLike(), "actor/grad_norm": 1.5})[0].rule == (
            "grad_norm_high"
        )
    warnings = [r.getMessage() for r in caplog.records if "actor/kl_loss" in r.getMessage()]
    assert warnings == ["otel_agentloop.health: actor/kl_loss (a TensorLike) is not a number; skipped"]
    assert "actor/kl_loss" not in monitor.summary().final


def test_non_str_keys_are_ignored_and_the_rest_is_checked() -> None:
    monitor = HealthMonitor(emit_events=False, log=False)
    metrics = {1: 2.0, None: "x", ("val-core", 1): 0.0, b"actor/kl_loss": 9.0, "actor/kl_loss": 0.08}
    assert [a.rule for a in monitor.observe(0, metrics)] == ["kl_high"]  # type: ignore[arg-type]


def test_bad_thresholds_are_refused_when_made() -> None:
    for bad in ({"window": 0}, {"window": 2.5}, {"warmup_steps": -1}, {"kl_max": float("nan")}, {"kl_max": -1.0}):
        with pytest.raises(ValueError, match="health"):
            HealthThresholds(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="step_time_swing"):
        HealthThresholds(step_time_swing=0.0)


HEALTH_KEYS = [
    "critic/score/mean",
    "critic/rewards/mean",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/ppo_kl",
    "actor/entropy",
    "actor/grad_norm",
    "timing_s/step",
    "perf/max_memory_allocated_gb",
    "val-core/gsm8k/reward/mean@1",
    "val-core/math/score/mean@4",
]
odd_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324, float("inf"), float("-inf"), float("nan")]),
    st.integers(),
    st.integers(min_value=10**308, max_value=10**400),  # float() raises OverflowError
    st.booleans(),
    st.none(),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.complex_numbers(),
    st.decimals(allow_nan=True),
    st.fractions(),
    st.just(TensorLike()),
    st.sampled_from(
        [RuntimeError("x"), ValueError("x"), TypeError("x"), OverflowError("x"), ZeroDivisionError("x")]
    ).map(Hostile),
    st.builds(np.array, st.lists(st.floats(allow_nan=True), max_size=3)),
    st.floats(allow_nan=True).map(np.float32),
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
    st.just(np.ma.masked),
    st.lists(st.floats(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.floats(), max_size=2),
)
odd_keys = st.one_of(
    st.sampled_from(HEALTH_KEYS), st.text(max_size=12), st.integers(), st.none(), st.floats(), st.tuples(st.text())
)
odd_steps = st.one_of(st.integers(), st.floats(allow_nan=True), st.none(), st.text(max_size=4), odd_values)


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(st.tuples(odd_steps, st.dictionaries(odd_keys, odd_values, max_size=14)), min_size=1, max_size=12),
    thresholds=st.builds(
        HealthThresholds,
        window=st.integers(1, 6),
        warmup_steps=st.integers(0, 4),
        reward_drop=st.floats(0, 2),
        grad_norm_jump=st.floats(0, 10),
        step_time_swing=st.floats(min_value=1e-9, max_value=10),
        val_gap=st.floats(0, 2),
    ),
)
def test_observe_never_raises_on_arbitrary_dicts_of_odd_values(steps, thresholds) -> None:
    import logging

    from otel_agentloop.core._guard import logger as guard_logger

    errors: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "internal error" in record.getMessage():
                errors.append(record.getMessage())

    handler = Catch()
    guard_logger.addHandler(handler)
    try:
        monitor = HealthMonitor(thresholds, emit_events=True, log=True)
        for step, metrics in steps:
            alerts = monitor.observe(step, metrics)
            assert all(isinstance(a.step, int) and isinstance(a.value, float) for a in alerts)
        summary = monitor.summary()
        summary.to_text()
        json.loads(monitor.summary_json())
        assert summary.steps == len(steps)
    finally:
        guard_logger.removeHandler(handler)
    assert errors == []  # handled by the guarded conversions, not by the last-resort net


@settings(max_examples=30, deadline=None)
@given(
    metrics=st.one_of(st.none(), st.integers(), st.text(), st.lists(st.integers()), st.just(Hostile(RuntimeError())))
)
def test_observe_never_raises_on_what_is_not_a_mapping(metrics) -> None:
    monitor = HealthMonitor(emit_events=False, log=False)
    assert monitor.observe(0, metrics) == []
    assert monitor.summary().steps == 1
