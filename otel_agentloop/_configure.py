"""Setting up tracing: provider, resource, sampler, processors and exporters. Not on the hot path."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.sampling import DEFAULT_ON, Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from . import semconv as sc
from ._version import __version__
from .config._environment import handed_over
from .config._headers import env_headers
from .config._options import Options, settings_from_options
from .config._settings import DEFAULT_FILE, Settings
from .config._watchdog import WatchdogSettings
from .core import _tracer
from .core._guard import after_fork_in_child, internal_error, logger
from .core._recorder import Recorder
from .core._state import Saved, forked_worker, state
from .export._keep import SampleKeeper
from .export._pipeline import PipelineProvider, RecordPipeline
from .export._processor import ExportProcessor
from .export._processor import timeout_s as _timeout_s
from .export._rolled import file_exporter_for
from .export._sampling import BudgetSampler, RecordingSampler
from .export._step_summary import StepSummaryWriter
from .health import _watchdog
from .metrics import _otel as _otel_metrics
from .metrics._hooks import StepHooks
from .metrics._processor import PhaseMetricsProcessor
from .metrics._summary import StepSummary
from .metrics._table import PhaseTable, StepMetrics

if TYPE_CHECKING:
    from typing_extensions import Unpack


class Handle:
    """What :func:`configure` returns: the provider, the metrics processor, and bounded flush/shutdown.

    ``enabled`` is ``False`` when tracing is off (``OTEL_SDK_DISABLED`` or ``enabled=False``): ``metrics``
    then exists but sees no spans, and ``force_flush``/``shutdown`` return at once.
    """

    def __init__(
        self,
        provider: TracerProvider | None,
        metrics: PhaseMetricsProcessor,
        exporters: Sequence[ExportProcessor],
        previous: trace.TracerProvider | None,
        description: str,
        keeper: SampleKeeper | None = None,
        settings: Settings | None = None,
    ) -> None:
        self.provider = provider
        self.metrics = metrics
        self.export_processors = tuple(exporters)
        self.description = description
        self.keeper = keeper
        self.settings = settings if settings is not None else Settings()
        """The resolved settings this handle was configured with (what a Ray worker reports back)."""
        self.worker_env: dict[str, str] = {}
        """Environment for another process's ``configure()`` to export like this one (see integrations.ray)."""
        self._previous = previous
        self._closed = False
        self._parent: Handle | None = None  # the handle that was current when this one was configured
        self._saved: Saved | None = None  # what configure() replaced, restored by shutdown()
        after_fork_in_child(self, "_after_fork")

    def _after_fork(self) -> None:
        """In a forked child: the resource names this process (:func:`_fork_identity`), and so does the worker
        name this handle's shutdown restores."""
        if self.provider is None or self._closed:
            return
        parent = _fork_identity(self.provider.resource)
        if parent is not None and self._saved is not None:
            self._saved = self._saved._replace(worker=forked_worker(self._saved.worker, parent, os.getpid()))

    live: Any = None
    """The in-flight registry's monitor (``_watchdog.LiveMonitor``), ``None`` when tracing is off."""
    summaries: StepSummaryWriter | None = None
    """Writes the ``rl.step.summary`` span of each collected step (:func:`write_step_summary`); ``None`` when
    tracing is off."""

    @property
    def run_id(self) -> str | None:
        """This process's ``rl.run.id`` (``None`` when tracing is off)."""
        return self.settings.run_id if self.provider is not None else None

    @property
    def run_attempt(self) -> str | None:
        """This process's ``rl.run.attempt`` (``None`` when tracing is off)."""
        return self.settings.run_attempt if self.provider is not None else None

    def inflight(self, limit: int | None = None) -> list[Any]:
        """This process's running samples, oldest first (``InflightSample``: identity, phase, tool, ages,
        trace id); ``[]`` when tracing is off."""
        return self.live.registry.snapshot(limit) if self.live is not None and not self._closed else []

    @property
    def _pipeline(self) -> RecordPipeline | None:
        """The fast path's export pipeline of :attr:`provider` (``None``: tracing off, or ``fast_path=False``)."""
        return self.provider.pipeline if isinstance(self.provider, PipelineProvider) else None

    @property
    def enabled(self) -> bool:
        return self.provider is not None and not self._closed

    @property
    def closed(self) -> bool:
        """``shutdown()`` was called."""
        return self._closed

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        """Export what is queued, waiting at most ``timeout_s`` in total; ``False`` if time ran out. Never
        raises: NaN (or not a number) means the default, a negative timeout 0, an infinite or huge one
        ``MAX_SECONDS`` (one hour)."""
        if not self.enabled:
            return True
        wait_s = _timeout_s(timeout_s, 5.0)
        return _bounded(lambda: self.provider.force_flush(int(wait_s * 1000)), wait_s)  # type: ignore[union-attr]

    def request_flush(self, wait_s: float = 0.0) -> bool:
        """Ask the export processors to export what is queued now; wait (at most ``wait_s`` in total) only
        while their backend is healthy (see :meth:`ExportProcessor.request_flush`). Never blocks on a dead or
        hung backend beyond the first timed-out wait. Returns whether everything queued was exported."""
        if not self.enabled:
            return True
        deadline = time.monotonic() + max(wait_s, 0.0)
        pipeline = self._pipeline
        if pipeline is not None:  # the fast path's ended spans into the export queues first (CPU only, bounded)
            pipeline.drain()
        ok = True
        for proc in self.export_processors:
            ok = proc.request_flush(max(deadline - time.monotonic(), 0.0)) and ok
        return ok

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Turn tracing off for this handle and restore what :func:`configure` replaced; idempotent.

        Exports what is queued within ``timeout_s`` in total (the timeout reaches every export processor);
        spans still queued or stuck in an export when it runs out are counted as dropped. Afterwards the
        decorators make no spans through this handle's provider, even where it stays the global provider.
        Handles nest: shutting down the current handle restores the newest older handle still open (or the
        state before any), never a shut-down one. Returns within ``timeout_s`` (plus ~0.2 s) even when an
        exporter's own ``shutdown()`` blocks, and never raises: ``timeout_s`` is bounded as in
        :meth:`force_flush`.
        """
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + _timeout_s(timeout_s, 5.0)
        if self.summaries is not None:
            self.summaries.close()
        _release(self)
        if self.provider is None:
            return
        provider = self.provider
        _tracer.retire(provider)

        def remaining_ms() -> int:
            return max(int((deadline - time.monotonic()) * 1000), 0)

        try:
            pipeline = self._pipeline
            if pipeline is not None:
                pipeline.shutdown()  # the fast path's queued spans reach the exporters before they stop
            if self.keeper is not None:
                self.keeper.shutdown(remaining_ms())
            else:
                for proc in self.export_processors:
                    proc.shutdown(remaining_ms())
        except Exception:
            internal_error("Handle.shutdown")
        _bounded(provider.shutdown, max(deadline - time.monotonic(), 0.05))  # its result is not used

    @property
    def stats(self) -> dict[str, int]:
        """Export counters summed over exporters (``queued``, ``exported``, ``dropped``, ``failed``, ``pending``),
        the keeper's (``kept_slowest``, ``kept_errors``, ``samples_not_kept``, ``samples_spilled``, buffered)
        and the metrics processor's counters.

        One accounting: at any moment every sampled span that ended is in exactly one of ``exported``,
        ``failed``, ``dropped`` or ``pending``, once per exporter. ``pending`` includes the fast path's queue
        (spans not yet handed to the exporters); ``dropped`` includes the spans that queue lost (ended after
        shutdown). The export counters are read under the fast path's queue lock, which the pipeline holds
        while it hands spans over, so none is counted twice or missed."""
        out: dict[str, int] = {"queued": 0, "exported": 0, "dropped": 0, "failed": 0, "pending": 0}
        pipeline = self._pipeline
        with pipeline.lock if pipeline is not None else contextlib.nullcontext():
            for proc in self.export_processors:
                for key, value in proc.stats.items():
                    out[key] += value
            if pipeline is not None:  # each exporter would have received these: counted once per exporter
                exporters = len(self.export_processors)
                out["pending"] += pipeline.waiting() * exporters
                out["dropped"] += pipeline.dropped * exporters
        if self.keeper is not None:
            out.update(self.keeper.stats)
        if self.summaries is not None:
            out.update(self.summaries.stats)
        out.update(self.metrics.stats)
        return out

    def export_counters(self) -> dict[str, int]:
        """The counters reported under ``agent_loop/telemetry/`` by ``metrics.collect``."""
        stats = self.stats
        out = {
            "spans_dropped": stats["dropped"],
            "spans_failed": stats["failed"],
            "content_truncated": state.content.truncated,
        }
        for key in ("samples_not_kept", "samples_spilled"):
            if key in stats:
                out[key] = stats[key]
        return out

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"<otel_agentloop.Handle {self.description}>"


class _ExportCounters(StepHooks):
    """The hooks that put ``handle``'s :meth:`Handle.export_counters` in each ``collect()`` result."""

    __slots__ = ("handle",)

    def __init__(self, handle: Handle) -> None:
        self.handle = handle

    def telemetry_counters(self) -> Mapping[str, int]:
        return self.handle.export_counters()


