"""Settings never harm the user's program (issue 21, issue 18 item 6).

Every variable this library or the OpenTelemetry SDK reads, set to garbage, still gives a working ``import``
and ``configure()`` with a warning naming the variable; bounds on every watchdog and metric duration; typos
in ``OTEL_AGENTLOOP_*`` names; concurrent configure/shutdown; an endpoint without a scheme.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_agentloop as oal
from otel_agentloop.config._settings import SPECS
from tests._support.otlp_receiver import Receiver, start_grpc, wait_for

# -- every variable, set to garbage (subprocesses: some are read at import) ------------------------------
SETTINGS_VARIABLES = {var for _, spec, _ in SPECS for var in (spec.env, *spec.read)}
FREE_TEXT = {
    # any text is a valid value: nothing to warn about
    "OTEL_SERVICE_NAME",
    "OTEL_AGENTLOOP_FILE",
    "OTEL_AGENTLOOP_RUN_ID",
    "OTEL_AGENTLOOP_RUN_ATTEMPT",
    "OTEL_CONFIG_FILE",
    "OTEL_EXPORTER_PROMETHEUS_HOST",
    "OTEL_PYTHON_TRACER_CONFIGURATOR",
    "OTEL_PYTHON_METER_CONFIGURATOR",
    "OTEL_PYTHON_LOGGER_CONFIGURATOR",
}
GARBAGE = ("abc", "-5", "1e300", "nan", "http://[::1", " =,=x, ")


def sdk_variable_names() -> set[str]:
    """The names the SDK, the API and the OTLP exporters declare (public and private constants)."""
    modules = [
        "opentelemetry.sdk.environment_variables",
        "opentelemetry.environment_variables",
        "opentelemetry.exporter.otlp.proto.grpc.exporter",
        "opentelemetry.exporter.otlp.proto.http._common",
    ]
    names = set()
    for name in modules:
        module = importlib.import_module(name)
        for attr in dir(module):
            value = getattr(module, attr)
            if attr.lstrip("_").startswith("OTEL_") and isinstance(value, str) and value.startswith("OTEL_"):
                names.add(value)
    return names


def test_every_variable_the_sdk_reads_is_declared() -> None:
    """A new SDK variable fails here instead of reaching the SDK unchecked."""
    from otel_agentloop.config._environment import SDK_VARIABLES

    missing = sdk_variable_names() - SETTINGS_VARIABLES - {v.name for v in SDK_VARIABLES}
    assert not missing, sorted(missing)


_PROBE = textwrap.dedent("""
    import io, json, logging, sys
    stream = io.StringIO()
    logging.basicConfig(stream=stream, level=logging.WARNING, format="%(message)s")
    import otel_agentloop as oal
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    exporter = InMemorySpanExporter()
    handle = oal.configure("garbage", exporters=[exporter])

    @oal.trace_tool("t")
    def tool():
        return 1

    with oal.sample(0, step=1):
        tool()
    samples = handle.metrics.collect(1).get("agent_loop/num_samples")
    handle.shutdown(2)
    names = sorted(s.name for s in exporter.get_finished_spans())
    print(json.dumps({"samples": samples, "names": names, "log": stream.getvalue()}))
