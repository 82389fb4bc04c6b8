"""What kind of callable a wrapper wraps, decided once when it wraps: async, async generator, generator, or
plain. Objects whose ``__call__`` is one of these count as that kind (``inspect`` alone would call them sync)."""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator
from typing import TypeGuard


def _call_of(fn: object) -> object:
    """``type(fn).__call__`` of a callable object that is not a function, else ``None``."""
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - an object with ``async def __call__`` & co.
    return call if call is not None and not inspect.isfunction(fn) else None


def is_async_callable(fn: object) -> TypeGuard[Callable[..., Coroutine[object, object, object]]]:
    """``async def`` functions (partials and methods included) and objects with ``async def __call__``."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(_call_of(fn))


def is_asyncgen_callable(fn: object) -> TypeGuard[Callable[..., AsyncGenerator[object, object]]]:
    """Async generator functions and objects whose ``__call__`` is one."""
    return inspect.isasyncgenfunction(fn) or inspect.isasyncgenfunction(_call_of(fn))


def is_gen_callable(fn: object) -> TypeGuard[Callable[..., Generator[object, object, object]]]:
    """Generator functions and objects whose ``__call__`` is one."""
    return inspect.isgeneratorfunction(fn) or inspect.isgeneratorfunction(_call_of(fn))
