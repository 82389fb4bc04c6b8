"""verl 0.9.x's server path to the inference engine: the turn's context into ``engine.generate``, the engine's
numbers back onto the turn span, and the engine's OTLP endpoint (issue 28).

Contract:

- **Client** (the agent-loop worker; ``LLMServerClient._acquire_server`` patched): while a generation turn is
  current, the server handle verl acquires is wrapped for that one call. Its ``generate.remote(...)`` adds the
  turn's W3C headers (``traceparent``, sampled flag as our sampler decided) as keyword :data:`ENGINE_KEY`, only
  when the handle's own method signature names that keyword (its actor class was made remote from our server
  wrapper): a server made remote before ``instrument()`` is called exactly as verl does. The awaited result
  has the engine's numbers taken out of ``extra_fields`` before verl sees it; they go onto the current (turn)
  span. verl's result is otherwise unchanged.
- **Server** (the ``vLLMHttpServer`` actor; ``generate`` replaced): the keyword is always removed (also when
  not instrumented); while a call carries it, the engine's ``generate`` (wrapped once per engine object, as an
  instance attribute) gets ``trace_headers=`` (unless verl passed its own, or the engine's tracing is off),
  and the final ``RequestOutput``'s numbers travel back in ``extra_fields[ENGINE_KEY]``.
- **Engine arguments** (``_preprocess_engine_kwargs`` patched, on the server actor, while tracing): the engine
  keeps its per-request stats (``disable_log_stats=False`` unless in the user's ``engine_kwargs.vllm``); with
  our settings on OTLP/gRPC and an endpoint, ``otlp_traces_endpoint`` is set unless the user set it, and
  ``OTEL_SERVICE_NAME`` (read by vLLM's engine processes, spawned from the actor) defaults to our service name.
- **SGLang** (``SGLangHttpServer.generate``): ``GenerateReqInput`` is built from a request dict; the server
  wrapper adds ``external_trace_header`` to it while a call carries headers (:mod:`..sglang`'s wrapper), and
  SGLang's final output is read by :mod:`..sglang`'s reader.
"""

from __future__ import annotations

import contextvars
import inspect
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from types import ModuleType
from typing import Protocol

from opentelemetry import trace

from ...core._guard import internal_error, warn_once
from ...setup import current_handle
from .._engine import trace_headers
from .._patching import Args, AsyncOriginal, Kwargs, Original
from ..sglang import GenerateRequest, output_attributes, with_trace_header
from ..vllm._output import engine_attributes
from ..vllm._wrappers import engine_service_name
from . import _patching as patching
from ._segments import take_numbers

VLLM_SERVER = "verl.workers.rollout.vllm_rollout.vllm_async_server"
SGLANG_SERVER = "verl.workers.rollout.sglang_rollout.async_sglang_server"
ENGINE_KEY = "otel_agentloop_engine"
"""The keyword on the server's ``generate`` (headers in) and the ``extra_fields`` key (numbers out)."""


class _Call:
    """One server ``generate`` call carrying the turn: its headers in, the engine's final output seen."""

    __slots__ = ("engine", "final", "headers")

    def __init__(self, headers: dict[str, str], engine: str) -> None:
        self.headers, self.engine = headers, engine
        self.final: object = None


SERVER_TARGETS: tuple[tuple[str, str, str], ...] = (
    (VLLM_SERVER, "vLLMHttpServer", "generate"),
    (VLLM_SERVER, "vLLMHttpServer", "_preprocess_engine_kwargs"),
    (SGLANG_SERVER, "SGLangHttpServer", "generate"),
)
"""What this module patches on the server actors (their modules import the engine)."""

_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("otel_agentloop_engine_call", default=None)


# -- client: the agent-loop worker ------------------------------------------------------------------
def apply_llm_server(module: ModuleType) -> None:
    cls = getattr(module, "LLMServerClient", None)
    if cls is not None and "_acquire_server" in vars(cls):
        patching.patch(module, "LLMServerClient", "_acquire_server", _acquire_server)


async def _acquire_server(
    original: Callable[..., Awaitable[tuple[object, _Server]]], args: Args, kwargs: Kwargs
) -> object:
    acquired = await original(*args, **kwargs)
    try:
        server_id, server = acquired
        if isinstance(server, _CarryingServer) or not accepts_carrier(server):
            return acquired
        headers = trace_headers()
        if not headers:
            return acquired
        return server_id, _CarryingServer(server, headers)
    except Exception:
        internal_error("verl.engine.acquire")
        return acquired


class _RemoteMethod(Protocol):
    """A Ray actor handle's method: what ``.remote()`` returns is awaited."""

    def remote(self, *args: object, **kwargs: object) -> Awaitable[object]: ...


