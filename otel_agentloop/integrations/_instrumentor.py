"""The base of our OpenTelemetry instrumentors (``opentelemetry_instrumentor`` entry points ``ray``, ``verl``,
``vllm``, ``verifiers``, ``trl``).

``BaseInstrumentor`` when opentelemetry-instrumentation is installed (the ``ray`` and ``verl`` extras), so that
``opentelemetry-instrument`` finds them and ``instrument()``/``uninstrument()`` are idempotent; without it a
stand-in with the same two calls. Subclasses set :attr:`Instrumentor.package`, :attr:`Instrumentor.dependencies`
and their integration's ``instrument``/``uninstrument`` as :meth:`Instrumentor.on`/:meth:`Instrumentor.off` (or
override ``_start``): ``opentelemetry-instrument`` loads every entry point, so nothing is started where
``package`` is not installed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Collection, Mapping


def _base_instrumentor() -> type:
    try:
        from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined,unused-ignore]  # pyright: ignore[reportMissingImports]  # an extra
            BaseInstrumentor,
        )
    except ImportError:  # pragma: no cover - opentelemetry-instrumentation is in the ray and verl extras
        return object
    return BaseInstrumentor  # type: ignore[no-any-return,unused-ignore]


class Instrumentor(_base_instrumentor()):  # type: ignore[misc]
    """``BaseInstrumentor``, or its two calls without opentelemetry-instrumentation."""

    package: str | None = None
    """The import name that must be installed for ``_start`` to run (``None``: always)."""
    dependencies: Collection[str] = ()
    """``instrumentation_dependencies()``: the distributions and versions instrumented."""

    if _base_instrumentor() is object:

        def instrument(self, **kwargs: object) -> None:
            self._instrument(**kwargs)

        def uninstrument(self, **kwargs: object) -> None:
            self._uninstrument(**kwargs)

    def instrumentation_dependencies(self) -> Collection[str]:
        return self.dependencies

    def _instrument(self, **kwargs: object) -> None:
        if self.package is not None and importlib.util.find_spec(self.package) is None:
            return
        self._start(kwargs)

    def _uninstrument(self, **kwargs: object) -> None:
        self._stop()

    def _start(self, kwargs: Mapping[str, object]) -> None:
        self.on()

    def _stop(self) -> None:
        self.off()

    @staticmethod
    def on() -> object:
        """The integration's ``instrument()``."""
        raise NotImplementedError

    @staticmethod
    def off() -> object:
        """The integration's ``uninstrument()``."""
        raise NotImplementedError
