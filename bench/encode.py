"""Export-side CPU per span: encoding the fast path's records with our encoders vs. the SDK's way.

One process, side by side, the minimum over rounds of ``time.thread_time`` per span (a batch of 512 spans
shaped as a sample's spans: a root, generation turns and tool calls, ~8 attributes each, one exception event
in 1 of 16 tool calls):

- ``sdk_proto``: what the SDK's OTLP exporters cost for a record: ``materialise`` (an SDK span built from it)
  + ``encode_spans(...).SerializeToString()``;
- ``sdk_proto_encode_only``: the SDK's encoder alone, on spans already materialised;
- ``ours_proto``: ``_otlp_proto.encode_request`` on the records (what our gRPC and http/protobuf exporters send);
- ``json_records`` / ``json_sdk_spans``: our OTLP-JSON encoder on the records / on the materialised spans
  (adapted at the door, ``core._door.to_record``);
- ``materialise``: building the SDK span alone.

Run: ``.venv/bin/python bench/encode.py [--rounds N]``; prints JSON (microseconds per span) and the ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_agentloop.core._door import materialise, to_record
from otel_agentloop.core._record import FastSpan
from otel_agentloop.core._recorder import Recorder, finalize
from otel_agentloop.export import _otlp_json, _otlp_proto

BATCH = 512


class _Kept:
    """A record queue that keeps nothing: :func:`records` returns the records it made."""

    def put(self, item: object) -> None:
        return None

    def attach(self, recorder: object) -> None:
        return None


def records(n: int = BATCH) -> list[FastSpan]:
    recorder = Recorder(
        resource=Resource({"service.name": "bench", "host.name": "node-1", "process.pid": 1234}),
        scope=InstrumentationScope("otel_agentloop", "0.0.0"),
        limits=SpanLimits(),
        sampler=ParentBased(ALWAYS_ON),
        id_generator=RandomIdGenerator(),
        queue=_Kept(),
    )
    out: list[FastSpan] = []
    t = time.time_ns()
    sample = 0
    while len(out) < n:
        identity = {"rl.step": 7, "rl.sample.index": sample, "rl.sample.id": f"s-{sample}", "rl.rollout.n": 4}
        root = recorder.start("rl.sample", dict(identity), t, context=trace.Context())
        assert root is not None
        root.init(None, None, 0)
        children = []
        for turn in range(3):
            attrs = {
                **identity,
                "rl.phase": "generate",
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "qwen2.5-7b",
                "gen_ai.usage.output_tokens": 512 + turn,
            }
            gen = recorder.start("chat qwen2.5-7b", attrs, t, parent=root)
            assert gen is not None
            gen.init(None, None, 0)
            children.append(gen)
            tool = recorder.start(
                "execute_tool search",
                {**identity, "rl.phase": "tool", "gen_ai.tool.name": "search", "gen_ai.operation.name": "execute_tool"},
                t,
                parent=root,
            )
            assert tool is not None
            tool.init(None, None, 0)
            if (sample * 3 + turn) % 16 == 0:
                tool.record_exception(TimeoutError("tool timed out"))
            children.append(tool)
        for span in [*children, root]:
            recorder.finish(span, None, t + 1_000_000)
            finalize(span)
            out.append(span)
        sample += 1
    return out[:n]


def per_span_us(fn: Callable[[], Any], n: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        gc.collect()
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    spans = records()
    materialised = [materialise(s) for s in spans]
    assert _otlp_proto.encode_request(spans)[0] == encode_spans(materialised).SerializeToString()

    def sdk_proto() -> None:
        for s in spans:
            s.materialised = None  # built afresh, as each record is once
        encode_spans([materialise(s) for s in spans]).SerializeToString()

    def only_materialise() -> None:
        for s in spans:
            s.materialised = None
        [materialise(s) for s in spans]

    n, r = len(spans), args.rounds
    result = {
        "spans_per_batch": n,
        "sdk_proto": per_span_us(sdk_proto, n, r),
        "sdk_proto_encode_only": per_span_us(lambda: encode_spans(materialised).SerializeToString(), n, r),
        "materialise": per_span_us(only_materialise, n, r),
        "ours_proto": per_span_us(lambda: _otlp_proto.encode_request(spans), n, r),
        "json_records": per_span_us(lambda: _otlp_json.encode_request(spans), n, r),
        "json_sdk_spans": per_span_us(lambda: _otlp_json.encode_request([to_record(s) for s in materialised]), n, r),
    }
    result["ratio_ours_proto_vs_sdk_proto"] = result["ours_proto"] / result["sdk_proto"]
    result["ratio_ours_proto_vs_sdk_encode_only"] = result["ours_proto"] / result["sdk_proto_encode_only"]
    result["ratio_json_records_vs_materialise_plus_json"] = result["json_records"] / (
        result["materialise"] + result["json_sdk_spans"]
    )
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}, indent=1))


if __name__ == "__main__":
    main()
