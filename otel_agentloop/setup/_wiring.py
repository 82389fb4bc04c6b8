"""What ``configure()`` wires together: the tracer provider (sampler, span limits, the fast path), the export
targets and their processors, the sample keeper, the installed provider and the live view."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from .._version import __version__
from ..config._options import Options
from ..config._otlp import OtlpTarget
from ..config._settings import DEFAULT_FILE, Settings
from ..config._watchdog import WatchdogSettings
from ..core import _tracer
from ..core._guard import logger
from ..core._recorder import Recorder
from ..export._keep import SampleKeeper
from ..export._pipeline import PipelineProvider, RecordPipeline
from ..export._processor import ExportProcessor
from ..export._rolled import file_exporter_for
from ..export._sampling import MetricsSampler
from ..export._sending import SendingExporter
from ..health import _watchdog
from ..metrics import _otel as _otel_metrics
from ..metrics._processor import PhaseMetricsProcessor

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricReader

__all__ = [
    "RESERVED_ATTRIBUTES",
    "_export_processors",
    "_export_targets",
    "_install",
    "_keeper",
    "_live_view",
    "_provider",
]


RESERVED_ATTRIBUTES = 16
"""Room this library adds to the span attribute count limit for its own identity attributes (``rl.*``,
``gen_ai.*``, ``error.type``): ``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT=4`` still gives 4 attributes to the user's
own, and identity is written last so the SDK (which evicts the oldest) evicts the user's first."""


def _span_limits(length: int) -> SpanLimits:
    """The SDK's limits from the (checked, see ``config._environment``) environment, with our attribute length
    and room for our own attributes."""
    count = SpanLimits().max_span_attributes  # as the SDK reads OTEL_(SPAN_)ATTRIBUTE_COUNT_LIMIT
    return SpanLimits(
        max_attribute_length=length,
        max_span_attribute_length=length,
        max_span_attributes=None if count is None else count + RESERVED_ATTRIBUTES,
    )


def _fast_path(provider: PipelineProvider, metrics: PhaseMetricsProcessor, limits: SpanLimits, s: Settings) -> None:
    """Record the library's spans through ``provider`` on the fast path (``core._recorder``), drained into its
    processors by an export pipeline (``export._pipeline``)."""
    recorder = Recorder(
        resource=provider.resource,
        scope=InstrumentationScope(_tracer.SCOPE, __version__),
        limits=limits,
        sampler=provider.sampler,
        id_generator=provider.id_generator,
        queue=provider.pipeline,
    )
    _tracer.set_recorder(provider, recorder)


def _provider(
    s: Settings, resource: Resource, metrics: PhaseMetricsProcessor, options: Options
) -> tuple[TracerProvider, bool]:
    """The tracer provider with its sampler (``OTEL_TRACES_SAMPLER`` or the ``sampler`` option, within the
    budget), the metrics processor and the user's processors; and whether sampling is selective (some samples
    are recorded but not exported: the keeper decides their fate)."""
    budget = s.max_exported_samples_per_step
    limits = _span_limits(s.attribute_value_length_limit)
    # OTEL_TRACES_SAMPLER(_ARG) as the SDK reads it, through a throwaway provider (public API only).
    inner = options.get("sampler") or TracerProvider(shutdown_on_exit=False, span_limits=limits).sampler
    effective = MetricsSampler(inner, budget)  # the spans the metrics read are never dropped, only not exported
    selective = effective.selective
    pipeline = RecordPipeline(
        s.schedule_delay_s,
        max_queue=8 * s.max_queue_size,
        batch=4 * s.max_queue_size,  # a burst of span starts (all samples of a step) never wakes it
        sdk_batch=s.max_export_batch_size,  # SDK spans are heavy to keep: woken as the SDK's batch processor
    )
    provider = PipelineProvider(
        pipeline, resource=resource, sampler=effective, span_limits=limits, shutdown_on_exit=True
    )
    metrics.add_hooks(pipeline)  # first: a collect drains the pipeline before it reads
    if s.fast_path:
        _fast_path(provider, metrics, limits, s)
    provider.add_span_processor(metrics)
    for proc in options.get("processors") or ():
        provider.add_span_processor(proc)
    return provider, selective


