"""Carrying the current context into threads and executors: :func:`bind`."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import types
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator
from typing import ParamSpec, TypeVar, cast

from ._kinds import is_async_callable, is_asyncgen_callable, is_gen_callable

P = ParamSpec("P")
T = TypeVar("T")


def bind(fn: Callable[P, T]) -> Callable[P, T]:
    """``fn`` bound to the current context: pass it to ``run_in_executor``, ``executor.map`` or a ``Thread``.

    The context is captured once, here; each call runs in its own copy of it, so one bound callable may run
    in many threads at once (``executor.map(bind(fn), items)``) and calls never see each other's changes.
    The whole body runs in that copy, whatever ``fn`` is: an ``async def`` (each step of the coroutine), a
    generator or an async generator (each resume, ``send``/``throw``/``close`` passed through unchanged), or a
    sync callable that returns a coroutine (which then runs in the copy too).
    """
    ctx = contextvars.copy_context()
    bound: Callable[..., object]
    if is_asyncgen_callable(fn):
        bound = _bound_agen(ctx, fn)
    elif is_async_callable(fn):
        call_async = fn

        async def bound_async(*args: object, **kwargs: object) -> object:
            run = ctx.copy()
            return await _run_in(run, run.run(call_async, *args, **kwargs))

        bound = bound_async
    elif is_gen_callable(fn):
        call_gen = fn

        def bound_gen(*args: object, **kwargs: object) -> Generator[object, object, object]:
            run = ctx.copy()
            driven = cast("Generator[object, object, object]", _run_in(run, run.run(call_gen, *args, **kwargs)))
            return (yield from driven)  # types.coroutine's annotation says awaitable only

        bound = bound_gen
    else:

        def bound_sync(*args: P.args, **kwargs: P.kwargs) -> object:
            run = ctx.copy()
            result = run.run(fn, *args, **kwargs)
            if inspect.iscoroutine(result):  # e.g. a lambda around an ``async def``: its body runs later
                return _finish_in(run, result)
            return result

        bound = bound_sync
    with contextlib.suppress(Exception):  # a callable without __name__ & co. (a partial, an instance)
        functools.update_wrapper(bound, fn)
    return cast("Callable[P, T]", bound)  # the same kind of callable as fn, with the same result


def _bound_agen(
    ctx: contextvars.Context, fn: Callable[..., AsyncGenerator[object, object]]
) -> Callable[..., AsyncGenerator[object, object]]:
    """``fn``, an async generator function, running each resume in a copy of ``ctx``."""

    async def bound_agen(*args: object, **kwargs: object) -> AsyncGenerator[object, object]:
        run = ctx.copy()
        agen = run.run(fn, *args, **kwargs)
        step = agen.__anext__()
        while True:
            try:
                value = await _run_in(run, step)
            except StopAsyncIteration:
                return
            try:
                sent = yield value
            except GeneratorExit:
                await _run_in(run, agen.aclose())
                raise
            except BaseException as exc:
                step = agen.athrow(exc)
            else:
                step = agen.asend(sent)

    return bound_agen


@types.coroutine
def _run_in(
    ctx: contextvars.Context, it: Generator[object, object, T] | Coroutine[object, object, T]
) -> Generator[object, object, T]:
    """Drive ``it`` (a coroutine, a generator, an async generator's ``asend``/``athrow`` awaitable) to its end,
    every step of it inside ``ctx``; what is sent, thrown or closed into this frame reaches ``it`` unchanged.
    Awaitable (``await _run_in(...)``) and delegable (``yield from _run_in(...)``)."""
    value: object = None
    error: BaseException | None = None
    while True:
        try:
            yielded = ctx.run(it.send, value) if error is None else ctx.run(it.throw, error)
        except StopIteration as stop:
            return cast(T, stop.value)
        value = error = None
        try:
            value = yield yielded
        except GeneratorExit:
            ctx.run(it.close)
            raise
        except BaseException as exc:
            error = exc


async def _finish_in(ctx: contextvars.Context, coro: Coroutine[object, object, T]) -> T:
    return await _run_in(ctx, coro)