def _release(handle: Handle) -> None:
    """Undo what ``handle``'s :func:`configure` installed, atomically with other configure/shutdown calls: if it
    is current, restore the newest older handle still open (or the state before any)."""
    with state.lock:
        if state.handle is handle:
            target = handle
            while target._parent is not None and target._parent._closed:
                target = target._parent
            if target._saved is not None:
                state.restore(target._saved)
            state.handle = target._parent
        elif state.tracer.configured is handle.provider:  # not current, yet installed: uninstall it
            _tracer.install(handle._previous)


def current_handle() -> Handle | None:
    """The handle of the last :func:`configure` call in this process (``None`` before any)."""
    return state.handle  # type: ignore[no-any-return]


def write_step_summary(
    table: PhaseTable,
    metrics: StepMetrics,
    step: int | None,
    validate: bool = False,
    *,
    staleness: Any = None,
    handle: Handle | None = None,
) -> StepSummary | None:
    """Write the ``rl.step.summary`` span of one collected step through ``handle`` (default: the current one):
    ``table`` and ``metrics`` exactly as the caller's step produced them (see ``export._step_summary``).
    Nothing (``None``) when there is no handle or tracing is off; never raises."""
    try:
        handle = handle if handle is not None else current_handle()
        writer = handle.summaries if handle is not None and handle.enabled else None
        return writer.write(table, metrics, step, validate, staleness=staleness) if writer is not None else None
    except Exception:
        internal_error("write_step_summary")
        return None


