"""Process-level promises: fork under threads, shutdown that turns tracing off, validated settings
(issue 13 classes 1, 2, 10, 11)."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Sequence

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_agentloop as oal
from otel_agentloop.core._state import state


def _recording() -> bool:
    @oal.trace_tool("probe")
    def probe() -> bool:
        return trace.get_current_span().is_recording()

    return probe()


# -- fork (class 1) ----------------------------------------------------------------------------------
_FORK_SCRIPT = textwrap.dedent("""
    import faulthandler, os, sys, threading, time
    import otel_agentloop as oal

    handle = oal.configure("fork", file=sys.argv[1], set_global=False, schedule_delay_s=0.01, max_queue_size=64,
                           max_exported_samples_per_step=1)  # keeper and budget sampler on the path too
    stop = threading.Event()

    @oal.trace_generate(model="m")
    def gen():
        return None

    def busy(worker):
        i = 0
        with oal.step(worker):
            while not stop.is_set():
                with oal.sample(i):
                    gen()
                    oal.record_sample(response_length=i)
                i += 1
                if i % 50 == 0:
                    handle.metrics.collect(worker)

    def poll():  # a monitoring thread: holds the processors' locks much of the time
        while not stop.is_set():
            handle.stats

    threads = [threading.Thread(target=busy, args=(w,), daemon=True) for w in (1, 2)]
    threads.append(threading.Thread(target=poll, daemon=True))
    for t in threads:
        t.start()
    results = []
    for _ in range(int(sys.argv[2])):
        time.sleep(0.03)
        pid = os.fork()
        if pid == 0:  # child: trace, collect, flush, then exit through the normal path (atexit shutdown)
            faulthandler.dump_traceback_later(8, exit=True)  # a hang prints every thread's stack, exits 1
            with oal.step(99), oal.sample(0):
                gen()
            ok = handle.metrics.collect(99)["agent_loop/num_samples"] == 1
            flushed = handle.force_flush(5)  # the export worker was restarted in the child
            sys.exit(0 if ok and flushed else 2)
        deadline = time.monotonic() + 10
        code = None
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                break
            time.sleep(0.02)
        if code is None:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            code = "hung"
        results.append(code)
    stop.set()
    print("children:", results, flush=True)
    os._exit(0 if results == [0] * len(results) else 1)
""")


@pytest.mark.e2e  # a subprocess
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_while_threads_trace_never_hangs_the_child(tmp_path) -> None:
    """8 forks while 2 threads make spans and a third polls stats; each child traces, collects, flushes and
    exits normally. A hung child is killed after 10 s and fails the test; the whole run is bounded."""
    out = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT, str(tmp_path / "fork.jsonl"), "8"],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]


_FORK_KEYS_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import otel_agentloop as oal

    handle = oal.configure("fork-keys", file=sys.argv[1], set_global=False, max_exported_samples_per_step=1)

    @oal.trace_generate(model="m")
    def gen():
        return None

    def one_step(step):
        with oal.step(step), oal.sample(0):
            gen()
        return sorted(handle.metrics.collect(step))

    parent = one_step(1)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, json.dumps(one_step(2)).encode())
        os._exit(0)
    os.close(write)
    child = json.loads(os.read(read, 1 << 20))
    os.waitpid(pid, 0)
    print(json.dumps({"parent": parent, "child": child}))
""")


