"""Our stat logger on every instrumented ``AsyncLLM``, through vLLM's own ``StatLoggerBase`` interface.

``AsyncLLM(..., stat_loggers=[factory, ...])`` takes per-engine factories ``factory(vllm_config, engine_index)``;
:func:`with_our_logger` appends ours (:func:`stat_logger_factory`) to the loggers the caller passed, never in
place of them, and vLLM keeps its default loggers (its ``enable_default_loggers`` does not depend on the list).
Ours hands each ``record`` to the engine's :class:`~._load.EngineLoad`.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Iterable
from typing import cast

from .._patching import Args, Kwargs
from ._load import EngineLoad

STAT_LOGGERS_POSITION = 6
"""``stat_loggers``' position in ``AsyncLLM.__init__``'s arguments after ``vllm_config`` (vLLM 0.32)."""


class _Logger:
    """The methods of our logger (mixed into a ``StatLoggerBase`` subclass when vLLM's is importable)."""

    def __init__(self, vllm_config: object, engine_index: int = 0, *, load: EngineLoad) -> None:
        self.load = load
        self.engine_index = engine_index

    def record(
        self, scheduler_stats: object, iteration_stats: object, mm_cache_stats: object = None, engine_idx: int = 0
    ) -> None:
        self.load.record(scheduler_stats, iteration_stats, engine_idx)

    def log_engine_initialized(self) -> None:
        return None

    def log(self) -> None:
        return None

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        return None


@functools.cache
def logger_class() -> type[_Logger]:
    """``OtelAgentloopStatLogger``: a ``vllm.v1.metrics.loggers.StatLoggerBase`` (vLLM imported here only)."""
    try:
        base = importlib.import_module("vllm.v1.metrics.loggers").StatLoggerBase
    except Exception:  # another vLLM layout: the per-engine adapter only calls the methods
        return _Logger
    made: type[_Logger] = type("OtelAgentloopStatLogger", (_Logger, base), {"__doc__": _Logger.__doc__})
    return made


def stat_logger_factory(load: EngineLoad) -> Callable[..., object]:
    """A per-engine factory of our logger feeding ``load``."""
    return functools.partial(logger_class(), load=load)


def takes_loggers(init: Callable[..., object]) -> bool:
    """Whether ``AsyncLLM.__init__`` takes ``stat_loggers`` (vLLM's v1 engine does)."""
    try:
        return "stat_loggers" in inspect.signature(init).parameters
    except (TypeError, ValueError):
        return False


def with_our_logger(args: Args, kwargs: Kwargs, factory: object) -> Args:
    """``AsyncLLM.__init__``'s arguments (after ``vllm_config``) with ``factory`` added to ``stat_loggers``
    (positional or keyword; the caller's list is copied, never changed). Returns the new positional args and
    updates ``kwargs``."""
    if len(args) > STAT_LOGGERS_POSITION:
        given = args[STAT_LOGGERS_POSITION]
        mine = [*cast("Iterable[object]", given or ()), factory]
        return (*args[:STAT_LOGGERS_POSITION], mine, *args[STAT_LOGGERS_POSITION + 1 :])
    kwargs["stat_loggers"] = [*cast("Iterable[object]", kwargs.get("stat_loggers") or ()), factory]
    return args