""")


def _run_probe(env_vars: dict[str, str], tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(env_vars)
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.e2e  # a subprocess
@pytest.mark.parametrize("value", GARBAGE)
def test_every_variable_set_to_garbage_still_imports_configures_and_traces(value, tmp_path) -> None:
    """All variables at once (each warning names its own variable, so one process per value stays
    attributable): import and configure() work, the span is recorded and exported, and every variable whose
    value can be wrong is named in a warning."""
    variables = sorted(SETTINGS_VARIABLES | sdk_variable_names())
    result = _run_probe(dict.fromkeys(variables, value), tmp_path)
    assert result["samples"] == 1
    assert result["names"] == ["execute_tool t", "rl.sample", "rl.step.summary"]
    log = result["log"]
    assert "Traceback" not in log and "using None" not in log
    unnamed = [v for v in variables if v not in FREE_TEXT and f"{v}=" not in log]
    assert not unnamed, (unnamed, log[-3000:])


@pytest.mark.e2e  # a subprocess
@pytest.mark.parametrize("value", ["abc", "-5", "1e9"])
def test_import_survives_a_bad_span_attribute_count_limit(value, tmp_path) -> None:
    """The SDK parses OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT when it is imported."""
    result = _run_probe({"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": value}, tmp_path)
    assert result["samples"] == 1
    assert f"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT={value!r}" in result["log"]
    assert "using 128" in result["log"]


# -- configure() with bad exporter and metric variables (in process) -----------------------------------------
@pytest.fixture
def thread_errors(monkeypatch):
    """Exceptions that end any thread (a dying exporter or watchdog thread)."""
    errors: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    return errors


def _trace_one(handle, step: int = 1) -> float:
    @oal.trace_tool("t")
    def tool() -> int:
        return 1

    with oal.sample(0, step=step):
        tool()
    return handle.metrics.collect(step)["agent_loop/num_samples"]


@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_EXPORTER_OTLP_COMPRESSION": "bogus"},
        {"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "bogus"},
        {"OTEL_EXPORTER_OTLP_METRICS_COMPRESSION": "bogus"},
        {"OTEL_EXPORTER_OTLP_COMPRESSION": "deflate"},  # valid, yet the SDK's gRPC exporters raise on it
        {"OTEL_METRIC_EXPORT_INTERVAL": "0"},
        {"OTEL_METRIC_EXPORT_INTERVAL": "-5"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1"},
        {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "abc"},
        {"OTEL_METRICS_EXEMPLAR_FILTER": "abc"},
        {"OTEL_PYTHON_METER_PROVIDER": "abc"},
        {"OTEL_PYTHON_EXPORTER_OTLP_GRPC_RETRYABLE_ERROR_CODES": "abc"},
    ],
)
@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_configure_survives_bad_exporter_variables(env, protocol, monkeypatch, caplog, thread_errors) -> None:
    receiver = Receiver()
    server, endpoint = start_grpc(receiver)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    try:
        with caplog.at_level(logging.WARNING):
            handle = oal.configure("bad-exporter-env", set_global=False)
            try:
                assert _trace_one(handle) == 1
            finally:
                handle.shutdown(1)
        (key,) = env
        if env[key] != "deflate":
            assert f"{key}=" in caplog.text
        assert "using None" not in caplog.text
        assert not thread_errors
    finally:
        server.stop(0)


def test_a_huge_metric_interval_keeps_the_reader_thread_alive(monkeypatch, caplog, thread_errors) -> None:
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "console")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "1e30")
    with caplog.at_level(logging.WARNING):
        handle = oal.configure("interval", set_global=False, exporters=[InMemorySpanExporter()])
    try:
        time.sleep(0.3)
        assert not thread_errors
        names = [t.name for t in threading.enumerate()]
        assert any("PeriodicExportingMetricReader" in n for n in names), names
        assert handle.settings.metric_export_interval_s == 3600.0
        assert "OTEL_METRIC_EXPORT_INTERVAL='1e30' must be at most 3600000; using 3600000" in caplog.text
    finally:
        handle.shutdown(1)


# -- watchdog bounds ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("var", "value", "field", "used"),
    [
        ("OTEL_AGENTLOOP_WATCHDOG_DEFAULT", "1e300", "watchdog_default_s", 604800.0),
        ("OTEL_AGENTLOOP_WATCHDOG_MIN", "1e300", "watchdog_min_s", 604800.0),
        ("OTEL_AGENTLOOP_WATCHDOG_INTERVAL", "1e10", "watchdog_interval_s", 3600.0),
        ("OTEL_AGENTLOOP_WATCHDOG_INTERVAL", "1e-9", "watchdog_interval_s", 0.05),
        ("OTEL_AGENTLOOP_WATCHDOG_P99_MULTIPLE", "1e300", "watchdog_p99_multiple", 1000.0),
        ("OTEL_AGENTLOOP_WATCHDOG_THRESHOLDS", "tool=1e300", "watchdog_thresholds_s", None),
    ],
)
def test_watchdog_settings_out_of_range_warn_and_stay_bounded(
    var, value, field, used, monkeypatch, caplog, thread_errors
) -> None:
    monkeypatch.setenv(var, value)
    monkeypatch.setenv("OTEL_AGENTLOOP_WATCHDOG_MIN_OBSERVATIONS", "1")  # learn at the first collect
    with caplog.at_level(logging.WARNING):
        handle = oal.configure("watchdog-bounds", set_global=False, exporters=[InMemorySpanExporter()])
        try:
            assert getattr(handle.settings, field) == used
            for step in range(1, 4):
                assert _trace_one(handle, step) == 1
            time.sleep(0.3)
            checks = handle.live.checks
        finally:
            handle.shutdown(1)
    assert f"{var}={value!r}" in caplog.text
    assert "internal error" not in caplog.text, caplog.text
    assert not thread_errors
    if value == "1e-9":  # at most one check per 0.05 s (it spun ~1e5 times a second before)
        assert checks <= 0.3 / 0.05 + 10, checks


def test_watchdog_verdicts_survive_a_huge_learned_floor(monkeypatch, caplog) -> None:
    """WATCHDOG_MIN=1e300 made every collect fail internally and lose the verdicts."""
    monkeypatch.setenv("OTEL_AGENTLOOP_WATCHDOG_MIN", "1e300")
    handle = oal.configure(
        "floor",
        set_global=False,
        exporters=[InMemorySpanExporter()],
        watchdog=oal.WatchdogSettings.from_env(interval_s=0.05, thresholds_s={"tool:slow": 0.05}, min_observations=1),
    )
    try:

        @oal.trace_tool("slow")
        def slow() -> None:
            time.sleep(0.4)

        with caplog.at_level(logging.WARNING):
            for step in (1, 2):
                with oal.sample(0, step=step):
                    slow()
                metrics = handle.metrics.collect(step)
                assert metrics.get("agent_loop/watchdog/slow") == 1.0, dict(metrics)
        assert "internal error" not in caplog.text, caplog.text
    finally:
        handle.shutdown(1)


def test_bad_watchdog_arguments_raise_naming_the_setting() -> None:
    with pytest.raises(ValueError, match="watchdog_interval_s"):
        oal.configure("w", set_global=False, watchdog=oal.WatchdogSettings(interval_s=1e10))
    with pytest.raises(ValueError, match="watchdog_default_s"):
        oal.configure("w", set_global=False, watchdog=oal.WatchdogSettings(default_s=1e300))


# -- names and messages ------------------------------------------------------------------------------
def test_a_misspelt_variable_warns_once_with_the_closest_name(monkeypatch, caplog) -> None:
    monkeypatch.setenv("OTEL_AGENTLOOP_WATCHDOG_INTERVALL", "2")
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            oal.configure("typo", set_global=False, exporters=[InMemorySpanExporter()]).shutdown(1)
    lines = [r.getMessage() for r in caplog.records if "OTEL_AGENTLOOP_WATCHDOG_INTERVALL" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "did you mean OTEL_AGENTLOOP_WATCHDOG_INTERVAL?" in lines[0]


@pytest.mark.parametrize(
    ("var", "value", "used"),
    [
        ("OTEL_AGENTLOOP_MAX_SAMPLES_PER_STEP", "abc", "using no limit"),
        ("OTEL_AGENTLOOP_WATCHDOG_THRESHOLDS", "abc", "using learned thresholds only"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://[::1", "using no OTLP endpoint"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "abc", "using no headers"),
    ],
)
def test_fallback_warnings_name_the_default_used(var, value, used, monkeypatch, caplog, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(var, value)
    with caplog.at_level(logging.WARNING):
        oal.configure("fallback", set_global=False).shutdown(1)
    assert used in caplog.text, caplog.text
    assert "using None" not in caplog.text


# -- concurrency -------------------------------------------------------------------------------------
def _configure_8_then_shut_down_7(keep: int, step: int) -> None:
    exporters = [InMemorySpanExporter() for _ in range(8)]
    handles: list = [None] * 8
    start = threading.Barrier(8)

    def configure(i: int) -> None:
        start.wait()
        handles[i] = oal.configure(f"c{i}", exporters=[exporters[i]], set_global=False, watchdog=False)

    threads = [threading.Thread(target=configure, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    close = threading.Barrier(7)

    def shutdown(i: int) -> None:
        close.wait()
        handles[i].shutdown(1)

    threads = [threading.Thread(target=shutdown, args=(i,)) for i in range(8) if i != keep]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert oal.current_handle() is handles[keep]
    assert _trace_one(handles[keep], step=step) == 1, step
    assert handles[keep].force_flush(5)
    names = [s.name for s in exporters[keep].get_finished_spans()]
    assert names == ["execute_tool t", "rl.sample", "rl.step.summary"]
    handles[keep].shutdown(1)
    assert oal.current_handle() is None


def test_concurrent_configure_and_shutdown_leave_the_open_handle_tracing() -> None:
    """8 threads configure at once, 7 handles are shut down at once: the one left is current and traces."""
    for trial in range(6):
        _configure_8_then_shut_down_7(keep=(3 * trial) % 8, step=trial)


# -- an endpoint without a scheme (issue 18, item 6) ----------------------------------------------------------
_JOB = textwrap.dedent("""
    import otel_agentloop as oal
    oal.configure("no-scheme")

    @oal.trace_tool("t")
    def tool():
        return 1

    for i in range(10):
        with oal.sample(i, step=1):
            tool()
