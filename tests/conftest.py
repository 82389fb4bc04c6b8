"""Shared fixtures: a configured otel_agentloop with an in-memory exporter, isolated per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_agentloop as oal
from otel_agentloop.core import _context, _guard, _tracer


@dataclass
class Traced:
    handle: oal.Handle
    exporter: InMemorySpanExporter

    def spans(self) -> list[ReadableSpan]:
        assert self.handle.force_flush(5)
        return list(self.exporter.get_finished_spans())

    def by_name(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name == name]


@pytest.fixture(autouse=True)
def _isolate(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No OTEL_* from the outer environment; decorator state and once-only warnings reset."""
    for key in list(os.environ):
        if key.startswith(("OTEL_", "OTEL_AGENTLOOP_")):
            monkeypatch.delenv(key)
    _guard.reset_warnings()
    # restore what the test found (not a blank state): a module-scoped fixture's provider stays installed for
    # the module's next test instead of falling back to whatever became the global provider first
    configured, disabled, trace_per = _tracer._state.configured, _tracer.is_disabled(), _context.defaults.trace_per
    yield
    _tracer.install(configured)
    _tracer.set_disabled(disabled)
    _context.defaults.trace_per = trace_per


@pytest.fixture
def traced(tmp_path: os.PathLike[str]) -> Iterator[Traced]:
    exporter = InMemorySpanExporter()
    handle = oal.configure("test", exporters=[exporter], set_global=False, schedule_delay_s=0.05)
    yield Traced(handle, exporter)
    handle.shutdown(5)


def span_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The keys derived from spans (drops the process's ``agent_loop/telemetry/`` counters)."""
    return {k: v for k, v in metrics.items() if not k.startswith("agent_loop/telemetry/")}