_run_lock = threading.Lock()
_generated_run: list[str] = []  # this process's generated (run id, attempt), once: a reconfigure keeps them


def _new_run_lock() -> None:  # a forked child keeps the run (the same launch), never a lock held at fork
    global _run_lock
    _run_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_run_lock)


def new_run_id() -> str:
    """A readable, sortable id: UTC time to the second + 6 random hex digits (``20261123T221500Z-3f9a1c``)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def process_run_id() -> str:
    """The run id this process uses where none is given (generated once, or adopted)."""
    with _run_lock:
        if not _generated_run:
            _generated_run.extend((new_run_id(), new_run_id()))
        return _generated_run[0]


def adopt_run_id(run_id: str) -> None:
    """Make ``run_id`` this process's run id where none is given (verl's resume from a checkpoint, decided in the
    driver before its workers start): a later :func:`configure` uses it, and the current handle hands it to the
    workers started from now on (``worker_env``). The current handle's own resource cannot change: spans it
    already made, and makes, keep the id it was configured with (said once)."""
    process_run_id()
    with _run_lock:
        _generated_run[0] = run_id
    handle = current_handle()
    if handle is None or handle.closed or not handle.enabled or handle.run_id == run_id:
        return
    handle.worker_env["OTEL_AGENTLOOP_RUN_ID"] = run_id
    logger.warning(
        "otel_agentloop: this process was configured as run %s before the run id %s was known; its workers get "
        "%s, its own spans keep %s",
        handle.run_id,
        run_id,
        run_id,
        handle.run_id,
    )


def _run_identity(s: Settings) -> tuple[str, str]:
    """(rl.run.id, rl.run.attempt) of this process: the settings' (argument, ``OTEL_AGENTLOOP_RUN_ID`` /
    ``_RUN_ATTEMPT``, the driver's hand-off), else ``rl.run.id`` of the resource attributes, else generated once
    per process (a driver launch)."""
    process_run_id()
    given = (s.resource_attributes or {}).get(sc.RL_RUN_ID)
    run_id = s.run_id or (str(given) if given else _generated_run[0])
    return run_id, s.run_attempt or _generated_run[1]


def _worker_env(settings: Settings, metric_endpoint: str | None) -> dict[str, str]:
    """Environment variables that make ``configure()`` in another process (a Ray worker) resolve ``settings``
    and export like this one: the SDK's own variables it needs (``config._environment.WORKER_VARIABLES``), the
    settings, and the metric exporter's choice."""
    env = handed_over()
    env.update(settings.worker_env())
    env.update(_otel_metrics.worker_env(metric_endpoint))
    return env