""")


@pytest.mark.e2e  # a subprocess
def test_an_endpoint_without_a_scheme_gets_a_hint_and_plaintext_on_loopback(tmp_path) -> None:
    receiver = Receiver()
    server, endpoint = start_grpc(receiver)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}

        def job(endpoint_value: str) -> tuple[subprocess.CompletedProcess[str], float]:
            t0 = time.monotonic()
            out = subprocess.run(
                [sys.executable, "-c", _JOB],
                env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint_value},
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=120,
            )
            return out, time.monotonic() - t0

        baseline, with_scheme = job(endpoint)  # the same job, side by side: what this machine's load costs it
        assert baseline.returncode == 0 and wait_for(lambda: len(receiver.records) == 20, 5), baseline.stderr[-3000:]
        out, took = job(endpoint.removeprefix("http://"))  # 127.0.0.1:PORT
        assert out.returncode == 0, out.stderr[-3000:]
        assert wait_for(lambda: len(receiver.records) == 40, 5), len(receiver.records)
        hints = [line for line in out.stderr.splitlines() if "has no scheme" in line]
        assert len(hints) == 1 and f"using {endpoint}" in hints[0], out.stderr[-3000:]
        assert "SSL" not in out.stderr and "handshake" not in out.stderr, out.stderr[-3000:]
        assert took < with_scheme + 10, (took, with_scheme)  # the TLS retries held the exit for ~20 s more
    finally:
        server.stop(0)
