"""Fast-path records (``FastSpan``) made by a real ``Recorder``: every attribute type, events, links, an error,
a remote parent with a trace state; what the encoder and exporter tests send."""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags, TraceState

from otel_agentloop.core._record import FastSpan
from otel_agentloop.core._recorder import Recorder, finalize

RESOURCE = Resource({"service.name": "encode-test", "host.name": "h1", "rl.ranks": (0, 1)})
SCOPE = InstrumentationScope("otel_agentloop", "9.9.9")
# every attribute type the SDK accepts: scalars, homogeneous arrays, empty arrays, bytes; no None
VALUES: dict[str, Any] = {
    "s": "text é ✓",
    "empty": "",
    "b.true": True,
    "b.false": False,
    "i": 7,
    "i.neg": -3,
    "i.max": (1 << 63) - 1,
    "i.min": -(1 << 63),
    "i.zero": 0,
    "f": 0.25,
    "f.neg": -1e300,
    "f.inf": float("inf"),
    "bytes": b"\x00\xffraw",
    "a.s": ("x", "", "z"),
    "a.b": (True, False),
    "a.i": (1, -2, 1 << 40),
    "a.f": (1.5, -0.0),
    "a.empty": (),
}


def new_recorder(**limits: Any) -> Recorder:
    return Recorder(
        resource=RESOURCE,
        scope=SCOPE,
        limits=SpanLimits(**limits),
        sampler=ParentBased(ALWAYS_ON),
        id_generator=RandomIdGenerator(),
        queue=_Ended(),
    )


class _Ended:
    """A record queue that keeps nothing (these tests read the records themselves)."""

    def put(self, item: Any) -> None:
        return None

    def attach(self, recorder: Any) -> None:
        return None


def start_record(recorder: Recorder, name: str, attrs: dict[str, Any], **kw: Any) -> FastSpan:
    span = recorder.start(name, attrs, time.time_ns(), **kw)
    assert span is not None
    span.init(None, None, time.monotonic_ns())
    return span


def end_record(recorder: Recorder, span: FastSpan, exc: BaseException | None = None) -> FastSpan:
    recorder.finish(span, exc, time.time_ns() + 1000)
    finalize(span)  # as the pipeline does before any processor sees it
    return span


def sample_records() -> list[FastSpan]:
    rec = new_recorder()
    out: list[FastSpan] = []
    root = start_record(rec, "rl.sample", {"rl.sample.index": 3, "rl.step": 1}, context=trace.Context())
    child = start_record(rec, "generate", {"rl.phase": "generate"}, parent=root)
    for key, value in VALUES.items():
        child.set_attribute(key, value)
    child.add_event("tokens", {"n": 5, "who": "model", "a": (1, 2)})
    child.add_event("bare")
    out.append(end_record(rec, child))
    tool = start_record(rec, "execute_tool search", {"gen_ai.tool.name": "search"}, parent=root)
    tool.set_status(Status(StatusCode.ERROR, "ValueError: boom"))
    out.append(end_record(rec, tool, ValueError("boom")))  # ERROR, error.type, an exception event
    ok = start_record(rec, "reward", {"rl.phase": "reward"}, parent=root)
    ok.set_status(StatusCode.OK)
    out.append(end_record(rec, ok))
    out.append(end_record(rec, root))
    # a remote parent with a trace state, and links with attributes (one remote)
    remote = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(1),
        trace_state=TraceState([("vendor", "v1"), ("rojo", "00f067aa0ba902b7")]),
    )
    linked = SpanContext(0x1234, 0x5678, is_remote=False, trace_flags=TraceFlags(1))
    linked_remote = SpanContext(0x9ABC, 0xDEF0, is_remote=True, trace_flags=TraceFlags(0))
    ctx = trace.set_span_in_context(NonRecordingSpan(remote))
    joined = start_record(
        rec,
        "rl.sample",
        {"rl.sample.index": 4},
        context=ctx,
        links=[Link(linked, {"link.kind": "batch", "n": 2}), Link(linked_remote)],
    )
    joined.add_link(SpanContext(0x77, 0x88, is_remote=False), {"late": True})
    assert joined.parent_remote and joined.trace_state
    out.append(end_record(rec, joined))
    # an empty name, no attributes at all
    out.append(end_record(rec, start_record(rec, "", {}, context=trace.Context())))
    return out
