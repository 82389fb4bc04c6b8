"""Drop-in instrumentation of TRL's GRPOTrainer: work in progress (issue 37)."""

from __future__ import annotations

import importlib.util
from collections.abc import Collection
from typing import Any

from .._instrumentor import Instrumentor

__all__ = ["TrlInstrumentor", "instrument", "uninstrument"]


def instrument() -> bool:
    """Not yet built: returns ``False``."""
    return False


def uninstrument() -> None:
    """Not yet built."""


class TrlInstrumentor(Instrumentor):
    """OpenTelemetry instrumentor for TRL (entry point ``trl``)."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        if importlib.util.find_spec("trl") is None:
            return
        instrument()

    def _uninstrument(self, **kwargs: Any) -> None:
        uninstrument()
