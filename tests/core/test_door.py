"""The door between the two span types (``core._door``): the library's processors receive records, an SDK span
is adapted once, a record reaches a foreign processor or exporter as an SDK span, and one pipeline owns the
queue and the list of processors."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.analysis import Skipped, read_jsonl
from otel_agentloop.core._door import RecordProcessor, to_record
from otel_agentloop.core._record import FastSpan
from otel_agentloop.export._exporter import RecordExporter
from otel_agentloop.metrics import PhaseMetricsProcessor


def test_the_metrics_processor_on_a_users_own_provider_adapts_each_span() -> None:
    """docs/usage.md: ``PhaseMetricsProcessor`` is a plain ``SpanProcessor`` for your own ``TracerProvider``; a
    sample still running at a collect is left out, as on the library's provider."""
    metrics = PhaseMetricsProcessor()
    provider = TracerProvider(resource=Resource({"service.name": "mine"}))
    provider.add_span_processor(metrics)
    tracer = provider.get_tracer("mine")
    identity = {sc.RL_STEP: 3, sc.RL_SAMPLE_INDEX: 0}
    with tracer.start_as_current_span(sc.SAMPLE_SPAN, attributes=identity):
        with tracer.start_as_current_span("gen", attributes={**identity, sc.RL_PHASE: sc.GENERATE}):
            pass
        running = metrics.collect(3)
    assert running["agent_loop/telemetry/samples_in_flight"] == 1.0  # its start was seen (reads_starts)
    done = metrics.collect(3)
    assert done["agent_loop/num_samples"] == 1
    assert done["agent_loop/generate_sequences/max"] > 0
    provider.shutdown()


class _Foreign(SpanProcessor):
    def __init__(self) -> None:
        self.started: list[object] = []
        self.ended: list[object] = []

    def on_start(self, span: object, parent_context: object = None) -> None:
        self.started.append(span)

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.append(span)


class _Ours(RecordProcessor):
    def __init__(self) -> None:
        self.ended: list[FastSpan] = []

    def record_end(self, span: FastSpan) -> None:
        self.ended.append(span)


@pytest.mark.parametrize("fast_path", [True, False])
def test_one_list_one_type_each_side_of_the_door(tmp_path: Path, fast_path: bool) -> None:
    """Added later, in one list: the library's kind of processor receives records only (an SDK span adapted),
    a foreign one SDK spans only; on the SDK path the foreign one sees the span as it ends (as the SDK runs it),
    the library's one after the pipeline drained; both see every span."""
    handle = oal.configure("door", file=str(tmp_path / "t.jsonl"), set_global=False, fast_path=fast_path)
    try:
        foreign, ours = _Foreign(), _Ours()
        assert handle.provider is not None
        handle.provider.add_span_processor(foreign)
        handle.provider.add_span_processor(ours)
        with oal.step(1), oal.sample(0):
            oal.phase("generate")(lambda: None)()
            if not fast_path:
                assert len(foreign.ended) == 1  # the phase span, as it ended (the SDK runs it then)
        handle.force_flush(5)
        names = [s.name for s in foreign.ended]  # type: ignore[attr-defined]
        assert len(names) == 3 and names[1:] == [sc.SAMPLE_SPAN, sc.STEP_SPAN]
        assert all(isinstance(s, ReadableSpan) for s in foreign.ended + foreign.started)
        assert [s.name for s in ours.ended] == names
        assert all(type(s) is FastSpan for s in ours.ended)
        assert all(s.adapted is not fast_path for s in ours.ended)
        # the foreign processor's SDK span is the one the record carries: one span, as given
        assert [s.materialised for s in ours.ended] == foreign.ended
    finally:
        handle.shutdown()


class _Plain(SpanExporter):
    """An exporter that is not the library's: it gets SDK spans."""

    def __init__(self) -> None:
        self.spans: list[object] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def test_exporters_get_the_type_they_declare(tmp_path: Path) -> None:
    plain = _Plain()
    handle = oal.configure("door", file=str(tmp_path / "t.jsonl"), exporters=[plain], set_global=False)
    try:
        with oal.step(1), oal.sample(0):
            oal.phase("generate")(lambda: None)()
        handle.force_flush(5)
        kinds = {type(p.exporter).__name__: isinstance(p.exporter, RecordExporter) for p in handle.export_processors}
        assert kinds == {"_Plain": False, "OTLPJsonFileExporter": True}
        assert [type(s) for s in plain.spans] != [] and all(isinstance(s, ReadableSpan) for s in plain.spans)
    finally:
        handle.shutdown()
    read = list(read_jsonl(str(tmp_path / "t.jsonl"), Skipped()))
    assert sorted(s.name for s in read) == sorted(s.name for s in plain.spans)  # type: ignore[attr-defined]


def test_our_exporter_on_a_users_provider_takes_sdk_spans(tmp_path: Path) -> None:
    """A ``RecordExporter`` is still a ``SpanExporter``: behind the SDK's own processor it adapts the SDK spans
    at the door (what an SDK span encodes to is what its record encodes to)."""
    from otel_agentloop.export import OTLPJsonFileExporter
    from otel_agentloop.export._otlp_json import encode_spans

    path = tmp_path / "user.jsonl"
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPJsonFileExporter(path)))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("mine").start_as_current_span("user span", attributes={"k": 1}) as span:
        span.add_event("e", timestamp=1.5)  # type: ignore[arg-type]  # a float time: written as int ns
    provider.shutdown()
    (sdk_span,) = memory.get_finished_spans()
    assert path.read_text() == encode_spans([to_record(sdk_span)]) + "\n"
    assert '"timeUnixNano":"1"' in path.read_text()