@pytest.mark.e2e  # a subprocess
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_collects_the_same_metric_keys_as_its_parent(tmp_path) -> None:
    """The child starts with no accumulated spans, but keeps what the handle hooked into the metrics (the
    watchdog's hung/slow keys, the keeper's and registry's counters)."""
    out = subprocess.run(
        [sys.executable, "-c", _FORK_KEYS_SCRIPT, str(tmp_path / "keys.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    keys = json.loads(out.stdout.strip().splitlines()[-1])
    assert "agent_loop/telemetry/inflight_samples_evicted" in keys["parent"]  # a counter the registry adds
    assert keys["child"] == keys["parent"]


# -- shutdown (class 2) ------------------------------------------------------------------------------
def test_shutdown_turns_tracing_off_and_restores_the_previous_setup() -> None:
    assert not _recording()
    before = oal.current_handle()
    a = oal.configure("a", exporters=[InMemorySpanExporter()], set_global=False, capture_content=True)
    b = oal.configure("b", exporters=[InMemorySpanExporter()], set_global=False, trace_per="step")
    assert _recording()
    a.shutdown()
    assert _recording()  # b is still live
    b.shutdown()
    assert not _recording()  # not a re-installed, shut-down `a`
    assert oal.current_handle() is before
    # what configure() replaced is back
    assert state.content.enabled is False
    assert state.defaults.trace_per == "sample"


@pytest.mark.e2e  # a subprocess
def test_shutdown_of_a_global_provider_turns_tracing_off_in_a_fresh_process() -> None:
    code = textwrap.dedent("""
        import logging, io, time
        import otel_agentloop as oal
        from opentelemetry import trace
        stream = io.StringIO()
        logging.getLogger("otel_agentloop").addHandler(logging.StreamHandler(stream))
        @oal.trace_tool("t")
        def probe():
            return trace.get_current_span().is_recording()
        h = oal.configure("g", endpoint="http://127.0.0.1:1", protocol="http/json")
        assert probe()
        h.shutdown(1)
        assert not probe(), "tracing still on after shutdown"
        t0 = time.perf_counter()
        for _ in range(20000):
            probe()
        per_call = (time.perf_counter() - t0) / 20000 * 1e6
        assert "reachable" not in stream.getvalue(), stream.getvalue()
        print(f"after shutdown: {per_call:.2f} us/call")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "after shutdown" in out.stdout


class StuckExporter(SpanExporter):
    def __init__(self) -> None:
        self.release = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait(30)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def test_shutdown_timeout_is_honoured_and_stuck_spans_are_counted() -> None:
    stuck = StuckExporter()
    handle = oal.configure("stuck", exporters=[stuck], set_global=False, schedule_delay_s=0.01, max_export_batch_size=4)
    try:
        for i in range(20):
            with oal.sample(i, step=1):
                pass
        time.sleep(0.1)  # the worker is now stuck in export with a batch in flight
        t0 = time.perf_counter()
        handle.shutdown(0.5)
        took = time.perf_counter() - t0
        stats = handle.stats
        assert took < 10, took  # 0.5 s, with room for a loaded machine; far below the 30 s the export is stuck
        assert stats["queued"] == 20
        assert stats["dropped"] + stats["exported"] + stats["failed"] == stats["queued"], stats
    finally:
        stuck.release.set()


# -- settings (class 10) -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("schedule_delay_s", math.inf),
        ("schedule_delay_s", math.nan),
        ("schedule_delay_s", 1e12),
        ("export_timeout_s", math.nan),
        ("export_timeout_s", math.inf),
        ("max_queue_size", "10"),
        ("max_queue_size", 2.5),
        ("max_export_batch_size", math.nan),
        ("keep_slowest", "5"),
        ("max_content_chars", math.inf),
        ("max_buffered_spans", -1),
        ("max_steps", 0),
    ],
)
def test_bad_arguments_raise_value_error_naming_the_setting(name, value) -> None:
    with pytest.raises(ValueError, match=name):
        oal.configure("bad", set_global=False, exporters=[InMemorySpanExporter()], **{name: value})


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("OTEL_BSP_SCHEDULE_DELAY", "99999999999999"),
        ("OTEL_BSP_SCHEDULE_DELAY", "nan"),
        ("OTEL_BSP_SCHEDULE_DELAY", "inf"),
        ("OTEL_BSP_EXPORT_TIMEOUT", "nan"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "inf"),
    ],
)
def test_bad_environment_values_warn_naming_the_variable_and_still_export(monkeypatch, caplog, var, value) -> None:
    monkeypatch.setenv(var, value)
    memory = InMemorySpanExporter()
    with caplog.at_level(logging.WARNING, logger="otel_agentloop"):
        handle = oal.configure("env", exporters=[memory], set_global=False)
    try:
        assert any(var in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
        with oal.sample(0, step=1):
            pass
        assert handle.force_flush(5)
        assert len(memory.get_finished_spans()) == 1
        assert handle.stats["exported"] == 1
    finally:
        handle.shutdown(2)


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_bad_otlp_timeout_warns_and_http_export_still_works(monkeypatch, caplog, value) -> None:
    from tests._support.otlp_receiver import Receiver, start_http

    receiver = Receiver()
    server, endpoint = start_http(receiver)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", value)
    with caplog.at_level(logging.WARNING, logger="otel_agentloop"):
        handle = oal.configure("t", endpoint=endpoint, protocol="http/json", set_global=False, schedule_delay_s=0.05)
    try:
        assert any("OTEL_EXPORTER_OTLP_TIMEOUT" in r.getMessage() for r in caplog.records)
        with oal.sample(0, step=1):
            pass
        assert handle.force_flush(10)
        assert handle.stats["exported"] == 1 and len(receiver.records) == 1
    finally:
        handle.shutdown(2)
        server.shutdown()


def test_nan_schedule_delay_from_the_environment_does_not_spin(monkeypatch) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "nan")
    handle = oal.configure("spin", exporters=[InMemorySpanExporter()], set_global=False)
    try:
        cpu0 = time.process_time()
        time.sleep(1.0)
        assert time.process_time() - cpu0 < 0.3
    finally:
        handle.shutdown(2)
