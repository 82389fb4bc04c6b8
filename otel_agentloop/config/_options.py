"""``configure()``'s keyword options (:class:`Options`) and their resolution into :class:`~._settings.Settings`
(:func:`settings_from_options`).

An option named as a setting sets it; ``file`` also sets ``also_file``, ``export_timeout_s`` also
``otlp_timeout_s`` and ``watchdog`` the ``watchdog_*`` settings (:func:`~._watchdog.watchdog_arguments`). The
others are objects that cannot travel to another process (:data:`OBJECT_OPTIONS`): ``configure()`` uses them
as they are.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, TypedDict

from ._environment import sanitize_environment
from ._settings import Settings, resolve
from ._watchdog import WatchdogSettings, watchdog_arguments

if TYPE_CHECKING:  # the SDK is imported only after the environment is checked (see ``_environment``)
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.sampling import Sampler


class Options(TypedDict, total=False):
    """The keyword options of ``configure()`` (see its docstring); ``None`` means "not given"."""

    endpoint: str | None
    protocol: str | None
    headers: Mapping[str, str] | None
    file: str | os.PathLike[str] | None
    exporters: Sequence[SpanExporter]
    processors: Sequence[SpanProcessor]
    sampler: Sampler | None
    resource_attributes: Mapping[str, object] | None
    trace_per: Literal["sample", "step"] | None
    worker: str | None
    enabled: bool | None
    set_global: bool | None
    fast_path: bool | None
    max_queue_size: int | None
    max_export_batch_size: int | None
    schedule_delay_s: float | None
    export_timeout_s: float | None
    failed_export_wait_s: float | None
    max_steps: int | None
    max_samples_per_step: int | None
    max_exported_samples_per_step: int | None
    keep_slowest: int | None
    keep_errors: bool | None
    max_buffered_spans: int | None
    max_buffered_bytes: int | None
    capture_content: bool | None
    max_content_chars: int | None
    redact: Callable[[str], str] | None
    watchdog: WatchdogSettings | bool | None
    max_inflight_samples: int | None
    metric_readers: Sequence[MetricReader]
    run_id: str | None


OBJECT_OPTIONS = frozenset({"exporters", "processors", "sampler", "worker", "redact", "metric_readers", "watchdog"})
"""Options that are not settings: objects, and this process's own ``worker`` name (``watchdog`` becomes the
``watchdog_*`` settings)."""


def settings_from_options(service_name: str | None, options: Options) -> Settings:
    """The settings ``configure(service_name, **options)`` asks for: each option given, else its variable, else
    the default (``config._settings.resolve``), after checking the environment (``sanitize_environment``).

    Raises ``TypeError`` for a keyword ``configure()`` does not take and ``ValueError`` naming the parameter for
    an invalid value, as a plain signature would."""
    unknown = [name for name in options if name not in Options.__annotations__]
    if unknown:
        raise TypeError(f"configure() got an unexpected keyword argument {unknown[0]!r}")
    redact = options.get("redact")
    if redact is not None and not callable(redact):
        raise ValueError(f"redact must be callable, not {type(redact).__name__}")
    sanitize_environment()  # variables set since import: before the SDK objects configure() makes read them
    arguments = {name: value for name, value in options.items() if name not in OBJECT_OPTIONS}
    arguments["service_name"] = service_name or None
    arguments["resource_attributes"] = options.get("resource_attributes") or None
    arguments["also_file"] = True if options.get("file") is not None else None
    arguments["otlp_timeout_s"] = options.get("export_timeout_s")
    arguments.update(watchdog_arguments(options.get("watchdog")))
    return resolve(arguments)
