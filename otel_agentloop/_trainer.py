"""Trainer phases as spans: one training step becomes a waterfall too.

``trainer_phase(name, timing_raw)`` fits verl's ``marked_timer(name, timing_raw)`` call sites: it opens a
``rl.train.<name>`` span below the current span (normally the ``rl.step`` span) and, when given verl's
``timing_raw`` dict, also adds the block's seconds to ``timing_raw[name]`` exactly like the timer it replaces.
Usable as a context manager (sync or async) and as a decorator.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, MutableMapping
from types import TracebackType
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span

from . import semconv as sc
from ._context import current_step, mark_error
from ._guard import internal_error
from ._tracer import current_tracer

F = TypeVar("F", bound=Callable[..., Any])

VERL_TRAINER_PHASES = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor",
                       "testing", "save_checkpoint", "update_weights")
"""The names verl's trainer passes to ``marked_timer`` (any other name works too)."""


class trainer_phase:  # noqa: N801 - used like a function: ``with otel_agentloop.trainer_phase("gen", timing_raw):``
    """A span ``rl.train.<name>`` (and, optionally, verl-style timing accumulation) around a block or function."""

    __slots__ = ("_span", "_t0", "_token", "name", "timing_raw")

    def __init__(self, name: str, timing_raw: MutableMapping[str, float] | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("trainer_phase needs a non-empty name")
        self.name = name
        self.timing_raw = timing_raw
        self._span: Span | None = None
        self._token: object = None
        self._t0 = 0.0

    def __enter__(self) -> Span:
        self._t0 = time.perf_counter()
        tracer = current_tracer()
        if tracer is None:
            return trace.INVALID_SPAN
        try:
            step = current_step()
            attrs: dict[str, Any] = {sc.RL_PHASE_TRAIN: self.name}
            if step is not None:
                attrs[sc.RL_STEP] = step.step
                attrs[sc.RL_VALIDATE] = step.validate
            self._span = tracer.start_span(sc.TRAINER_PHASE_SPAN_PREFIX + self.name, attributes=attrs)
            self._token = otel_context.attach(trace.set_span_in_context(self._span))
            return self._span
        except Exception:
            internal_error("trainer_phase.enter")
            return trace.INVALID_SPAN

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        elapsed = time.perf_counter() - self._t0
        if self.timing_raw is not None:
            self.timing_raw[self.name] = self.timing_raw.get(self.name, 0.0) + elapsed
        span, self._span = self._span, None
        token, self._token = self._token, None
        if span is None:
            return
        try:
            otel_context.detach(token)  # type: ignore[arg-type]
            if exc is not None:
                mark_error(span, exc)
            span.end()
        except Exception:
            internal_error("trainer_phase.exit")

    async def __aenter__(self) -> Span:
        return self.__enter__()

    async def __aexit__(self, et: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.__exit__(et, exc, tb)

    def __call__(self, fn: F) -> F:
        """Decorate ``fn``: each call is one phase (a fresh context manager per call)."""
        name, timing_raw = self.name, self.timing_raw
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                async with trainer_phase(name, timing_raw):
                    return await fn(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with trainer_phase(name, timing_raw):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]
