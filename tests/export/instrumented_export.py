"""Child process for tests/export/test_export_hygiene.py: export spans with real grpc and requests client
instrumentation active (instrumented before the exporters are imported, as ``opentelemetry-instrument`` does).

Usage: ``python tests/export/instrumented_export.py PROTOCOL ENDPOINT MODE``; MODE ``unsuppressed`` turns our
suppression into a no-op, to show the instrumentation does make spans around an export. Prints the export
counters as JSON.
"""

from __future__ import annotations

import contextlib
import json
import sys

from opentelemetry.instrumentation.grpc import GrpcInstrumentorClient
from opentelemetry.instrumentation.requests import RequestsInstrumentor

GrpcInstrumentorClient().instrument()
RequestsInstrumentor().instrument()

from opentelemetry import trace  # noqa: E402

import otel_agentloop as oal  # noqa: E402
from otel_agentloop.export import _processor as _export  # noqa: E402

N_SPANS = 5


def main() -> None:
    protocol, endpoint, mode = sys.argv[1:4]
    flush_s = 10.0
    if mode == "unsuppressed":
        flush_s = 0.3  # each export then records a span that the next export sends: flush never finds it empty
        _export.suppressed = contextlib.nullcontext  # type: ignore[assignment]  # the one place an export suppresses
    # the global provider: the grpc client interceptor takes its tracer from it
    handle = oal.configure("hygiene", endpoint=endpoint, protocol=protocol, schedule_delay_s=0.05)
    tracer = trace.get_tracer("hygiene")
    for i in range(N_SPANS):
        with tracer.start_as_current_span(f"ours-{i}"):
            pass
        handle.force_flush(flush_s)  # one export per span: several exports, each one a chance for a client span
    handle.force_flush(flush_s)  # exports what the exports above recorded, if anything
    print(json.dumps(handle.stats))
    handle.shutdown(1)


if __name__ == "__main__":
    main()
