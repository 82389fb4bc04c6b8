"""Helpers shared by more than one test room (and by the framework stages: tests/verl, tests/engine, tests/trl,
tests/verifiers): real OTLP receivers, the fast-path parity harness, a two-node Ray cluster, the Trace Event
Format reader, the tree guard, the vLLM-on-CPU environment, and driver scripts run as ``__main__``.

This package imports nothing of ``otel_agentloop``: scripts run in the framework venvs import its modules before
they set anything up."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout's root (where pyproject.toml is), whatever room a test lives in."""
