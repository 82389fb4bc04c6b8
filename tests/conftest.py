"""Shared fixtures: a configured otel_agentloop with an in-memory exporter, isolated per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from otel_agentloop import testing

Traced = testing.Captured


@pytest.fixture(autouse=True)
def _isolate() -> Iterator[None]:
    """No OTEL_* from the outer environment; once-only warnings forgotten; process state put back after."""
    with testing.isolated():
        yield


@pytest.fixture
def traced() -> Iterator[Traced]:
    with testing.capture() as captured:
        yield captured


def span_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The keys derived from spans (drops the process's ``agent_loop/telemetry/`` counters)."""
    return {k: v for k, v in metrics.items() if not k.startswith("agent_loop/telemetry/")}
