"""Every setting reaches Ray workers: the driver sets each one to a non-default, a worker reads it back.

The list of settings comes from the declaration (``_settings.SPECS``), so a new setting is covered here
without editing this file. The cluster is started before the driver sets anything, so a worker cannot
inherit the driver's environment: what it gets, it gets from ``integrations.ray.runtime_env``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

import otel_agentloop as oal
from otel_agentloop.config._options import Options
from otel_agentloop.config._settings import SPECS, Settings, resolve
from otel_agentloop.health import WatchdogSettings
from otel_agentloop.health._watchdog import WATCHDOG_FIELDS

# -- the declaration itself (no Ray) -------------------------------------------------------------------


def examples(tmp_path: pathlib.Path) -> dict[str, Any]:
    """Every setting at its declared non-default example (the file under ``tmp_path``)."""
    out = {name: spec.example for name, spec, _ in SPECS}
    out["file"] = str(tmp_path / "settings.jsonl")
    return out


def test_every_setting_has_its_own_variable_and_a_valid_non_default_example() -> None:
    names = [name for name, _, _ in SPECS]
    variables = [var for _, spec, _ in SPECS for var in (spec.env, *spec.read)]
    assert names == [f.name for f in dataclasses.fields(Settings) if f.name != "sources"]
    assert len(set(variables)) == len(variables)
    for name, spec, default in SPECS:
        assert spec.env.startswith("OTEL_"), name
        assert spec.check(name, spec.example) == spec.example, name
        assert spec.example != default, name


def test_env_to_settings_to_env_round_trips(tmp_path: pathlib.Path) -> None:
    values = examples(tmp_path)
    given = resolve(values, environ={})
    assert all(given.sources[name] == "argument" for name in values)
    env = given.worker_env()
    assert sorted(env) == sorted(spec.env for _, spec, _ in SPECS)
    again = resolve(environ=env)
    assert again == given
    assert again.worker_env() == env
    for name, spec, _ in SPECS:  # one at a time too: nothing depends on another setting being set
        single = resolve(environ={spec.env: spec.show(values[name])})
        assert getattr(single, name) == values[name], name
        assert single.sources == {name: spec.env}


def test_nothing_set_gives_the_defaults_and_hands_nothing_on() -> None:
    settings = resolve(environ={})
    assert settings == Settings() and settings.worker_env() == {}


def test_bad_values_raise_for_arguments_and_warn_for_variables(caplog: pytest.LogCaptureFixture) -> None:
    for name, _, _ in SPECS:
        with pytest.raises(ValueError, match=name):
            resolve({name: object()})
    for name, spec, default in SPECS:
        try:
            spec.parse("?!")
        except ValueError:
            pass
        else:
            continue  # free text (a name, an endpoint, a path): nothing is malformed
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="otel_agentloop"):
            settings = resolve(environ={spec.env: "?!"})
        assert getattr(settings, name) == default, name
        assert spec.env in caplog.text, name


def test_more_specific_variables_win_and_are_handed_on_under_their_own_name() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
    }
    settings = resolve(environ=env)
    assert settings.endpoint == env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    # not rewritten as OTEL_EXPORTER_OTLP_ENDPOINT, which the SDK's HTTP exporter would append /v1/traces to
    assert settings.worker_env() == {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]}


def test_resource_attribute_arguments_merge_over_the_environment() -> None:
    settings = resolve({"resource_attributes": {"a": "arg"}}, environ={"OTEL_RESOURCE_ATTRIBUTES": "a=env,b=x%2Cy"})
    assert settings.resource_attributes == {"a": "arg", "b": "x,y"}
    assert resolve(environ=settings.worker_env()).resource_attributes == {"a": "arg", "b": "x,y"}


def test_watchdog_settings_round_trip_through_the_declaration() -> None:
    watchdog = WatchdogSettings(**{name: SPECS_BY_NAME["watchdog_" + name].example for name in WATCHDOG_FIELDS})
    assert WatchdogSettings.from_settings(resolve(environ=watchdog.worker_env())) == watchdog


SPECS_BY_NAME = {name: spec for name, spec, _ in SPECS}


# -- on a real Ray cluster -----------------------------------------------------------------------------
ray = pytest.importorskip("ray") if not os.environ.get("CI") else __import__("ray")
from otel_agentloop.integrations import ray as oal_ray  # noqa: E402 - after the Ray check
from tests.integrations.ray.ray_local import local_ray  # noqa: E402

WORKER_IDENTITY = {"process.pid", "ray.node.id", "ray.job.id", "ray.actor.id", "rl.worker"}
"""Resource attributes a worker adds to the driver's (its own identity, see ``setup_worker``)."""


class SettingsProbe:
    def read(self) -> dict[str, Any]:
        from otel_agentloop.core._state import state

        handle = oal_ray.setup_worker()
        applied: dict[str, Any] = {
            "max_content_chars": state.content.max_chars,
            "capture_content": state.content.enabled,
            "trace_per": state.defaults.trace_per,
        }
        if handle.enabled:
            (proc,) = handle.export_processors
            applied.update(
                max_queue_size=proc.max_queue_size,
                max_export_batch_size=proc.max_export_batch_size,
                schedule_delay_s=proc.schedule_delay_s,
                export_timeout_s=proc.export_timeout_s,
                max_attribute_length=handle.provider._span_limits.max_attribute_length,  # type: ignore[union-attr]
                watchdog=handle.live.settings,
            )
        return {"settings": handle.settings, "applied": applied, "pid": os.getpid()}


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    with local_ray(num_cpus=1):
        yield


