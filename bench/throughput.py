"""Issue 5 (c): sustained export into the real Collector -> Jaeger (native stack on 127.0.0.1).

One process creates phase spans (inside samples) at a target rate for a fixed time, exporting over OTLP to
the Collector; the Collector's own counters (accepted by the receiver, sent by the Jaeger exporter) show what
arrived. Reports the achieved rate, what was dropped where, and the CPU split.
"""

from __future__ import annotations

import os
import re
import resource
import sys
import time
import urllib.request
from pathlib import Path

import otel_agentloop as oal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import stack_lib as stack_mod


def collector_counter(stack: stack_mod.Stack, name: str) -> float:
    url = f"http://127.0.0.1:{stack.ports['otelcol_metrics']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return sum(float(m) for m in re.findall(rf"^{name}(?:_total)?{{[^}}]*}} ([0-9.e+]+)$", text, re.M))


def run(seconds: float = 60.0, rate: int = 10_000, protocol: str = "http/json") -> str:
    pace = rate * 1.05  # offer a little more than the target, so meeting it is not a rounding artefact
    stack = stack_mod.start()
    try:
        endpoint = stack.otlp_http_endpoint if protocol.startswith("http") else stack.otlp_grpc_endpoint
        handle = oal.configure(
            "bench-throughput",
            endpoint=endpoint,
            protocol=protocol,
            set_global=False,
            max_queue_size=65536,
            max_export_batch_size=1024,
            schedule_delay_s=0.2,
        )

        @oal.trace_tool("bench")
        def tool() -> None:
            return None

        spans_per_sample = 10  # root + 9 phase spans
        created = 0
        t0 = time.perf_counter()
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        deadline = t0 + seconds
        sample = 0
        while time.perf_counter() < deadline:
            target = int((time.perf_counter() - t0) * pace)
            while created < target:
                with oal.sample(sample % 4096, step=1 + sample // 4096):
                    for _ in range(spans_per_sample - 1):
                        tool()
                created += spans_per_sample
                sample += 1
            time.sleep(0.001)
        elapsed = time.perf_counter() - t0
        flushed = handle.force_flush(60)
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        stats = handle.stats
        handle.shutdown(10)
        time.sleep(3)  # let the Collector's batch processor send its last batch
        accepted = collector_counter(stack, "otelcol_receiver_accepted_spans")
        refused = collector_counter(stack, "otelcol_receiver_refused_spans")
        sent = collector_counter(stack, "otelcol_exporter_sent_spans")
        failed = collector_counter(stack, "otelcol_exporter_send_failed_spans")
    finally:
        stack.stop()
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    achieved = created / elapsed
    ok = "met" if achieved >= rate and stats["dropped"] == 0 and sent >= created else "NOT met"
    flush = "completed" if flushed else "timed out"
    return f"""## Sustained export into the real Collector -> Jaeger (issue 5 c)

Target {rate:,} spans/s for {seconds:.0f} s (offered: {pace:,.0f}/s) from one Python process,
OTLP {protocol} to the Collector (native build, 127.0.0.1), which batches and forwards to Jaeger
(memory storage). Achieved **{achieved:,.0f} spans/s** ({created:,} spans in {elapsed:.1f} s; target {ok}).
Our side: exported {stats["exported"]:,}, dropped {stats["dropped"]:,}, failed {stats["failed"]:,},
flush {flush}. Collector: accepted {accepted:,.0f}, refused {refused:,.0f}, sent to Jaeger {sent:,.0f},
send failures {failed:,.0f}. Process CPU {cpu:.1f} s for {elapsed:.1f} s wall ({cpu / elapsed:.0%} of one
core: span creation and encoding share the GIL; the Collector and Jaeger use the second core).
"""


if __name__ == "__main__":
    seconds = float(os.environ.get("BENCH_SECONDS", "60"))
    print(run(seconds=seconds))
