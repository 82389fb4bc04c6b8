"""The wrappers ``instrument()`` puts on vLLM's v1 ``AsyncLLM`` (see the package docstring for the contract)."""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncGenerator, Callable

from opentelemetry.trace import Span

from ...core._context import current_step
from ...core._guard import internal_error, warn_once
from .._engine import record_attributes, trace_headers, turn_span
from .._patching import Switch
from ._load import EngineLoad
from ._logger import stat_logger_factory, takes_loggers, with_our_logger
from ._output import LOAD_FIELD, OutputReader
from ._segments import Attempt

switch = Switch()

LOAD_ATTR = "_otel_agentloop_load"
"""The instance attribute of an instrumented ``AsyncLLM`` that holds its :class:`~._load.EngineLoad`."""


class _Request:
    """One ``generate`` call under instrumentation: the turn it belongs to (captured when the call starts), the
    reader of every output, the engine's load series and where this request started in it, and whether its
    numbers were recorded (once: at its finished output, or with ``rl.engine.finish="aborted"`` when the stream
    ends without one). Without a recording turn here (a server process: verl's ``vLLMHttpServer``, whose
    caller's turn is in another process) the load figures ride on the last output (:data:`~._output.LOAD_FIELD`)
    for whoever reads it with ``engine_attributes`` to carry them to the turn."""

    __slots__ = ("attempt", "done", "load", "mark", "reader", "turn")

    def __init__(self, turn: Span | None, delta: bool, load: EngineLoad | None) -> None:
        self.turn = turn
        self.attempt = Attempt(turn) if turn is not None else None
        self.reader = OutputReader(delta=delta)
        self.done = False
        self.load = load
        self.mark = load.series.mark() if load is not None else (0, 0.0)

    @classmethod
    def open(cls, args: tuple[object, ...], kwargs: dict[str, object]) -> _Request | None:
        """The request of a call ``generate(self, prompt, sampling_params, request_id, ...)``; ``None`` when its
        turn is not recording and the engine has no load record. Never raises."""
        try:
            found = turn_span()
            turn = found if found.is_recording() else None
            load = getattr(args[0], LOAD_ATTR, None) if args else None
            if not isinstance(load, EngineLoad):
                load = None
            if turn is None and load is None:
                return None
            if load is not None:
                step = current_step()
                if step is not None and type(step.step) is int:
                    load.see_step(step.step)
            params = args[2] if len(args) > 2 else kwargs.get("sampling_params")
            kind = getattr(getattr(params, "output_kind", None), "name", None)
            return cls(turn, kind == "DELTA", load)
        except Exception:
            internal_error("vllm.generate.open")
            return None

    def add(self, output: object) -> None:
        """One output of the stream. Never raises."""
        try:
            if self.turn is None:
                self.reader.last = output
            else:
                self.reader.add(output)
            if getattr(output, "finished", False) is True:
                self.finish(ended=True)
        except Exception:
            internal_error("vllm.generate.add")

    def finish(self, *, ended: bool) -> None:
        """Record the request's numbers, once (``ended``: its finished output came). Never raises."""
        if self.done:
            return
        self.done = True
        try:
            self._record(ended)
        except Exception:
            internal_error("vllm.generate.finish")

    def _record(self, ended: bool) -> None:
        load = self.load.series.summary(self.mark) if self.load is not None else {}
        if self.turn is None:
            if load and self.reader.last is not None:
                try:
                    setattr(self.reader.last, LOAD_FIELD, load)
                except Exception:  # an output that takes no attribute: the figures are not carried
                    internal_error("vllm.generate.load_field")
            return
        attrs = self.reader.attributes(ended=ended)
        attrs.update(load)
        if self.attempt is not None:
            attrs = self.attempt.end(attrs)
        record_attributes(attrs, self.turn)

    def headers_span(self) -> Span | None:
        """The span whose ``traceparent`` goes to the engine (a resumed attempt's segment), ``None``: current."""
        return self.attempt.context_span() if self.attempt is not None else None


