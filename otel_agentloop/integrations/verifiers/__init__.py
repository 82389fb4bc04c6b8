"""Drop-in instrumentation of verifiers environments (prime-rl's rollouts): work in progress (issue 39)."""

from __future__ import annotations

import importlib.util
from collections.abc import Collection
from typing import Any

from .._instrumentor import Instrumentor

__all__ = ["VerifiersInstrumentor", "instrument", "uninstrument"]


def instrument() -> bool:
    """Not yet built: returns ``False``."""
    return False


def uninstrument() -> None:
    """Not yet built."""


class VerifiersInstrumentor(Instrumentor):
    """OpenTelemetry instrumentor for verifiers (entry point ``verifiers``)."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        if importlib.util.find_spec("verifiers") is None:
            return
        instrument()

    def _uninstrument(self, **kwargs: Any) -> None:
        uninstrument()
