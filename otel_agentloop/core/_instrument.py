"""Wrapping a callable so each call runs in a :class:`~otel_agentloop.core._scope.Scope`: :func:`instrument`.

The kind is decided at decoration time (sync, async, generator, async generator, a sync callable returning an
awaitable); every wrapper of the library (``phase``/``trace_*``, ``trainer_phase``, ``traced_remote``) is built
here, so they all keep the wrapped callable's semantics the same way.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from types import TracebackType
from typing import Any, ParamSpec, Protocol, TypeVar, cast

from ._guard import internal_error
from ._kinds import is_async_callable, is_asyncgen_callable, is_gen_callable
from ._scope import NOOP, Begin, Scope

F = TypeVar("F", bound=Callable[..., object])
P = ParamSpec("P")
T = TypeVar("T")
Y = TypeVar("Y")  # what a generator yields
S = TypeVar("S")  # what is sent into it
R = TypeVar("R")  # what a call returns


class _Outcome(Protocol):
    """A completed future, as a done callback sees it (asyncio's, ``concurrent.futures``', Ray's)."""

    def cancelled(self) -> bool: ...

    def exception(self) -> BaseException | None: ...


_awaitable_types: dict[type, bool] = {}


def _is_awaitable(value: object) -> bool:
    t = type(value)
    known = _awaitable_types.get(t)
    if known is None:
        known = hasattr(t, "__await__")
        if len(_awaitable_types) < 1024:
            _awaitable_types[t] = known
    return known


async def _finish_after(awaitable: Awaitable[T], scope: Scope) -> T:
    scope.enter()
    try:
        result = await awaitable
    except BaseException as exc:
        scope.exit(exc)
        raise
    scope.exit(None)
    return result


def _future_done(scope: Scope) -> Callable[[_Outcome], None]:
    def done(future: _Outcome) -> None:
        try:
            exc = asyncio.CancelledError() if future.cancelled() else future.exception()
        except BaseException as err:
            exc = err
        scope.close(exc)

    return done


def _timed_result(result: R, scope: Scope) -> R:
    """``result`` of a sync call that returned an awaitable: the scope ends when it completes. A coroutine is
    wrapped in a coroutine; a future (asyncio's or ``concurrent.futures``', a Ray ``ObjectRef``) keeps its
    identity and a done callback ends the scope. Any other awaitable is returned as is and timed until
    returned (wrapping it would change what the caller holds)."""
    try:
        if inspect.iscoroutine(result):
            return cast(R, _finish_after(result, scope))  # a coroutine of the same result
        add_done = getattr(result, "add_done_callback", None)
        future = getattr(result, "future", None) if add_done is None and type(result).__name__ == "ObjectRef" else None
        if future is not None:
            add_done = future().add_done_callback  # Ray: completion through its concurrent future
        if add_done is not None:
            add_done(_future_done(scope))
            return result
    except Exception:
        internal_error("instrument.awaitable")
    scope.close(None)
    return result


class _Closing:
    """``with _Closing(scope, stop):`` around closing a generator its consumer closed (``stop``): the close runs
    in ``scope``, which then ends, with the close's error or else ``stop`` (not an error)."""

    __slots__ = ("scope", "stop")

    def __init__(self, scope: Scope, stop: GeneratorExit) -> None:
        self.scope, self.stop = scope, stop

    def __enter__(self) -> None:
        self.scope.enter()

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.scope.exit(exc if exc is not None else self.stop)


def _wraps(fn: Callable[..., object]) -> Callable[[F], F]:
    def apply(wrapper: F) -> F:
        try:
            functools.update_wrapper(wrapper, fn)
        except Exception:  # callables without __name__ & co.
            wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper

    return apply


def instrument(fn: F, begin: Begin) -> F:
    """Wrap ``fn`` so each call runs in a :class:`Scope` from ``begin(kwargs)``; the one lifecycle of every
    wrapper (``phase``/``trace_*``, ``trainer_phase``, ``traced_remote``).

    The kind is decided here, once: async functions (and objects with ``async def __call__``) are timed until
    they return; generators and async generators from the first step to exhaustion, close or error, driven
    by hand so ``send``/``throw``/``close`` and ``asend``/``athrow``/``aclose`` behave exactly as without the
    wrapper, with the scope current only while the generator runs (never in the consumer). A sync callable
    that returns an awaitable is timed until the awaitable completes. The user's exception is recorded and
    re-raised unchanged; cancellation and ``GeneratorExit`` are not errors.

    The wrapper holds ``fn`` and ``begin`` in its closure, so it pickles by value (what Ray's cloudpickle
    does with a function of the user's ``__main__``) exactly when ``begin`` does: make it a bound method of
    an importable class (:class:`PhaseBegin`) or a closure over plain values, never over a ContextVar, lock
    or SDK object.
    """
    if is_asyncgen_callable(fn):
        return cast(F, _asyncgen_wrapper(fn, begin))  # the same kind of callable as fn, with the same result
    if is_async_callable(fn):
        return cast(F, _async_wrapper(fn, begin))
    if is_gen_callable(fn):
        return cast(F, _gen_wrapper(fn, begin))
    return cast(F, _sync_wrapper(fn, begin))


def _asyncgen_wrapper(fn: Callable[P, AsyncGenerator[Y, S]], begin: Begin) -> Callable[P, AsyncGenerator[Y, S]]:

    @_wraps(fn)
    async def agen_wrapper(*args: P.args, **kwargs: P.kwargs) -> AsyncGenerator[Y, S]:
        scope = begin(kwargs) or NOOP  # entered
        try:
            agen = fn(*args, **kwargs)
            step = agen.__anext__()  # an awaitable: nothing of the generator runs before it is awaited
        except BaseException as exc:
            scope.exit(exc)
            raise
        while True:  # entered here: each step runs in the scope
            try:
                value = await step
            except StopAsyncIteration:
                scope.exit(None)
                return
            except BaseException as exc:
                scope.exit(exc)
                raise
            scope.leave()
            try:
                sent = yield value
            except GeneratorExit as stop:
                with _Closing(scope, stop):
                    await agen.aclose()
                raise
            except BaseException as exc:
                step = agen.athrow(exc)
            else:
                step = agen.asend(sent)
            scope.enter()

    return agen_wrapper


def _async_wrapper(fn: Callable[P, Awaitable[R]], begin: Begin) -> Callable[P, Awaitable[R]]:

    @_wraps(fn)
    async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        scope = begin(kwargs)  # entered
        if scope is None:
            return await fn(*args, **kwargs)
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            scope.exit(exc)
            raise
        scope.exit(None)
        return result

    return async_wrapper


def _gen_wrapper(fn: Callable[P, Generator[Y, S, R]], begin: Begin) -> Callable[P, Generator[Y, S, R]]:

    @_wraps(fn)
    def gen_wrapper(*args: P.args, **kwargs: P.kwargs) -> Generator[Y, S, R]:
        scope = begin(kwargs)  # entered
        if scope is None:
            return (yield from fn(*args, **kwargs))
        try:
            gen = fn(*args, **kwargs)
        except BaseException as exc:
            scope.exit(exc)
            raise
        sent: Any = None  # Any: the consumer's value, sent on unchanged (None first: ``send(None)`` is ``next``)
        thrown: BaseException | None = None
        while True:  # entered here: each step runs in the scope
            try:
                value = gen.send(sent) if thrown is None else gen.throw(thrown)
            except StopIteration as done:
                scope.exit(None)
                returned: R = done.value  # what the generator returned
                return returned
            except BaseException as exc:
                scope.exit(exc)
                raise
            scope.leave()
            thrown = None
            try:
                sent = yield value
            except GeneratorExit as stop:
                with _Closing(scope, stop):
                    gen.close()
                raise
            except BaseException as exc:
                thrown = exc
            scope.enter()

    return gen_wrapper


def _sync_wrapper(fn: Callable[P, R], begin: Begin) -> Callable[P, R]:
    @_wraps(fn)
    def sync_wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        scope = begin(kwargs)  # entered
        if scope is None:
            return fn(*args, **kwargs)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            scope.exit(exc)
            raise
        if result is not None and _is_awaitable(result):
            scope.leave()
            return _timed_result(result, scope)
        scope.exit(None)
        return result

    return sync_wrapper