class _Server(Protocol):
    """The server handle verl acquires: its ``generate`` method."""

    @property
    def generate(self) -> _RemoteMethod: ...


def accepts_carrier(server: object) -> bool:
    """Whether ``server``'s ``generate`` (a Ray actor handle's method signature) takes :data:`ENGINE_KEY`."""
    signatures = getattr(server, "_ray_method_signatures", None)
    params = signatures.get("generate") if isinstance(signatures, Mapping) else None
    return params is not None and any(getattr(p, "name", None) == ENGINE_KEY for p in params)


class _CarryingServer:
    """A server handle for one call: ``generate.remote`` carries the headers; everything else is the handle's."""

    __slots__ = ("_headers", "_server")

    def __init__(self, server: _Server, headers: dict[str, str]) -> None:
        self._server, self._headers = server, headers

    def __getattr__(self, name: str) -> object:
        return getattr(self._server, name)

    @property
    def generate(self) -> _CarryingMethod:
        return _CarryingMethod(self._server.generate, self._headers)


class _CarryingMethod:
    __slots__ = ("_headers", "_method")

    def __init__(self, method: _RemoteMethod, headers: dict[str, str]) -> None:
        self._method, self._headers = method, headers

    def __getattr__(self, name: str) -> object:
        return getattr(self._method, name)

    def remote(self, *args: object, **kwargs: object) -> Awaitable[object]:
        kwargs.setdefault(ENGINE_KEY, self._headers)
        return _received(self._method.remote(*args, **kwargs))


async def _received(ref: Awaitable[object]) -> object:
    """Await the server's result; take the engine's numbers out of it and put them on the current span."""
    output = await ref
    try:
        extra = getattr(output, "extra_fields", None)
        numbers = extra.pop(ENGINE_KEY, None) if isinstance(extra, dict) else None
        if isinstance(numbers, Mapping) and numbers and not take_numbers(numbers):  # else: a resumed turn's
            span = trace.get_current_span()
            for key, value in numbers.items():
                span.set_attribute(str(key), value)
    except Exception:
        internal_error("verl.engine.received")
    return output


# -- server: the vLLMHttpServer / SGLangHttpServer actor ----------------------------------------------
def apply_vllm_server(module: ModuleType) -> None:
    cls = module.vLLMHttpServer
    patching.replace(module, "vLLMHttpServer", "generate", _server_generate(vars(cls)["generate"], None))
    patching.patch(module, "vLLMHttpServer", "_preprocess_engine_kwargs", _preprocess_engine_kwargs)


def _vllm_fallback(original: AsyncOriginal) -> Callable[..., object]:
    return _server_generate(original, None)


def _sglang_fallback(original: AsyncOriginal) -> Callable[..., object]:
    return _server_generate(original, "sglang")


# where instrumenting fails in a server actor, the keyword its callers send is still removed
patching.fallbacks[SERVER_TARGETS[0]] = _vllm_fallback
patching.fallbacks[SERVER_TARGETS[2]] = _sglang_fallback


def apply_sglang_server(module: ModuleType) -> None:
    cls = getattr(module, "SGLangHttpServer", None)
    if cls is not None and "generate" in vars(cls):
        patching.replace(module, "SGLangHttpServer", "generate", _server_generate(vars(cls)["generate"], "sglang"))


def _server_generate(original: AsyncOriginal, engine: str | None) -> Callable[..., object]:
    """``generate`` taking :data:`ENGINE_KEY` (always removed before verl's code runs)."""

    async def generate(self: object, *args: object, **kwargs: object) -> object:
        headers = kwargs.pop(ENGINE_KEY, None)
        if not patching.state.active or not isinstance(headers, dict):
            return await original(self, *args, **kwargs)
        call = _Call({str(k): str(v) for k, v in headers.items()}, engine or "vllm")
        token = _CALL.set(call)
        try:
            _carry_into(self, engine)
            output = await original(self, *args, **kwargs)
        finally:
            _CALL.reset(token)
        _send_back(output, call)
        return output

    # No ``__wrapped__``: Ray reads an actor method's signature from the innermost function (``inspect.unwrap``),
    # and callers must see this one, which takes the keyword.
    generate.__signature__ = _with_carrier(inspect.signature(original))  # type: ignore[attr-defined]
    return generate


def _with_carrier(signature: inspect.Signature) -> inspect.Signature:
    params = list(signature.parameters.values())
    extra = inspect.Parameter(ENGINE_KEY, inspect.Parameter.KEYWORD_ONLY, default=None)
    at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
    return signature.replace(parameters=[*params[:at], extra, *params[at:]])


