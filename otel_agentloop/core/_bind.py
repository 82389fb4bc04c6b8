"""Carrying the current context into threads and executors: :func:`bind`."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import types
from collections.abc import AsyncGenerator, Callable, Generator
from typing import Any, TypeVar, cast

from ._kinds import is_async_callable, is_asyncgen_callable, is_gen_callable

T = TypeVar("T")


def bind(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` bound to the current context: pass it to ``run_in_executor``, ``executor.map`` or a ``Thread``.

    The context is captured once, here; each call runs in its own copy of it, so one bound callable may run
    in many threads at once (``executor.map(bind(fn), items)``) and calls never see each other's changes.
    The whole body runs in that copy, whatever ``fn`` is: an ``async def`` (each step of the coroutine), a
    generator or an async generator (each resume, ``send``/``throw``/``close`` passed through unchanged), or a
    sync callable that returns a coroutine (which then runs in the copy too).
    """
    ctx = contextvars.copy_context()
    bound: Callable[..., Any]
    if is_asyncgen_callable(fn):
        bound = _bound_agen(ctx, fn)
    elif is_async_callable(fn):

        async def bound_async(*args: Any, **kwargs: Any) -> Any:
            run = ctx.copy()
            return await _run_in(run, run.run(fn, *args, **kwargs))

        bound = bound_async
    elif is_gen_callable(fn):

        def bound_gen(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
            run = ctx.copy()
            driven = cast(Generator[Any, Any, Any], _run_in(run, run.run(fn, *args, **kwargs)))
            return (yield from driven)

        bound = bound_gen
    else:

        def bound_sync(*args: Any, **kwargs: Any) -> Any:
            run = ctx.copy()
            result = run.run(fn, *args, **kwargs)
            if inspect.iscoroutine(result):  # e.g. a lambda around an ``async def``: its body runs later
                return _finish_in(run, result)
            return result

        bound = bound_sync
    with contextlib.suppress(Exception):  # a callable without __name__ & co. (a partial, an instance)
        functools.update_wrapper(bound, fn)
    return cast("Callable[..., T]", bound)  # the same kind of callable as fn, with the same result


def _bound_agen(ctx: contextvars.Context, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, an async generator function, running each resume in a copy of ``ctx``."""

    async def bound_agen(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
        run = ctx.copy()
        agen: Any = run.run(fn, *args, **kwargs)
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
def _run_in(ctx: contextvars.Context, it: Any) -> Generator[Any, Any, Any]:
    """Drive ``it`` (a coroutine, a generator, an async generator's ``asend``/``athrow`` awaitable) to its end,
    every step of it inside ``ctx``; what is sent, thrown or closed into this frame reaches ``it`` unchanged.
    Awaitable (``await _run_in(...)``) and delegable (``yield from _run_in(...)``)."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            yielded = ctx.run(it.send, value) if error is None else ctx.run(it.throw, error)
        except StopIteration as stop:
            return stop.value
        value = error = None
        try:
            value = yield yielded
        except GeneratorExit:
            ctx.run(it.close)
            raise
        except BaseException as exc:
            error = exc


async def _finish_in(ctx: contextvars.Context, coro: Any) -> Any:
    return await _run_in(ctx, coro)
