"""OpenTelemetry metrics straight from the library: phase-duration histograms with exemplars, in-flight gauges.

Histograms (seconds, explicit buckets from 5 ms to 30 min): ``gen_ai.client.operation.duration`` (generation
turns), ``gen_ai.execute_tool.duration`` (tool calls), ``rl.reward.duration`` and ``rl.sample.duration``.
Their attributes are the low-cardinality ones only (:data:`semconv.LOW_CARDINALITY` plus the model and
provider): never a sample index or a trace id. Each measurement is recorded with the ended span's context, so
the SDK's default trace-based exemplar filter attaches the trace and span id of sampled spans as exemplars.
Gauges: ``rl.samples.in_flight`` by ``rl.phase`` and ``rl.samples.in_flight.oldest_age``.

Recording happens on the background thread (:mod:`~otel_agentloop.health._watchdog`), never in the span's ``on_end``.
Export: ``OTEL_METRICS_EXPORTER`` (``otlp``, ``console``, ``none``; default ``otlp`` when an OTLP endpoint is
configured, else ``none``), the SDK's OTLP metric exporter built from the metrics' resolved target
(``OTEL_EXPORTER_OTLP_METRICS_*`` / ``OTEL_EXPORTER_OTLP_*``; its headers checked as the traces' are:
``config._otlp``), every ``OTEL_METRIC_EXPORT_INTERVAL`` ms (default 60000, at least 100, at most 3600000:
``Settings.metric_export_interval_s``; it travels to workers with the other settings).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Histogram, Observation
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.util.types import AttributeValue

from .. import semconv as sc
from .._version import __version__
from ..config._environment import variable
from ..config._otlp import OtlpTarget
from ..core._guard import internal_error, logger
from ..core._inflight import InflightRegistry
from ..core._record import FastSpan

if TYPE_CHECKING:  # the SDK's metrics are imported where a configure() uses them, not with the package
    import requests
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader

DURATION_BUCKETS_S: Sequence[float] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    20,
    40,
    60,
    120,
    300,
    600,
    1200,
    1800,
)
"""Bucket boundaries for LLM work: a 5 ms tool call to a 30 min generation."""

_PHASE_ATTRS: tuple[str, ...] = (
    sc.GEN_AI_OPERATION_NAME,
    sc.GEN_AI_REQUEST_MODEL,
    sc.GEN_AI_PROVIDER_NAME,
    sc.GEN_AI_TOOL_NAME,
    sc.RL_VALIDATE,
    sc.ERROR_TYPE,
)
_SAMPLE_ATTRS: tuple[str, ...] = (sc.RL_VALIDATE, sc.ERROR_TYPE)


def exporter_choice(endpoint: str | None) -> str:
    """``OTEL_METRICS_EXPORTER`` (first supported entry), default ``otlp`` with an OTLP ``endpoint`` (the metric
    target's: ``config._otlp``), else ``none``."""
    raw = variable("OTEL_METRICS_EXPORTER")
    if raw is None:
        return "otlp" if endpoint else "none"
    for item in raw.lower().split(","):
        if item.strip() in ("otlp", "console", "none"):
            return item.strip()
    logger.warning("otel_agentloop: OTEL_METRICS_EXPORTER=%r is not supported (otlp, console, none); using none", raw)
    return "none"


def _otlp_metric_exporter(otlp: OtlpTarget) -> MetricExporter:
    """The SDK's OTLP metric exporter, built from the resolved ``otlp`` and its rules (``config._otlp``): the
    endpoint when given as an argument (over HTTP the signal's URL, over gRPC its scheme deciding TLS; else the
    SDK reads the variables as ``otlp`` read them), the headers its transport can carry (``otlp.http_headers``,
    ``otlp.grpc_metadata``: each item it cannot carry is skipped with a warning, as for the traces; the SDK
    would fail every export) and the compression (over gRPC: the SDK raises on some names it reads itself)."""
    endpoint = otlp.given_endpoint
    if otlp.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as Grpc

        insecure = otlp.grpc_insecure if endpoint is not None else None
        # Any: a -bin key's value is bytes (gRPC takes them; the SDK's annotation says str)
        metadata: Any = otlp.grpc_metadata or _NoHeaders()
        return Grpc(endpoint=endpoint, insecure=insecure, compression=otlp.grpc_compression, headers=metadata)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as Http

    sent = otlp.http_headers  # the SDK adds the environment's too (unchecked): the session drops those skipped
    skipped = frozenset(k for k in otlp.all_headers if isinstance(k, str)) - frozenset(sent)
    # http/json has no SDK metric exporter: protobuf over the same port
    return Http(
        endpoint=otlp.url if endpoint is not None else None,
        headers=sent,
        session=_session_without(skipped) if skipped else None,
    )


class _NoHeaders(tuple[tuple[str, str], ...]):
    """No gRPC metadata, yet true: the SDK reads the environment's (unchecked) headers when given a false value."""

    def __bool__(self) -> bool:
        return True


def _session_without(names: frozenset[str]) -> requests.Session:
    """A ``requests`` session that drops the headers ``names`` (the SDK's HTTP exporter always adds the
    environment's headers, unchecked: one that HTTP cannot carry fails every request)."""
    import requests

    class Session(requests.Session):
        def prepare_request(self, request: requests.Request) -> requests.PreparedRequest:
            request.headers = {k: v for k, v in (request.headers or {}).items() if k.lower() not in names}
            return super().prepare_request(request)

    return Session()


def build_readers(otlp: OtlpTarget, *, interval_s: float = 60.0, timeout_s: float = 30.0) -> list[MetricReader]:
    """The metric readers the environment asks for (see the module docstring; ``otlp``: the metrics' resolved
    target), exporting every ``interval_s`` within ``timeout_s`` (``OTEL_METRIC_EXPORT_INTERVAL``/``_TIMEOUT`` as
    ``Settings`` resolved and bounded them: passed explicitly, so the SDK never parses the variables itself)."""
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader

    choice = exporter_choice(otlp.endpoint)
    if choice == "none":
        return []
    if choice == "console":
        exporter: MetricExporter = ConsoleMetricExporter()
    else:
        exporter = _otlp_metric_exporter(otlp)
    return [
        PeriodicExportingMetricReader(
            exporter, export_interval_millis=interval_s * 1000, export_timeout_millis=timeout_s * 1000
        )
    ]


class LibraryMetrics:
    """The library's instruments on their own ``MeterProvider`` (never the global one)."""

    def __init__(self, resource: Resource, readers: Iterable[MetricReader], registry: InflightRegistry) -> None:
        from opentelemetry.sdk.metrics import MeterProvider

        self.provider = MeterProvider(resource=resource, metric_readers=list(readers), shutdown_on_exit=False)
        meter = self.provider.get_meter("otel_agentloop", __version__)
        self._registry = registry

        def histogram(name: str, description: str) -> Histogram:
            return meter.create_histogram(
                name, unit="s", description=description, explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S
            )

        self.by_phase = {
            sc.GENERATE: histogram(sc.GEN_AI_CLIENT_OPERATION_DURATION, "GenAI operation duration (generation turn)"),
            sc.TOOL_CALLS: histogram(sc.GEN_AI_EXECUTE_TOOL_DURATION, "Tool execution duration"),
            sc.COMPUTE_SCORE: histogram(sc.RL_REWARD_DURATION, "Reward computation duration"),
        }
        self.sample = histogram(sc.RL_SAMPLE_DURATION, "Whole-sample duration (rl.sample span)")
        meter.create_observable_gauge(
            sc.RL_INFLIGHT_SAMPLES,
            callbacks=[self._inflight],
            unit="{sample}",
            description="Running samples by current phase",
        )
        meter.create_observable_gauge(
            sc.RL_INFLIGHT_OLDEST_AGE,
            callbacks=[self._oldest],
            unit="s",
            description="Age of the oldest running sample",
        )
        self._last_counts: tuple[dict[str, int], float] = ({}, 0.0)

    def record(self, phase: str | None, span: trace.Span) -> None:
        """Record one ended span (a record, or an SDK span with ``fast_path=False``): a phase span (``phase``
        set) or an ``rl.sample`` root span (``None``)."""
        try:
            attrs: Mapping[str, AttributeValue]
            start: int | None
            end: int | None
            if type(span) is FastSpan:
                attrs, start, end = span.attributes, span.start_ns, span.end_ns
            elif isinstance(span, ReadableSpan):
                attrs, start, end = span.attributes or {}, span.start_time, span.end_time
            else:
                return  # not recorded: no times
            ctx = span.get_span_context()
            instrument: Histogram | None
            if phase is None:
                instrument, keys = self.sample, _SAMPLE_ATTRS
            else:
                instrument = self.by_phase.get(phase)
                keys = _PHASE_ATTRS
                if instrument is None:
                    return
            point: dict[str, AttributeValue] = {k: attrs[k] for k in keys if k in attrs}
            if phase is not None:
                point[sc.RL_PHASE] = phase
            context = trace.set_span_in_context(
                NonRecordingSpan(
                    SpanContext(ctx.trace_id, ctx.span_id, is_remote=False, trace_flags=TraceFlags(ctx.trace_flags))
                )
            )
            instrument.record(max(0, (end or 0) - (start or 0)) / 1e9, attributes=point, context=context)
        except Exception:
            internal_error("LibraryMetrics.record")

    def _inflight(self, options: CallbackOptions) -> Iterable[Observation]:
        counts, oldest = self._registry.counts()
        self._last_counts = (counts, oldest)
        phases: Mapping[str, int] = {p: 0 for p in sc.PHASES} | counts
        return [Observation(n, {sc.RL_PHASE: p}) for p, n in phases.items()]

    def _oldest(self, options: CallbackOptions) -> Iterable[Observation]:
        _, oldest = self._registry.counts()
        return [Observation(oldest)]

    def force_flush(self, timeout_s: float) -> bool:
        return bool(self.provider.force_flush(int(timeout_s * 1000)))

    def shutdown(self, timeout_s: float) -> None:
        self.provider.shutdown(int(timeout_s * 1000))


def worker_env(endpoint: str | None) -> dict[str, str]:
    """``OTEL_METRICS_EXPORTER`` for another process's ``configure()`` to export metrics like this one, when it
    is unset here and ``endpoint`` (this process's OTLP endpoint) makes it ``otlp`` (the metric variables set
    here reach it with ``config._environment.handed_over``)."""
    if endpoint and variable("OTEL_METRICS_EXPORTER") is None:
        return {"OTEL_METRICS_EXPORTER": exporter_choice(endpoint)}
    return {}
