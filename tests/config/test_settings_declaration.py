"""The declaration is the one place: configure()'s options, the watchdog's settings, the variables read outside
``config/`` and the range rule of durations all come from it; ``fast_path`` is a setting like the others."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_agentloop as oal
from otel_agentloop import WatchdogSettings
from otel_agentloop.config import _kinds as kind
from otel_agentloop.config._environment import SDK_VARIABLES, WORKER_VARIABLES, handed_over, variable
from otel_agentloop.config._options import OBJECT_OPTIONS, Options
from otel_agentloop.config._otlp import otlp_variable
from otel_agentloop.config._sdk_variables import _duration
from otel_agentloop.config._settings import SPECS, Settings, resolve
from otel_agentloop.config._values import AdjustedError
from otel_agentloop.config._watchdog import PREFIX, WATCHDOG_FIELDS
from tests._support import REPO_ROOT
from tests._support.otlp_receiver import Receiver, start_http

SPECS_BY_NAME = {name: spec for name, spec, _ in SPECS}
ROOT = REPO_ROOT


# -- configure()'s options -------------------------------------------------------------------------------
def test_every_option_is_a_setting_or_an_object() -> None:
    for name in Options.__annotations__:
        assert name in SPECS_BY_NAME or name in OBJECT_OPTIONS, name
    assert set(Options.__annotations__) >= OBJECT_OPTIONS


@pytest.mark.e2e  # a subprocess
def test_mypy_checks_configure_callers_against_the_options(tmp_path) -> None:
    """``configure(service_name, **options: Unpack[Options])``: a type checker still sees every keyword."""
    caller = tmp_path / "caller.py"
    caller.write_text(
        "import otel_agentloop as oal\n"
        'oal.configure("ok", max_steps=3, watchdog=False, fast_path=False, exporters=[])\n'
        'oal.configure("bad", max_steps="3")\n'
        'oal.configure("typo", max_stepz=3)\n'
    )
    mypy = [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), str(caller)]
    out = subprocess.run(mypy, capture_output=True, text=True, cwd=ROOT)
    errors = [line for line in out.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 2, out.stdout + out.stderr
    assert "caller.py:3:" in errors[0] and '"max_steps"' in errors[0] and '"int | None"' in errors[0]
    assert "caller.py:4:" in errors[1] and '"max_stepz"' in errors[1]


def test_an_unknown_keyword_is_a_type_error_as_for_a_plain_signature() -> None:
    with pytest.raises(TypeError, match=r"^configure\(\) got an unexpected keyword argument 'max_stepz'$"):
        oal.configure("typo", max_stepz=3)  # type: ignore[call-arg]
    assert oal.current_handle() is None


def test_options_that_set_more_than_their_setting(tmp_path) -> None:
    path = tmp_path / "spans.jsonl"
    handle = oal.configure("both", set_global=False, file=str(path), export_timeout_s=4.0, watchdog=False)
    try:
        s = handle.settings
        assert (s.file, s.also_file) == (str(path), True)
        assert (s.export_timeout_s, s.otlp_timeout_s) == (4.0, 4.0)
        assert s.watchdog_enabled is False and s.watchdog_interval_s == Settings.watchdog_interval_s
    finally:
        handle.shutdown(2)


# -- the watchdog's settings ------------------------------------------------------------------------------
def test_watchdog_settings_are_the_declarations_watchdog_fields() -> None:
    declared = {name.removeprefix(PREFIX): default for name, _, default in SPECS if name.startswith(PREFIX)}
    fields = {f.name: f.default for f in dataclasses.fields(WatchdogSettings) if f.init}
    assert fields == declared
    assert tuple(declared) == WATCHDOG_FIELDS


@pytest.mark.parametrize(
    ("field", "value"),
    [("interval_s", 1e10), ("interval_s", 0.001), ("default_s", 1e300), ("window", 0), ("enabled", "yes")],
)
def test_watchdog_settings_are_checked_by_the_declaration(field: str, value: object) -> None:
    """The same check as ``configure()``'s, naming the setting (``WatchdogSettings(interval_s=1e10)`` passed
    its own check before and failed only in ``configure()``)."""
    with pytest.raises(ValueError, match=PREFIX + field):
        WatchdogSettings(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=PREFIX + field):
        resolve({PREFIX + field: value})


# -- the environment is read through the declaration -------------------------------------------------------
def test_only_declared_variables_are_read(monkeypatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", " http/protobuf ")
    assert variable("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") == "http/protobuf"
    assert variable("OTEL_EXPORTER_OTLP_ENDPOINT") is None  # a Settings variable, unset
    with pytest.raises(KeyError, match="OTEL_EXPORTER_OTLP_METRICS_PROTOCOLL"):
        variable("OTEL_EXPORTER_OTLP_METRICS_PROTOCOLL")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert otlp_variable("METRICS", "PROTOCOL") == "http/protobuf"
    assert otlp_variable("TRACES", "PROTOCOL") == "grpc"  # the generic one when the signal's is unset


def test_variables_handed_to_workers_are_declared_and_handed_as_they_are(monkeypatch) -> None:
    sdk = {v.name for v in SDK_VARIABLES}
    assert set(WORKER_VARIABLES) <= sdk
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.5")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_PROPAGATORS", "tracecontext")  # declared, not handed over
    assert handed_over() == {
        "OTEL_TRACES_SAMPLER": "traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.5",
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
    }
    handle = oal.configure("handed", set_global=False, exporters=[InMemorySpanExporter()])
    try:
        env = handle.worker_env
        assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.5" and "OTEL_PROPAGATORS" not in env
        assert env["OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"] == "http/protobuf"
    finally:
        handle.shutdown(2)


@pytest.mark.parametrize("traces_variable", [False, True], ids=["generic", "traces"])
def test_http_json_takes_its_endpoint_and_headers_from_the_declared_variables(monkeypatch, traces_variable) -> None:
    """As the SDK's HTTP exporter: ``..._TRACES_ENDPOINT`` as it is, the generic one with ``/v1/traces`` (the
    receiver answers 404 elsewhere); ``..._TRACES_HEADERS`` before the generic headers."""
    receiver = Receiver()
    server, endpoint = start_http(receiver)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-from=generic")
    if traces_variable:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # never used
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint + "/v1/traces")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-from=traces")
    else:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    try:
        handle = oal.configure("env-json", set_global=False, schedule_delay_s=0.05)
        try:
            with oal.sample(0, step=1):
                pass
            assert handle.force_flush(10)
            stats = handle.stats
        finally:
            handle.shutdown(2)
    finally:
        server.shutdown()
    assert stats["exported"] == 1 and stats["failed"] == 0, stats
    assert receiver.headers[0]["x-from"] == ("traces" if traces_variable else "generic")


# -- one range rule for durations ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        *((raw, "default") for raw in ("abc", "nan", "inf", "-inf", "0", "-1")),
        *((raw, f"kept {float(raw):g}") for raw in ("0.5", "5", "3600")),
        *((raw, "bound 3600") for raw in ("3601", "1e30")),
    ],
)
def test_settings_and_sdk_durations_follow_one_range_rule(raw: str, expected: str) -> None:
    """``OTEL_EXPORTER_OTLP_TIMEOUT`` (a setting) and ``OTEL_EXPORTER_ZIPKIN_TIMEOUT`` (an SDK variable), both
    seconds up to 3600: the same verdict for the same text (kept, the bound, or the default)."""
    setting = kind.seconds(3.0)["parse"]
    sdk = _duration("s", 3600.0)

    def verdict(parse) -> str:
        try:
            value = parse(raw)
        except AdjustedError as exc:
            return f"bound {float(exc.value):g}"
        except ValueError:
            return "default"
        return f"kept {float(value):g}"

    assert verdict(setting) == verdict(sdk) == expected


# -- fast_path ------------------------------------------------------------------------------------------
def test_fast_path_is_a_setting_on_by_default(monkeypatch, caplog) -> None:
    spec = SPECS_BY_NAME["fast_path"]
    assert spec.env == "OTEL_AGENTLOOP_FAST_PATH" and Settings().fast_path is True
    handle = oal.configure("fast", set_global=False, exporters=[InMemorySpanExporter()])
    try:
        assert handle.settings.fast_path is True and "OTEL_AGENTLOOP_FAST_PATH" not in handle.worker_env
    finally:
        handle.shutdown(2)
    handle = oal.configure("sdk", set_global=False, exporters=[InMemorySpanExporter()], fast_path=False)
    try:
        assert handle.settings.fast_path is False
        assert handle.worker_env["OTEL_AGENTLOOP_FAST_PATH"] == "false"  # workers take the same path
    finally:
        handle.shutdown(2)
    monkeypatch.setenv("OTEL_AGENTLOOP_FAST_PATH", "false")
    assert resolve().fast_path is False and resolve({"fast_path": True}).fast_path is True
    monkeypatch.setenv("OTEL_AGENTLOOP_FAST_PATH", "sometimes")
    with caplog.at_level(logging.WARNING):
        assert resolve().fast_path is True
    assert "OTEL_AGENTLOOP_FAST_PATH='sometimes' is not a boolean; using true" in caplog.text
    with pytest.raises(ValueError, match="fast_path must be a bool"):
        oal.configure("bad", set_global=False, fast_path="yes")  # type: ignore[arg-type]