def driver_arguments(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``configure()`` keywords and environment variables that set every setting to ``values``: a setting
    with a ``configure()`` parameter of its name is passed as that, the ``watchdog_*`` ones as a
    :class:`WatchdogSettings`, the rest (no parameter) as their variable."""
    parameters = {"service_name", *Options.__annotations__}  # configure(service_name, **options)
    kwargs: dict[str, Any] = {}
    env: dict[str, str] = {}
    watchdog: dict[str, Any] = {}
    for name, spec, _ in SPECS:
        if name.startswith("watchdog_"):
            watchdog[name.removeprefix("watchdog_")] = values[name]
        elif name in parameters:
            kwargs[name] = values[name]
        else:
            env[spec.env] = spec.show(values[name])
    kwargs["watchdog"] = WatchdogSettings(**watchdog)
    return kwargs, env


@pytest.mark.parametrize("enabled", [False, True], ids=["everything-non-default", "all-but-enabled"])
def test_every_driver_setting_reaches_a_ray_worker(
    ray_cluster: None, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path, enabled: bool
) -> None:
    values = examples(tmp_path)
    if enabled:  # the same, with tracing on: the worker builds its exporters from these settings too
        values["enabled"] = True
    kwargs, env = driver_arguments(values)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    handle = oal.configure(**kwargs)
    try:
        driver = handle.settings
        for name, _, default in SPECS:
            assert getattr(driver, name) == values[name] or name == "otlp_timeout_s", name
            assert getattr(driver, name) != default or (enabled and name == "enabled"), name
        assert driver.otlp_timeout_s == values["export_timeout_s"]  # configure(export_timeout_s=) sets both

        probe = ray.remote(num_cpus=0)(SettingsProbe).options(runtime_env=oal_ray.runtime_env(handle)).remote()
        try:
            got = ray.get(probe.read.remote(), timeout=120)
        finally:
            ray.kill(probe)
        assert got["pid"] != os.getpid()
        worker: Settings = got["settings"]
        for name, _, _ in SPECS:
            if name == "resource_attributes":  # the worker adds its own identity to the driver's
                extra = dict(worker.resource_attributes or {})
                for key, value in (driver.resource_attributes or {}).items():
                    assert extra.pop(key) == value, key
                assert set(extra) == WORKER_IDENTITY
                continue
            assert getattr(worker, name) == getattr(driver, name), name
            # ... and from what the driver handed on, not from an environment the worker inherited
            assert worker.sources[name] != "argument" or name == "resource_attributes", name

        applied = got["applied"]
        assert applied["max_content_chars"] == values["max_content_chars"]
        assert applied["capture_content"] is values["capture_content"]
        assert applied["trace_per"] == values["trace_per"]
        if enabled:
            assert applied["max_queue_size"] == values["max_queue_size"]
            assert applied["max_export_batch_size"] == values["max_export_batch_size"]
            assert applied["schedule_delay_s"] == values["schedule_delay_s"]
            assert applied["export_timeout_s"] == values["export_timeout_s"]
            assert applied["max_attribute_length"] == values["attribute_value_length_limit"]
            assert applied["watchdog"] == kwargs["watchdog"]
    finally:
        handle.shutdown(2)


class NoSettingsProbe:
    """A worker whose driver handed over nothing (no ``runtime_env(handle)``): what ``setup_worker`` says."""

    def setup(self) -> dict[str, Any]:
        import io
        import sys

        saved, sys.stderr = sys.stderr, io.StringIO()  # where the worker's warnings go (Ray forwards it)
        try:
            handle = oal_ray.setup_worker()
            oal_ray.setup_worker()  # a second call (or a second thread) says nothing more
            said = sys.stderr.getvalue()
        finally:
            sys.stderr = saved
        exports = handle.description
        handle.shutdown(2)
        return {"stderr": said, "exports": exports, "pid": os.getpid()}


def test_a_worker_without_the_drivers_settings_names_the_fixes_for_a_hook_named_off_the_command_line(
    ray_cluster: None,
) -> None:
    """verl's setup hook named in a Hydra config file or in the driver's code (not on its command line) runs only
    in workers: the driver hands nothing over. Each such worker says once what is missing and how to fix it:
    ``opentelemetry-instrument``, or the flag on the driver's command line (the installed .pth reads only that),
    or ``runtime_env()`` in code; it exports nothing and writes no local file."""
    probe = ray.remote(num_cpus=0)(NoSettingsProbe).options(runtime_env={"env_vars": {"OAL_PROBE": "none"}}).remote()
    try:
        got = ray.get(probe.setup.remote(), timeout=120)
    finally:
        ray.kill(probe)
    assert got["exports"] == "no exporter"
    lines = [line for line in got["stderr"].splitlines() if "got no tracing settings from its driver" in line]
    assert len(lines) == 1, got["stderr"]
    line = lines[0]
    assert f"(pid {got['pid']})" in line and "OTEL_EXPORTER_OTLP_ENDPOINT" in line
    assert (
        "A setup hook named in a config file (Hydra --config-name) or in the driver's code runs only in workers" in line
    )
    assert "start the driver with `opentelemetry-instrument`" in line
    flag = "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=otel_agentloop.integrations.verl.setup_worker"
    assert f"or put the flag on its command line (verl: {flag})" in line
    assert "runtime_env=otel_agentloop.integrations.ray.runtime_env() to ray.init" in line
