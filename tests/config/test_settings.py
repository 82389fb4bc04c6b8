"""Environment variables: honoured when valid; a warning naming the variable and a default when not."""

from __future__ import annotations

import logging
import os

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_agentloop as oal
from otel_agentloop.analysis import read_jsonl
from otel_agentloop.core._state import state

BAD_ENV = {
    "OTEL_BSP_MAX_QUEUE_SIZE": "lots",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "-5",
    "OTEL_BSP_SCHEDULE_DELAY": "soon",
    "OTEL_BSP_EXPORT_TIMEOUT": "0",
    "OTEL_SDK_DISABLED": "maybe",
    "OTEL_TRACES_SAMPLER": "sometimes",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon",
    "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "huge",
    "OTEL_SPAN_EVENT_COUNT_LIMIT": "x",
    "OTEL_TRACES_EXPORTER": "zipkin-v0",
    "OTEL_AGENTLOOP_TRACE_PER": "epoch",
}


def test_bad_env_values_warn_and_fall_back(monkeypatch, caplog, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    for key, value in BAD_ENV.items():
        monkeypatch.setenv(key, value)
    with caplog.at_level(logging.WARNING):
        handle = oal.configure("bad-env", set_global=False)
    try:
        assert handle.enabled  # "maybe" is not true
        text = caplog.text
        for key in BAD_ENV:
            assert key in text, key
        (proc,) = handle.export_processors
        assert (proc.max_queue_size, proc.max_export_batch_size) == (2048, 512)
        assert (proc.schedule_delay_s, proc.export_timeout_s) == (1.0, 30.0)
        assert handle.provider._span_limits.max_attribute_length == 4096
        assert state.defaults.trace_per == "sample"

        @oal.trace_reward
        def score() -> float:
            return 1.0

        with oal.sample(0, step=1):
            assert score() == 1.0
        assert handle.metrics.collect(1)["agent_loop/num_samples"] == 1
    finally:
        handle.shutdown(2)


def test_valid_env_values_are_used(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "100")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "10")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "250")
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "16")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    monkeypatch.setenv("OTEL_AGENTLOOP_FILE", str(tmp_path / "t.jsonl"))
    monkeypatch.setenv("OTEL_AGENTLOOP_TRACE_PER", "step")
    handle = oal.configure("env", set_global=False)
    try:
        (proc,) = handle.export_processors
        assert (proc.max_queue_size, proc.max_export_batch_size, proc.schedule_delay_s) == (100, 10, 0.25)
        assert handle.description == f"file {tmp_path / 't.jsonl'}"
        assert state.defaults.trace_per == "step"
        with oal.step(1), oal.sample(0) as s:
            # always_off: recorded for the metrics, not sampled for export
            assert s.span.is_recording() and not s.span.get_span_context().trace_flags.sampled
        assert handle.metrics.collect(1)["agent_loop/num_samples"] == 1
    finally:
        handle.shutdown(2)
    # ... but the step's slowest sample is kept and exported (nothing else: the step span was not sampled)
    names = [r.name for r in read_jsonl(str(tmp_path / "t.jsonl"))]
    assert sorted(names) == ["rl.sample", "rl.step.summary"]  # the step's summary is never sampled out


def test_traces_exporter_none_keeps_metrics_only(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    handle = oal.configure("none", set_global=False)
    try:
        assert handle.export_processors == ()
        assert not (tmp_path / "otel-agentloop-traces").exists()
    finally:
        handle.shutdown(2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"protocol": "udp"}, "protocol must be one of"),
        ({"trace_per": "epoch"}, "trace_per must be"),
        ({"max_queue_size": 0}, "max_queue_size must be >= 1"),
        ({"export_timeout_s": -1}, "export_timeout_s must be > 0"),
        ({"max_steps": 0}, "max_steps must be >= 1"),
    ],
)
def test_bad_arguments_raise_naming_the_parameter(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        oal.configure("bad-args", set_global=False, **kwargs)


def test_long_attributes_are_truncated_and_bad_numbers_dropped(traced, caplog) -> None:
    with caplog.at_level(logging.WARNING), oal.sample(0, step=1) as s:
        s.record(prompt_length="many", response_length=12, reward="0.5")
        s.span.set_attribute("note", "x" * 10_000)
    (root,) = traced.by_name("rl.sample")
    assert "rl.sample.prompt_length" not in root.attributes
    assert root.attributes["rl.sample.response_length"] == 12
    assert root.attributes["rl.reward.score"] == 0.5
    assert len(root.attributes["note"]) == 4096
    assert "dropping non-numeric value for rl.sample.prompt_length" in caplog.text


# -- OTEL_AGENTLOOP_STARTUP_HOOK: declared and checked like every variable (issue 26) -------------------------
STARTUP = "OTEL_AGENTLOOP_STARTUP_HOOK"


def _configure_twice(caplog: pytest.LogCaptureFixture) -> list[str]:
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            oal.configure("startup-variable", set_global=False, exporters=[InMemorySpanExporter()]).shutdown(1)
    return [r.getMessage() for r in caplog.records if STARTUP in r.getMessage()]


@pytest.mark.parametrize("value", ["disable", "none", "off", "0", "false", "no", " DISABLED ", "true", "enable"])
def test_the_startup_hook_words_pass_the_check_unchanged(value, monkeypatch, caplog) -> None:
    """Every word ``otel_agentloop_startup`` reads as off or on is valid: no warning, the value kept."""
    monkeypatch.setenv(STARTUP, value)
    assert _configure_twice(caplog) == []
    assert os.environ[STARTUP] == value


@pytest.mark.parametrize("value", ["maybe", "nope", "disable please"])
def test_an_unrecognised_startup_hook_value_warns_once_naming_it_and_turns_it_off(value, monkeypatch, caplog) -> None:
    """One warning naming the variable, the value, what the hook does and what is used (off); the variable is
    rewritten to ``false``, as the startup hook reads it, so workers and later checks agree and stay quiet."""
    monkeypatch.setenv(STARTUP, value)
    lines = _configure_twice(caplog)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"otel_agentloop: {STARTUP}={value!r} is not one of false, 0, off, no, disable")
    assert "wraps ray.init in a driver" in lines[0] and lines[0].endswith("now off; using false")
    assert os.environ[STARTUP] == "false"


def test_a_misspelt_startup_hook_variable_gets_the_closest_name(monkeypatch, caplog) -> None:
    monkeypatch.setenv("OTEL_AGENTLOOP_STARTUP_HOOKS", "false")
    with caplog.at_level(logging.WARNING):
        oal.configure("startup-typo", set_global=False, exporters=[InMemorySpanExporter()]).shutdown(1)
    assert f"OTEL_AGENTLOOP_STARTUP_HOOKS is not a variable otel_agentloop reads; did you mean {STARTUP}?" in (
        caplog.text
    )
