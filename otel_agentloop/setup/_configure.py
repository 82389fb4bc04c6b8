"""``configure()``: resolve the settings, then build and install what they describe (``_wiring``) and return
the :class:`~._handle.Handle`. Not on the hot path."""

from __future__ import annotations

import dataclasses
import os
import socket
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.resources import Resource

from .. import semconv as sc
from ..config._environment import handed_over
from ..config._options import Options, settings_from_options
from ..config._otlp import OtlpSettings, otlp_settings
from ..config._settings import Settings
from ..core import _tracer
from ..core._state import Saved, state
from ..export._step_summary import StepSummaryWriter
from ..metrics import _otel as _otel_metrics
from ..metrics._processor import PhaseMetricsProcessor
from ._handle import Handle, _ExportCounters
from ._run_id import _run_identity
from ._wiring import _export_processors, _export_targets, _install, _keeper, _live_view, _provider

if TYPE_CHECKING:
    from typing_extensions import Unpack


def configure(service_name: str | None = None, **options: Unpack[Options]) -> Handle:
    """Set up tracing for this process and return a :class:`Handle`.

    Exporters: OTLP when ``endpoint`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
    ``OTEL_EXPORTER_OTLP_ENDPOINT``) is set, over ``protocol`` (``"grpc"``, ``"http/protobuf"``, or
    ``"http/json"``: our string encoder, ~6x cheaper per span than the SDK's protobuf path; default
    ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL``, else grpc); otherwise, and also whenever ``file`` is given, an
    OTLP-JSON-lines trace file (``file``, ``OTEL_AGENTLOOP_FILE``, else the directory ``./otel-agentloop-traces``,
    rolled per step; a path ending ``.jsonl`` or ``.json`` is one file);
    ``OTEL_TRACES_EXPORTER=none`` exports nothing (metrics only). ``exporters`` are added as given.

    Settings: the options are declared in :class:`~.config._options.Options`; every one except the objects
    (``exporters``, ``processors``, ``sampler``, ``redact``, ``metric_readers``) and this process's ``worker``
    name is a setting declared once in :class:`~.config._settings.Settings`, with its variable
    (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_EXPORTER_OTLP_(TRACES_)HEADERS``, ``OTEL_BSP_*``,
    ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` (default 4096 here), ``OTEL_SDK_DISABLED``, ``OTEL_AGENTLOOP_*``, ...)
    and default. An argument left ``None`` comes from
    its variable, else the default; ``export_timeout_s`` also bounds one OTLP export call (else
    ``OTEL_EXPORTER_OTLP_TIMEOUT``, seconds). ``handle.settings`` is the result; ``handle.worker_env`` carries
    every setting that is not the default to other processes (``integrations.ray.runtime_env``), with the
    SDK's own variables they need (``config._environment.WORKER_VARIABLES``: sampler, span limits, TLS,
    compression, metric export). ``fast_path`` (``OTEL_AGENTLOOP_FAST_PATH``, default true) records phase and
    sample spans on the library's fast path; ``False`` sends every span through the OpenTelemetry SDK.

    Budget: ``max_exported_samples_per_step`` (or ``OTEL_AGENTLOOP_MAX_SAMPLES_PER_STEP``) caps the samples per
    step exported from this process (whole prompts); over-budget samples and samples the sampler rejects are
    still recorded, so ``metrics`` stays exact. Whatever the budget, the ``keep_slowest`` slowest samples of
    each step and every sample with an error are exported (buffered until known, within
    ``max_buffered_spans``/``max_buffered_bytes``; spills are counted).

    Content: prompt/response text is captured only with ``capture_content=True`` (or
    ``OTEL_AGENTLOOP_CAPTURE_CONTENT=true``), passed through ``redact`` and truncated to ``max_content_chars``
    (truncations counted in ``agent_loop/telemetry/content_truncated``).

    Live view (see ``core._inflight``, ``health._watchdog``, ``metrics._otel``): every running sample is tracked
    (``handle.inflight()``, at most ``max_inflight_samples``); ``watchdog`` (a :class:`WatchdogSettings`,
    ``False`` to turn it off, default from ``OTEL_AGENTLOOP_WATCHDOG*``) reports phases running too long; the
    library's duration histograms and in-flight gauges go to ``metric_readers`` and to the reader
    ``OTEL_METRICS_EXPORTER`` asks for (OTLP by default when an OTLP endpoint is set).

    Raises ``ValueError`` naming the parameter for an invalid argument: counts must be ints in range, durations
    finite seconds in (0, 3600]. An invalid environment value (not a finite number, out of range) only warns,
    naming the variable, and its default is used (see ``config._settings``).

    Run: every span's resource carries ``rl.run.id`` (``run_id``, else ``OTEL_AGENTLOOP_RUN_ID``, else generated
    once per process: UTC time + random hex) and ``rl.run.attempt`` (generated once per process, a driver launch;
    ``OTEL_AGENTLOOP_RUN_ATTEMPT``); both reach workers in ``handle.worker_env``. Each collected step writes one
    ``rl.step.summary`` span (``handle.summaries``).

    The returned handle's :meth:`Handle.shutdown` turns tracing off again and restores what this call replaced
    (the installed provider, content policy, trace mode, worker name, disabled state, ``current_handle()``).
    """
    settings = settings_from_options(service_name, options)
    with state.lock:  # one configure or shutdown at a time: concurrent calls nest as if made one after the other
        return _build(settings, options)