class _Unreadable(ReadableSpan):
    """A sampled span (another SDK's, say) that cannot be read as a record."""

    @property
    def dropped_attributes(self) -> int:
        raise RuntimeError("unreadable")


def test_the_export_processor_on_a_users_provider_adapts_on_its_export_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``ExportProcessor`` on a plain SDK ``TracerProvider``: the thread that ends a span only queues it (sampled
    ones); its export thread adapts the batch at the door and exports it, each span counted once; a span that
    cannot be adapted is dropped, counted, logged once, and costs the others nothing."""
    from otel_agentloop.core import _door
    from otel_agentloop.export import OTLPJsonFileExporter
    from otel_agentloop.export._otlp_json import encode_spans
    from otel_agentloop.export._processor import ExportProcessor

    adapted_on: list[str] = []

    def spying(span: ReadableSpan) -> FastSpan:
        adapted_on.append(threading.current_thread().name)
        return to_record(span)

    monkeypatch.setattr(_door, "to_record", spying)
    path = tmp_path / "user.jsonl"
    export = ExportProcessor(OTLPJsonFileExporter(path), schedule_delay_s=600, name="user-export")
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "mine"}))
    provider.add_span_processor(export)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("mine")
    with (
        tracer.start_as_current_span("parent", attributes={"k": 1}),
        tracer.start_as_current_span("child", kind=SpanKind.CLIENT) as child,
    ):
        child.add_event("e", {"a": "b"})
    sampled = TraceFlags(TraceFlags.SAMPLED)
    for span_id in (2, 3):
        export.on_end(_Unreadable("broken", context=SpanContext(1, span_id, False, sampled)))
    export.on_end(ReadableSpan("unsampled", context=SpanContext(1, 4, False)))  # not queued
    assert adapted_on == []  # nothing adapted on the thread that ended the spans
    with caplog.at_level(logging.WARNING, logger="otel_agentloop"):
        assert export.force_flush(10_000)
    assert set(adapted_on) == {"user-export"}
    assert export.stats == {"queued": 4, "exported": 2, "dropped": 2, "failed": 0, "pending": 0}
    errors = [r.getMessage() for r in caplog.records if "internal error" in r.getMessage()]
    assert errors == [  # once for both
        "otel_agentloop: internal error in ExportProcessor: adapting a span (suppressed; training continues)"
    ]
    provider.shutdown()
    sdk_spans = memory.get_finished_spans()
    assert [s.name for s in sdk_spans] == ["child", "parent"]
    assert path.read_text() == encode_spans([to_record(s) for s in sdk_spans]) + "\n"  # the SDK spans, as given


class _CountingEvent(threading.Event):
    """The pipeline's wake-up, counting the wakes asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.sets = 0

    def set(self) -> None:
        self.sets += 1
        super().set()


def test_sdk_spans_wake_the_pipeline_at_a_batch_records_at_the_larger_one() -> None:
    """An ended SDK span is heavy to keep (the garbage collector walks a dozen objects each): the pipeline's
    thread is woken once ``sdk_batch`` of them are queued, not on its timer; the fast path's records wake it only
    at ``batch``. Every span still reaches the processors."""
    from otel_agentloop.export._pipeline import PipelineProvider, RecordPipeline

    pipeline = RecordPipeline(interval_s=1.0, max_queue=10_000, batch=5_000, sdk_batch=64)
    provider = PipelineProvider(pipeline, resource=Resource({"service.name": "wake"}), shutdown_on_exit=False)
    ends: list[str] = []

    class _Ends(RecordProcessor):
        def record_end(self, span: FastSpan) -> None:
            ends.append(span.name)

    provider.add_span_processor(_Ends())
    wake = pipeline._wake = _CountingEvent()
    tracer = provider.get_tracer("wake")
    other = TracerProvider(resource=Resource({"service.name": "elsewhere"})).get_tracer("wake")
    try:
        with pipeline.lock:  # the thread cannot drain meanwhile: the queue's length is ours to count
            for i in range(63):
                tracer.start_span(f"sdk {i}").end()
            assert wake.sets == 0
            tracer.start_span("sdk 63").end()
            assert wake.sets == 1
        provider.force_flush()
        assert sorted(ends) == sorted(f"sdk {i}" for i in range(64))
        with other.start_as_current_span("record") as span:
            pass
        record = to_record(span)
        with pipeline.lock:
            for _ in range(300):
                pipeline.put(record)
            assert wake.sets == 1  # records alone: 300 < batch
        provider.force_flush()
        assert ends.count("record") == 300
    finally:
        provider.shutdown()


def test_our_exporter_behind_the_sdks_processor_leaves_out_a_span_it_cannot_adapt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One loop adapts a batch (``core._door.records_of``), the export thread's and an SDK processor's: our
    exporter handed SDK spans leaves out one it cannot adapt, logged once, and exports the others (the whole
    batch raised before)."""
    from otel_agentloop.export import OTLPJsonFileExporter
    from otel_agentloop.export._otlp_json import encode_spans

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "mine"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    for name in ("first", "second"):
        provider.get_tracer("mine").start_span(name).end()
    first, second = memory.get_finished_spans()
    broken = _Unreadable("broken", context=SpanContext(1, 2, False, TraceFlags(TraceFlags.SAMPLED)))
    path = tmp_path / "user.jsonl"
    exporter = OTLPJsonFileExporter(path)
    with caplog.at_level(logging.WARNING, logger="otel_agentloop"):
        assert exporter.export([first, broken, second, broken]) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert path.read_text() == encode_spans([to_record(first), to_record(second)]) + "\n"
    errors = [r.getMessage() for r in caplog.records if "internal error" in r.getMessage()]
    assert errors == [
        "otel_agentloop: internal error in OTLPJsonFileExporter.export: adapting a span (suppressed; training "
        "continues)"
    ]
