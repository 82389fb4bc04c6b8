"""The base of our OpenTelemetry instrumentors (``opentelemetry_instrumentor`` entry points ``ray`` and ``verl``).

``BaseInstrumentor`` when opentelemetry-instrumentation is installed (the ``ray`` and ``verl`` extras), so that
``opentelemetry-instrument`` finds them and ``instrument()``/``uninstrument()`` are idempotent; without it a
stand-in with the same two calls. Subclasses define ``instrumentation_dependencies``, ``_instrument`` and
``_uninstrument``.
"""

from __future__ import annotations

from typing import Any


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

    if _base_instrumentor() is object:

        def instrument(self, **kwargs: Any) -> None:
            self._instrument(**kwargs)  # type: ignore[attr-defined,unused-ignore]

        def uninstrument(self, **kwargs: Any) -> None:
            self._uninstrument(**kwargs)  # type: ignore[attr-defined,unused-ignore]