def _carry_into(server: object, engine: str | None) -> None:
    """Wrap the server's engine entry once (an instance attribute reading :data:`_CALL`): vLLM's
    ``engine.generate``, SGLang's ``tokenizer_manager.generate_request``."""
    try:
        owner = getattr(server, "tokenizer_manager" if engine == "sglang" else "engine", None)
        name = "generate_request" if engine == "sglang" else "generate"
        inner = getattr(owner, name, None)
        if inner is None or patching.is_ours(inner):
            return
        carry = _sglang_generate(inner) if engine == "sglang" else _engine_generate(inner, _tracing_on(owner))
        setattr(owner, name, carry)
    except Exception:
        internal_error("verl.engine.carry")


def _tracing_on(engine: object) -> bool:
    """vLLM drops headers (with a warning) when its tracing is off: only an engine that says so is spared."""
    config = getattr(engine, "observability_config", None)
    return config is None or getattr(config, "otlp_traces_endpoint", None) is not None


def _engine_generate(inner: Callable[..., AsyncIterator[object]], tracing: bool) -> Callable[..., object]:
    def generate(*args: object, **kwargs: object) -> object:
        call = _CALL.get()
        if call is None or not patching.state.active:
            return inner(*args, **kwargs)
        if tracing and kwargs.get("trace_headers") is None:
            kwargs["trace_headers"] = call.headers
        return _relay(inner(*args, **kwargs), call)

    return _ours(generate, inner)


def _sglang_generate(inner: Callable[..., AsyncIterator[object]]) -> Callable[..., object]:
    def generate_request(obj: GenerateRequest, *args: object, **kwargs: object) -> object:
        call = _CALL.get()
        if call is None or not patching.state.active:
            return inner(obj, *args, **kwargs)
        with_trace_header(obj, call.headers)
        return _relay(inner(obj, *args, **kwargs), call)

    return _ours(generate_request, inner)


def _ours(wrapper: Callable[..., object], inner: Callable[..., object]) -> Callable[..., object]:
    wrapper.__wrapped__ = inner  # type: ignore[attr-defined]
    setattr(wrapper, "__otel_agentloop_patch__", True)  # noqa: B010  # is_ours(): wrapped once per engine
    return wrapper


async def _relay(outputs: AsyncIterator[object], call: _Call) -> AsyncIterator[object]:
    """The engine's outputs unchanged; the last one is kept. Closing or cancelling closes the engine's."""
    try:
        async for output in outputs:
            call.final = output
            yield output
    finally:
        close = getattr(outputs, "aclose", None)
        if close is not None:
            await close()


def _send_back(output: object, call: _Call) -> None:
    if call.final is None:
        return
    try:
        extra = getattr(output, "extra_fields", None)
        if isinstance(extra, dict):
            numbers = output_attributes(call.final) if call.engine == "sglang" else engine_attributes(call.final)
            extra[ENGINE_KEY] = numbers
    except Exception:
        internal_error("verl.engine.send_back")


# -- engine arguments: the endpoint and service name, on the server actor ------------------------------
def _preprocess_engine_kwargs(original: Original, args: Args, kwargs: Kwargs) -> object:
    result = original(*args, **kwargs)
    try:
        engine_kwargs = args[1] if len(args) > 1 else kwargs.get("engine_kwargs")
        if isinstance(engine_kwargs, dict):
            give_endpoint(engine_kwargs, os.environ)
    except Exception:
        internal_error("verl.engine.endpoint")
    return result


def give_endpoint(engine_kwargs: dict[str, object], environ: MutableMapping[str, str]) -> None:
    """While we trace: the engine keeps its per-request stats (``disable_log_stats=False`` unless the user put
    it in ``engine_kwargs``: verl's default is ``True``, which leaves the turn without the engine's timing and
    makes vLLM's tracing fail on every finished request); with our settings on OTLP/gRPC and an endpoint, and no
    ``otlp_traces_endpoint`` from the user: ours, and ``OTEL_SERVICE_NAME`` for the engine's processes unless
    set (as ``integrations.vllm`` gives it)."""
    handle = current_handle()
    settings = handle.settings if handle is not None and handle.enabled else None
    if settings is None:
        return
    engine_kwargs.setdefault("disable_log_stats", False)
    if settings.protocol == "grpc" and settings.endpoint and engine_kwargs.get("otlp_traces_endpoint") is None:
        engine_kwargs["otlp_traces_endpoint"] = settings.endpoint
        service = engine_service_name()
        if service is not None:
            environ.setdefault("OTEL_SERVICE_NAME", service)
    if engine_kwargs.get("otlp_traces_endpoint") is not None and engine_kwargs.get("disable_log_stats"):
        warn_once(
            "verl.engine.log_stats",
            "otel_agentloop: engine_kwargs.vllm sets otlp_traces_endpoint with disable_log_stats=True: vLLM's "
            "tracing needs its request stats and fails on each finished request; set disable_log_stats=False",
        )
