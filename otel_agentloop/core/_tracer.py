"""Which tracer the decorators use, resolved cheaply on every call.

Precedence: the provider installed by :func:`otel_agentloop.configure` (even with ``set_global=False``),
else the global OpenTelemetry provider. No provider, the API's proxy/no-op provider, an SDK disabled by
``OTEL_SDK_DISABLED``, or an explicit disable all resolve to ``None``: the caller then runs the bare function.
The in-flight registry attached to that provider (:func:`set_registry`) is resolved with it
(:func:`current_registry`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.trace import NoOpTracer, NoOpTracerProvider, ProxyTracerProvider, Tracer, TracerProvider

from .._version import __version__
from ._state import state

if TYPE_CHECKING:  # typed here, imported where they are made (neither imports this module)
    from ._inflight import InflightRegistry
    from ._recorder import Recorder

SCOPE = "otel_agentloop"
"""The instrumentation scope of every span the library starts."""


_state = state.tracer  # read on every decorated call: one module global, one attribute


def current_tracer() -> Tracer | None:
    """The tracer to use now, or ``None`` when tracing is off. O(1) when nothing changed."""
    if _state.disabled:
        return None
    provider = _state.configured
    if provider is None:
        provider = trace.get_tracer_provider()
    if provider is _state.key:
        return _state.tracer
    return _resolve(provider)


def _resolve(provider: TracerProvider) -> Tracer | None:
    tracer: Tracer | None = None
    if not isinstance(provider, (ProxyTracerProvider, NoOpTracerProvider)) and provider not in _state.retired:
        candidate = provider.get_tracer(SCOPE, __version__)
        if not isinstance(candidate, NoOpTracer):
            tracer = candidate
    with _state.lock:
        _state.key = provider
        _state.tracer = tracer
        _state.registry = _state.registries.get(provider) if tracer is not None else None
        _state.recorder = _state.recorders.get(provider) if tracer is not None else None
    return tracer


def current_registry() -> InflightRegistry | None:
    """The in-flight registry of the provider :func:`current_tracer` resolved last (call it right after),
    or ``None``."""
    return _state.registry


def current_recorder() -> Recorder | None:
    """The fast-path recorder (``_recorder.Recorder``) of the provider :func:`current_tracer` resolved last (call
    it right after), or ``None``: spans then go through the SDK."""
    return _state.recorder


def set_recorder(provider: TracerProvider, recorder: Recorder) -> None:
    """Record the spans the library starts through ``provider`` on ``recorder`` (the fast path)."""
    with _state.lock:
        _state.recorders[provider] = recorder
        _state.key = None


def set_registry(provider: TracerProvider, registry: InflightRegistry) -> None:
    """Feed ``registry`` from the spans started through ``provider``."""
    with _state.lock:
        _state.registries[provider] = registry
        _state.key = None


def install(provider: TracerProvider | None) -> TracerProvider | None:
    """Make ``provider`` the one the decorators use (``None``: fall back to the global one); return the previous."""
    return _state.install(provider)


def retire(provider: TracerProvider) -> None:
    """``provider`` was shut down: never trace through it again, even where it stays the global provider
    (the OpenTelemetry API lets the global provider be set only once)."""
    with _state.lock:
        _state.retired.add(provider)
        _state.key = None


def set_disabled(disabled: bool) -> None:
    """Switch all instrumentation off (or back on) in this process."""
    _state.disabled = disabled
