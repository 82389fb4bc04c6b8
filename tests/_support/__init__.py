"""Helpers shared by more than one test room (and by the framework stages: tests/verl, tests/engine, tests/trl,
tests/verifiers): real OTLP receivers, the fast-path parity harness, a two-node Ray cluster, the Trace Event
Format reader, the tree guard, the vLLM-on-CPU environment, and driver scripts run as ``__main__``."""

from __future__ import annotations

from pathlib import Path

from otel_agentloop import testing

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout's root (where pyproject.toml is), whatever room a test lives in."""

Traced = testing.Captured
"""What the ``traced`` fixture (tests/conftest.py) yields."""


def span_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The keys derived from spans (drops the process's ``agent_loop/telemetry/`` counters)."""
    return {k: v for k, v in metrics.items() if not k.startswith("agent_loop/telemetry/")}
