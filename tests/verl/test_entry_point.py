"""The verl instrumentor as an OpenTelemetry ``BaseInstrumentor``, found by ``opentelemetry-instrument``
through the ``opentelemetry_instrumentor`` entry point."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
from opentelemetry.sdk.trace import TracerProvider

from otel_agentloop.core._state import state
from otel_agentloop.integrations import verl as oal_verl

PROBE = """
import importlib
from otel_agentloop.integrations import verl
agent_loop = importlib.import_module("verl.experimental.agent_loop.agent_loop")
wrapped = vars(agent_loop.AgentLoopWorker)["_run_agent_loop"]
print("instrumented", verl.is_instrumented(), getattr(wrapped, "__otel_agentloop_patch__", False))
"""


def test_entry_point_is_declared() -> None:
    (ep,) = [e for e in importlib.metadata.entry_points(group="opentelemetry_instrumentor") if e.name == "verl"]
    assert ep.load() is oal_verl.VerlInstrumentor
    assert issubclass(oal_verl.VerlInstrumentor, BaseInstrumentor)


def test_opentelemetry_instrument_finds_and_applies_it(tmp_path: Path) -> None:
    cli = Path(sys.executable).with_name("opentelemetry-instrument")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
    out = subprocess.run(
        [str(cli), sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "instrumented True True" in out.stdout, (out.stdout, out.stderr[-3000:])
    # and the standard switch turns it off
    env["OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"] = "verl"
    out = subprocess.run(
        [str(cli), sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    assert "instrumented False False" in out.stdout, (out.stdout, out.stderr[-3000:])


def test_base_instrumentor_takes_a_tracer_provider_and_restores() -> None:
    from test_verl_instrumentation import _attrs

    before = _attrs()
    provider = TracerProvider()
    instrumentor = oal_verl.VerlInstrumentor()
    try:
        instrumentor.instrument(tracer_provider=provider)
        assert oal_verl.is_instrumented() and instrumentor.is_instrumented_by_opentelemetry
        assert state.tracer.configured is provider
        instrumentor.instrument(tracer_provider=provider)  # BaseInstrumentor: a second call is a no-op
        assert all(_attrs()[k] is not before[k] for k in before)
    finally:
        instrumentor.uninstrument()
    assert not oal_verl.is_instrumented() and _attrs() == before
    assert state.tracer.configured is None  # the provider is uninstalled with the patches