def _bounded(fn: Callable[[], object], timeout_s: float) -> bool:
    """Run ``fn`` on a daemon thread and wait at most ``timeout_s``: SDK calls do not always honour timeouts."""
    result: list[bool] = []
    worker = threading.Thread(target=lambda: result.append(bool(fn())), name="otel_agentloop.bounded", daemon=True)
    worker.start()
    worker.join(max(timeout_s, 0.0) + 0.05)
    return bool(result and result[0])


def _otlp_exporter(s: Settings) -> SpanExporter:
    """The OTLP exporter for ``s.protocol``. The SDK's exporters read the environment's endpoint and headers
    themselves (only arguments are passed); ours (http/json) gets them from the settings, as the SDK reads them."""
    endpoint = s.endpoint if s.sources.get("endpoint") == "argument" else None
    # each exporter skips, with a warning, an item its transport cannot carry (config._headers)
    headers = s.headers if endpoint is not None or s.sources.get("headers") == "argument" else None
    if s.protocol == "grpc":
        from .export._grpc import OTLPGrpcExporter, grpc_target

        return OTLPGrpcExporter(
            grpc_target(endpoint, headers or None),
            s.otlp_timeout_s or 10.0,
            compression=_otel_metrics.grpc_compression("TRACES"),
        )
    if s.protocol == "http/json":
        from .export._http_json import OTLPJsonHttpExporter

        if endpoint is None:
            endpoint = _traces_url(s)
        return OTLPJsonHttpExporter(endpoint, env_headers("TRACES") if headers is None else headers, s.otlp_timeout_s)
    from .export._http_proto import OTLPProtoHttpExporter, http_target

    url, all_headers = http_target(endpoint, headers)
    return OTLPProtoHttpExporter(url, all_headers, s.otlp_timeout_s or 10.0)


def _traces_url(s: Settings) -> str:
    """The traces URL of an endpoint from the environment, as the SDK's HTTP exporter makes it: the
    ``..._TRACES_ENDPOINT`` variable as it is, the generic one with ``/v1/traces`` appended."""
    endpoint = s.endpoint or "http://localhost:4318"
    if s.sources.get("endpoint") == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":
        return endpoint
    return endpoint.rstrip("/") + "/v1/traces"


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
    """Install what resolved settings ``s`` and the objects among ``options`` describe (see :func:`configure`);
    the caller holds ``state.lock``."""
    saved = state.save()
    metrics = PhaseMetricsProcessor(max_steps=s.max_steps, max_samples_per_step=s.max_samples_per_step)
    state.content.set(s.capture_content, s.max_content_chars, options.get("redact"))
    state.defaults.trace_per = s.trace_per  # type: ignore[assignment]
    worker = options.get("worker")
    if worker:
        state.defaults.worker = worker
    if not s.enabled:
        _tracer.set_disabled(True)
        handle = Handle(None, metrics, (), None, "disabled", settings=s)
        return _make_current(handle, saved, _worker_env(s, None))
    _tracer.set_disabled(False)
    s, resource = _resource(s)
    provider, selective = _provider(s, resource, metrics, options)
    s, targets = _export_targets(s, options.get("exporters") or ())
    export_processors = _export_processors(s, targets)
    keeper = _keeper(s, provider, metrics, export_processors) if selective else None
    if keeper is None:
        for proc in export_processors:
            provider.add_span_processor(proc)
    previous = _install(provider, s.set_global)
    description = ", ".join(label for label, _ in targets) or "no exporter"
    handle = Handle(provider, metrics, export_processors, previous, description, keeper, settings=s)
    handle.live = _live_view(s, provider, metrics, export_processors, options.get("metric_readers") or ())
    handle.summaries = StepSummaryWriter(resource, export_processors)
    metrics.add_hooks(handle.summaries)
    _make_current(handle, saved, _worker_env(s, s.endpoint if s.traces_exporter == "otlp" else None))
    metrics.add_hooks(_ExportCounters(handle))
    return handle


