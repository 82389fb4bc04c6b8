"""What the ``traced`` fixture (tests/conftest.py) yields, and the span-derived part of ``collect()``'s metrics."""

from __future__ import annotations

from otel_agentloop import testing

Traced = testing.Captured
"""What the ``traced`` fixture (tests/conftest.py) yields."""


def span_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The keys derived from spans (drops the process's ``agent_loop/telemetry/`` counters)."""
    return {k: v for k, v in metrics.items() if not k.startswith("agent_loop/telemetry/")}
