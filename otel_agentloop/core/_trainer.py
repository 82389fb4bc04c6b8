"""Trainer phases as spans: one training step becomes a waterfall too.

``trainer_phase(name, timing_raw)`` fits verl's ``marked_timer(name, timing_raw)`` call sites: it opens a
``rl.train.<name>`` span below the current span (normally the ``rl.step`` span) and, when given verl's
``timing_raw`` dict, also adds the block's seconds to ``timing_raw[name]`` exactly like the timer it replaces.
Usable as a context manager (sync or async) and as a decorator.
"""

from __future__ import annotations

import time
from collections.abc import Callable, MutableMapping
from types import TracebackType
from typing import TypeVar

from opentelemetry import trace
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from .. import semconv as sc
from ._current import _SAMPLE, current_step
from ._guard import internal_error
from ._instrument import instrument
from ._lifecycle import open_span
from ._scope import AsyncWith, OpenSpan, Scope, span_of
from ._tracer import current_tracer

F = TypeVar("F", bound=Callable[..., object])

VERL_TRAINER_PHASES = (
    "gen",
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "testing",
    "save_checkpoint",
    "update_weights",
)
"""The names verl's trainer passes to ``marked_timer`` (any other name works too)."""


class _TrainerScope(Scope):
    """One trainer phase: the ``rl.train.<name>`` span (when tracing is on) and verl-style seconds."""

    __slots__ = ("inner", "name", "t0", "timing_raw")

    def __init__(self, name: str, timing_raw: MutableMapping[str, float] | None) -> None:
        self.name = name
        self.timing_raw = timing_raw
        self.t0 = time.perf_counter()
        self.inner: OpenSpan | None = None
        tracer = current_tracer()
        if tracer is None:
            return
        try:
            step = current_step()
            attrs: dict[str, AttributeValue] = {sc.RL_PHASE_TRAIN: name}
            if step is not None:
                attrs[sc.RL_STEP] = step.step
                attrs[sc.RL_VALIDATE] = step.validate
            sample = _SAMPLE.get()  # inside a sample: on the sample's timeline, like its phases (see _clock)
            offset = sample.clock_offset if sample is not None else None
            self.inner = open_span(tracer, sc.TRAINER_PHASE_SPAN_PREFIX + name, attrs, offset, enter=False)
        except Exception:
            internal_error("trainer_phase.enter")

    def enter(self) -> None:
        if self.inner is not None:
            self.inner.enter()

    def leave(self) -> None:
        if self.inner is not None:
            self.inner.leave()

    def close(self, exc: BaseException | None) -> None:
        if self.timing_raw is not None:
            try:
                elapsed = time.perf_counter() - self.t0
                self.timing_raw[self.name] = self.timing_raw.get(self.name, 0.0) + elapsed
            except Exception:
                internal_error("trainer_phase.timing_raw")
        inner, self.inner = self.inner, None
        if inner is not None:
            inner.close(exc)


class trainer_phase(AsyncWith[Span]):  # noqa: N801 - used like a function: ``with otel_agentloop.trainer_phase("gen", timing_raw):``
    """A span ``rl.train.<name>`` (and, optionally, verl-style timing accumulation) around a block or function.

    As a decorator it uses the library's one lifecycle (sync, async, generators, async generators, callables
    returning awaitables: see :func:`otel_agentloop.core._instrument.instrument`)."""

    __slots__ = ("_scope", "name", "timing_raw")

    def __init__(self, name: str, timing_raw: MutableMapping[str, float] | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("trainer_phase needs a non-empty name")
        self.name = name
        self.timing_raw = timing_raw
        self._scope: _TrainerScope | None = None

    def _begin(self, kwargs: dict[str, object] | None = None) -> _TrainerScope | None:
        if self.timing_raw is None and current_tracer() is None:
            return None
        scope = _TrainerScope(self.name, self.timing_raw)
        scope.enter()
        return scope

    def __enter__(self) -> Span:
        scope = self._scope = self._begin()
        if scope is None or scope.inner is None:
            return trace.INVALID_SPAN
        return span_of(scope.inner)

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        scope, self._scope = self._scope, None
        if scope is not None:
            scope.exit(exc)

    def __call__(self, fn: F) -> F:
        """Decorate ``fn``: each call is one phase."""
        return instrument(fn, trainer_phase(self.name, self.timing_raw)._begin)