def _make_current(handle: Handle, saved: Saved, worker_env: dict[str, str]) -> Handle:
    """Give ``handle`` its ``worker_env`` and make it the current handle, restoring ``saved`` at its shutdown."""
    handle.worker_env = worker_env
    handle._parent, handle._saved, state.handle = state.handle, saved, handle
    return handle


def _resource(s: Settings) -> tuple[Settings, Resource]:
    """The resource of every span: host, pid, the resource attributes, the run's identity and the service name
    (``otel-agentloop`` when none is set); and ``s`` with the run and service name it chose (workers use the
    same)."""
    run_id, run_attempt = _run_identity(s)
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


def _fork_identity(resource: Resource) -> int | None:
    """In a forked child, make ``resource`` carry this process's ``process.pid`` and ``rl.worker``
    (:func:`~otel_agentloop.core._state.forked_worker`), not the parent's; the parent's pid (``None``: nothing
    changed). Changed in place: the one object is shared by the provider, its tracers, the fast path's
    recorder, the step summaries' tracer and the meter provider, and every one of them must see it
    (``Resource`` has no public way to change it)."""
    attrs = dict(resource.attributes)
    parent, pid = attrs.get("process.pid"), os.getpid()
    if type(parent) is not int or parent == pid:
        return None
    attrs["process.pid"] = pid
    worker = attrs.get(sc.RL_WORKER)
    if isinstance(worker, str):
        attrs[sc.RL_WORKER] = forked_worker(worker, parent, pid)
    resource._attributes = BoundedAttributes(attributes=attrs, immutable=True)  # pyright: ignore[reportPrivateUsage]
    return parent


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
    selective = budget is not None or inner.get_description() != DEFAULT_ON.get_description()
    recording = RecordingSampler(inner)  # the spans the metrics read are never dropped, only not exported
    effective: Sampler = BudgetSampler(recording, budget) if selective else recording
    pipeline = RecordPipeline(
        s.schedule_delay_s,
        max_queue=8 * s.max_queue_size,
        batch=4 * s.max_queue_size,  # a burst of span starts (all samples of a step) never wakes it
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


def _export_targets(s: Settings, exporters: Sequence[SpanExporter]) -> tuple[Settings, list[tuple[str, SpanExporter]]]:
    """(label, exporter) of every export: the user's ``exporters``, OTLP, the file, the console; and ``s`` with
    the file's absolute path (workers write the same file)."""
    targets: list[tuple[str, SpanExporter]] = [(type(e).__name__, e) for e in exporters]
    otlp = s.traces_exporter == "otlp" and s.endpoint is not None
    if otlp:
        targets.append((f"otlp/{s.protocol} {s.endpoint}", _otlp_exporter(s)))
    if (s.also_file and s.file is not None) or (s.traces_exporter == "otlp" and not otlp and not exporters):
        file_exporter = file_exporter_for(s.file or DEFAULT_FILE)
        targets.append((f"file {s.file or DEFAULT_FILE}", file_exporter))
        s = dataclasses.replace(s, file=file_exporter.path)
    if s.traces_exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        targets.append(("console", ConsoleSpanExporter()))
    return s, targets


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
    provider: TracerProvider,
    metrics: PhaseMetricsProcessor,
    export_processors: Sequence[ExportProcessor],
    metric_readers: Sequence[Any],
) -> _watchdog.LiveMonitor:
    """The in-flight registry, the watchdog and the library's metrics (to ``metric_readers`` and the readers
    ``OTEL_METRICS_EXPORTER`` asks for)."""
    endpoint = s.endpoint if s.sources.get("endpoint") == "argument" else None
    protocol = s.protocol if s.sources.get("protocol") == "argument" else None
    readers = _otel_metrics.build_readers(
        endpoint, protocol, interval_s=s.metric_export_interval_s, timeout_s=s.metric_export_timeout_s
    )
    return _watchdog.install(
        provider,
        metrics,
        export_processors,
        settings=WatchdogSettings.from_settings(s),
        max_inflight=s.max_inflight_samples,
        readers=[*metric_readers, *readers],
    )
