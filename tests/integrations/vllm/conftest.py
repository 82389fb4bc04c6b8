"""The vLLM integration's tests without an engine (tests/engine runs a real one): each test also in its own
``testing.isolated()`` (as both modules here had it), inside the one tests/conftest.py gives every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from otel_agentloop.testing import isolated


@pytest.fixture(autouse=True)
def _isolated() -> Iterator[None]:
    with isolated():
        yield