def wrap_generate(
    original: Callable[..., AsyncGenerator[object, object]],
) -> Callable[..., AsyncGenerator[object, object]]:
    """``AsyncLLM.generate`` with the current span's ``trace_headers`` (unless the caller passed its own) and every
    output read onto the turn span (``_output.OutputReader``; the turn: ``integrations._engine.turn_span``, as
    the call starts). The async generator is forwarded exactly: ``asend``, ``athrow``, ``aclose``,
    cancellation and exceptions reach vLLM's generator as if called directly."""

    async def generate(*args: object, **kwargs: object) -> AsyncGenerator[object, object]:
        request = None
        if switch.active:
            request = _Request.open(args, kwargs)
            if kwargs.get("trace_headers") is None:
                headers = trace_headers(request.headers_span() if request is not None else None)
                if headers:
                    kwargs["trace_headers"] = headers
        inner = original(*args, **kwargs)
        try:
            try:
                value = await inner.__anext__()
            except StopAsyncIteration:
                return
            while True:
                if request is not None:
                    request.add(value)
                try:
                    sent = yield value
                except GeneratorExit:
                    await inner.aclose()
                    raise
                except BaseException as exc:  # athrow() on us: into vLLM's generator, as if called directly
                    try:
                        value = await inner.athrow(exc)
                    except StopAsyncIteration:
                        return
                    continue
                try:
                    value = await inner.asend(sent)
                except StopAsyncIteration:
                    return
        finally:
            if request is not None:
                request.finish(ended=False)  # no finished output: closed, cancelled or failed (a no-op after one)

    functools.update_wrapper(generate, original, assigned=("__name__", "__doc__"), updated=())  # + __wrapped__
    return generate


def wrap_init(original: Callable[..., None], endpoint: Callable[[], str | None]) -> Callable[..., None]:
    """``AsyncLLM.__init__`` that adds our stat logger (``_logger``: after the caller's, vLLM's defaults kept)
    feeding the engine's :class:`~._load.EngineLoad` (kept on the engine as :data:`LOAD_ATTR`), and gives the
    engine an OTLP/gRPC traces endpoint when it has none (``endpoint()``: ours, ``None`` to leave it off) and
    ``OTEL_SERVICE_NAME`` for its processes; neither to an engine without request stats (``log_stats=False``:
    vLLM makes no stat loggers, and its tracing would fail on each finished request)."""

    loggers = takes_loggers(original)

    def init(self: object, vllm_config: object, *args: object, **kwargs: object) -> None:
        load = None
        if switch.active:
            try:
                log_stats = kwargs["log_stats"] if "log_stats" in kwargs else args[1] if len(args) > 1 else True
                if log_stats:
                    _give_endpoint(vllm_config, endpoint)
                    if loggers:
                        load = EngineLoad()
                        args = with_our_logger(args, kwargs, stat_logger_factory(load))
                else:  # vLLM's tracing reads each request's stats: with none it fails on every finished request
                    warn_once(
                        "vllm.log_stats",
                        "otel_agentloop: this AsyncLLM runs with disable_log_stats=True: it gets no traces endpoint "
                        "from us (vLLM's tracing needs its request stats) and its turns carry no engine timing",
                    )
            except Exception:
                internal_error("vllm.endpoint")
        original(self, vllm_config, *args, **kwargs)
        if load is not None:
            setattr(self, LOAD_ATTR, load)

    functools.update_wrapper(init, original, assigned=("__name__", "__doc__"), updated=())
    return init


def wrap_shutdown(original: Callable[..., object]) -> Callable[..., object]:
    """``AsyncLLM.shutdown`` that first closes the engine's load windows (their spans are exported)."""

    def shutdown(self: object, *args: object, **kwargs: object) -> object:
        load = getattr(self, LOAD_ATTR, None)
        if isinstance(load, EngineLoad):
            load.close()
        return original(self, *args, **kwargs)

    functools.update_wrapper(shutdown, original, assigned=("__name__", "__doc__"), updated=())
    return shutdown


def _give_endpoint(vllm_config: object, endpoint: Callable[[], str | None]) -> None:
    observability = getattr(vllm_config, "observability_config", None)
    if observability is None or getattr(observability, "otlp_traces_endpoint", None) is not None:
        return
    target = endpoint()
    if target is None:
        return
    observability.otlp_traces_endpoint = target
    service = engine_service_name()
    if service is not None:
        os.environ.setdefault("OTEL_SERVICE_NAME", service)


def engine_service_name() -> str | None:
    """The service name the engine's own processes export under: the configured one (the same service)."""
    from ...setup import current_handle

    handle = current_handle()
    return handle.settings.service_name if handle is not None and handle.settings.service_name else None