def _export_targets(
    s: Settings, traces: OtlpTarget, exporters: Sequence[SpanExporter]
) -> tuple[Settings, list[tuple[str, SpanExporter]]]:
    """(label, exporter) of every export: the user's ``exporters``, OTLP (to ``traces``), the file, the console;
    and ``s`` with the file's absolute path (workers write the same file)."""
    targets: list[tuple[str, SpanExporter]] = [(type(e).__name__, e) for e in exporters]
    otlp = s.traces_exporter == "otlp" and traces.endpoint is not None
    if otlp:
        targets.append((f"otlp/{traces.protocol} {traces.endpoint}", otlp_exporter(traces)))
    if (s.also_file and s.file is not None) or (s.traces_exporter == "otlp" and not otlp and not exporters):
        file_exporter = file_exporter_for(s.file or DEFAULT_FILE)
        targets.append((f"file {s.file or DEFAULT_FILE}", file_exporter))
        s = dataclasses.replace(s, file=file_exporter.path)
    if s.traces_exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        targets.append(("console", ConsoleSpanExporter()))
    return s, targets


def otlp_exporter(traces: OtlpTarget) -> SendingExporter:
    """The OTLP trace exporter for ``traces.protocol`` (``grpc``, ``http/json``, else ``http/protobuf``), built from
    the resolved target alone (``config._otlp``: its URL, headers, TLS, compression and timeout rules). gRPC's and
    http/protobuf's modules are imported here, for that protocol only (``import otel_agentloop`` loads neither)."""
    if traces.protocol == "grpc":
        from ..export._grpc import OTLPGrpcExporter

        return OTLPGrpcExporter(traces)
    if traces.protocol == "http/json":
        from ..export._http_json import OTLPJsonHttpExporter

        return OTLPJsonHttpExporter(traces)
    from ..export._http_proto import OTLPProtoHttpExporter

    return OTLPProtoHttpExporter(traces)


def _export_processors(s: Settings, targets: Sequence[tuple[str, SpanExporter]]) -> list[ExportProcessor]:
    """One bounded :class:`ExportProcessor` per target (a batch never larger than the queue)."""
    batch_size = s.max_export_batch_size
    if batch_size > s.max_queue_size:
        logger.warning(
            "otel_agentloop: OTEL_BSP_MAX_EXPORT_BATCH_SIZE (%d) > max queue size (%d); using %d",
            batch_size,
            s.max_queue_size,
            s.max_queue_size,
        )
        batch_size = s.max_queue_size
    return [
        ExportProcessor(
            exporter,
            max_queue_size=s.max_queue_size,
            max_export_batch_size=batch_size,
            schedule_delay_s=s.schedule_delay_s,
            export_timeout_s=s.export_timeout_s,
            failed_wait_s=s.failed_export_wait_s,
            name=f"otel_agentloop.export[{label}]",
        )
        for label, exporter in targets
    ]


def _keeper(
    s: Settings, provider: TracerProvider, metrics: PhaseMetricsProcessor, export_processors: list[ExportProcessor]
) -> SampleKeeper:
    """The keeper between the provider and the export processors when sampling is selective: it decides the fate
    of record-only samples (keep the slowest and the failed) before export, step by step."""
    keeper = SampleKeeper(
        export_processors,
        keep_slowest=s.keep_slowest,
        keep_errors=s.keep_errors,
        max_buffered_spans=s.max_buffered_spans,
        max_buffered_bytes=s.max_buffered_bytes,
    )
    provider.add_span_processor(keeper)
    metrics.add_hooks(keeper)
    return keeper


def _install(provider: TracerProvider, set_global: bool) -> trace.TracerProvider | None:
    """Make ``provider`` the decorators' provider (and the global one when ``set_global`` and none is set yet);
    returns the provider it replaced."""
    previous = _tracer.install(provider)
    if set_global:
        current = trace.get_tracer_provider()
        if isinstance(current, trace.ProxyTracerProvider):
            trace.set_tracer_provider(provider)
        else:
            logger.info(
                "otel_agentloop: a global TracerProvider is already set; otel_agentloop's decorators use "
                "the configured one, other instrumentation keeps the global one"
            )
    return previous


def _live_view(
    s: Settings,
    target: OtlpTarget,
    provider: TracerProvider,
    metrics: PhaseMetricsProcessor,
    export_processors: Sequence[ExportProcessor],
    metric_readers: Sequence[MetricReader],
) -> _watchdog.LiveMonitor:
    """The in-flight registry, the watchdog and the library's metrics (to ``metric_readers`` and the readers
    ``OTEL_METRICS_EXPORTER`` asks for, exporting to the metrics' ``target``)."""
    readers = _otel_metrics.build_readers(
        target, interval_s=s.metric_export_interval_s, timeout_s=s.metric_export_timeout_s
    )
    return _watchdog.install(
        provider,
        metrics,
        export_processors,
        settings=WatchdogSettings.from_settings(s),
        max_inflight=s.max_inflight_samples,
        readers=[*metric_readers, *readers],
    )