def _build(s: Settings, options: Options) -> Handle:
    """Install what resolved settings ``s`` and the objects among ``options`` describe (see :func:`configure`)
    and make its handle the current one (its shutdown restores what was current); the caller holds
    ``state.lock``."""
    saved = state.save()
    metrics = PhaseMetricsProcessor(max_steps=s.max_steps, max_samples_per_step=s.max_samples_per_step)
    state.content.set(s.capture_content, s.max_content_chars, options.get("redact"))
    state.defaults.trace_per = s.trace_per  # type: ignore[assignment]
    worker = options.get("worker")
    if worker:
        state.defaults.worker = worker
    otlp = otlp_settings(s)
    if s.enabled:
        handle = _build_tracing(s, otlp, options, metrics, saved)
    else:
        _tracer.set_disabled(True)
        handle = Handle(
            None, metrics, (), None, "disabled", None, s, otlp=otlp, worker_env=_worker_env(s, None), saved=saved
        )
    state.handle = handle
    if s.enabled:
        metrics.add_hooks(_ExportCounters(handle))
    return handle


def _build_tracing(
    s: Settings, otlp: OtlpSettings, options: Options, metrics: PhaseMetricsProcessor, saved: Saved
) -> Handle:
    """The handle of tracing on: provider, exporters, keeper, live view and step summaries installed."""
    _tracer.set_disabled(False)
    s, resource = _resource(s)
    provider, selective = _provider(s, resource, metrics, options)
    s, targets = _export_targets(s, otlp.traces, options.get("exporters") or ())
    export_processors = _export_processors(s, targets)
    keeper = _keeper(s, provider, metrics, export_processors) if selective else None
    if keeper is None:
        for proc in export_processors:
            provider.add_span_processor(proc)
    previous = _install(provider, s.set_global)
    description = ", ".join(label for label, _ in targets) or "no exporter"
    live = _live_view(s, otlp.metrics, provider, metrics, export_processors, options.get("metric_readers") or ())
    summaries = StepSummaryWriter(resource, export_processors)
    metrics.add_hooks(summaries)
    return Handle(
        provider,
        metrics,
        export_processors,
        previous,
        description,
        keeper,
        s,
        otlp=otlp,
        worker_env=_worker_env(s, otlp.traces.endpoint if s.traces_exporter == "otlp" else None),
        live=live,
        summaries=summaries,
        saved=saved,
    )


def _resource(s: Settings) -> tuple[Settings, Resource]:
    """The resource of every span: host, pid, the resource attributes, the run's identity and the service name
    (``otel-agentloop`` when none is set); and ``s`` with the run and service name it chose (workers use the
    same)."""
    run_id, run_attempt = _run_identity(s)
    # Any: the user's resource attributes among them, as given (the SDK's Resource checks them)
    attrs: dict[str, Any] = {"host.name": socket.gethostname(), "process.pid": os.getpid()}
    attrs.update(s.resource_attributes or {})
    attrs[sc.RL_RUN_ID], attrs[sc.RL_RUN_ATTEMPT] = run_id, run_attempt
    if s.service_name:
        attrs["service.name"] = s.service_name
    resource = Resource.create(attrs)
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "otel-agentloop"}))
    service_name = str(resource.attributes["service.name"])
    return dataclasses.replace(s, run_id=run_id, run_attempt=run_attempt, service_name=service_name), resource


def _worker_env(settings: Settings, metric_endpoint: str | None) -> dict[str, str]:
    """Environment variables that make ``configure()`` in another process (a Ray worker) resolve ``settings``
    and export like this one: the SDK's own variables it needs (``config._environment.WORKER_VARIABLES``), the
    settings, and the metric exporter's choice."""
    env = handed_over()
    env.update(settings.worker_env())
    env.update(_otel_metrics.worker_env(metric_endpoint))
    return env
