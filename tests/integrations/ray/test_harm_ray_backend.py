"""A dead, hung or slow backend never slows Ray actor calls through ``traced_remote`` (issue 13 class 3).

Real local Ray cluster; the workers export over OTLP to a closed port on 127.0.0.1 (dead), to a TCP listener
that accepts and never answers (hung), or to a real OTLP/HTTP receiver that answers after 2 s (slow). Each call
makes 20 sample + 20 generation spans. Figures (median call latency, spans queued / exported / dropped /
failed / pending in the worker) are printed for the closing note. The README promises that a dead, hung or slow
backend adds about 4 ms to a call (instead of the 5 s flush timeout): the median sync call and the median async
call are each bounded by ``MEDIAN_CALL_S`` (1 s: far below the slow backend's 2 s answer and the 5 s flush timeout
a waiting call would take, with room for Ray calls on a loaded 2-core machine), and every span is accounted for.
"""

from __future__ import annotations

import os
import socket
import statistics
import time

import pytest

import otel_agentloop as oal
from tests._support import REPO_ROOT
from tests._support.otlp_receiver import Receiver, start_http
from tests.integrations.ray.ray_local import local_ray

pytestmark = pytest.mark.e2e  # a local Ray cluster

ray = pytest.importorskip("ray") if not os.environ.get("CI") else __import__("ray")

ROOT = str(REPO_ROOT)
CALLS = 12
MEDIAN_CALL_S = 1.0
"""Bound on the median actor call (41 spans made and queued, plus Ray's round trip). The README's figure is
~4 ms added per call; measured here on the shared 2-core machine at load average 16, a whole call's median was
7-9 ms with a dead, hung or slow backend (19 ms with a live one). 0.25 s leaves ~25x room for a loaded
machine, and still fails on any regression to a real wait per call: the smallest one, a healthy-backend flush
wait (4 x the last export + 100 ms), is >= 0.1 s; the flush timeout is 5 s (the old bound accepted 2.5 s)."""


def _closed_port() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connection refused
    return f"http://127.0.0.1:{port}"


class _Slow(Receiver):
    pass


def _slow_receiver():
    import http.server

    receiver = Receiver()
    server, endpoint = start_http(receiver)
    handler = server.RequestHandlerClass
    original = handler.do_POST

    def slow_post(self: http.server.BaseHTTPRequestHandler) -> None:
        time.sleep(2.0)
        original(self)

    handler.do_POST = slow_post
    return server, endpoint, receiver


@pytest.fixture(scope="module")
def ray_cluster():
    with local_ray(num_cpus=2):
        yield


def _run(endpoint: str, protocol: str, label: str, settle_s: float = 0.0) -> dict[str, float]:
    """``CALLS`` calls (sync and async alternately); then, within ``settle_s``, wait for the worker's queue to
    drain (off the call path) before reading its counters."""
    env = {
        "OTEL_SERVICE_NAME": "backend-" + label,
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_TIMEOUT": "10",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_BSP_MAX_QUEUE_SIZE": "200",
        "PYTHONPATH": ROOT,
    }
    from tests.integrations.ray.ray_actors import BackendProbe

    actor = (
        ray.remote(num_cpus=0)(BackendProbe)
        .options(
            runtime_env={"env_vars": env, "worker_process_setup_hook": "otel_agentloop.integrations.ray.setup_worker"}
        )
        .remote()
    )
    carrier = {"rl.step": 1, "rl.validate": False}
    latencies = []
    try:
        ray.get(actor.stats.remote(), timeout=120)  # started
        for i in range(CALLS):
            t0 = time.perf_counter()
            if i % 2:
                ray.get(actor.work_async.remote(i, 20, otel_carrier=carrier), timeout=60)
            else:
                ray.get(actor.work.remote(i, 20, otel_carrier=carrier), timeout=60)
            latencies.append(time.perf_counter() - t0)
        stats = ray.get(actor.stats.remote(), timeout=30)
        deadline = time.monotonic() + settle_s
        while stats["pending"] and time.monotonic() < deadline:
            time.sleep(0.2)
            stats = ray.get(actor.stats.remote(), timeout=30)
    finally:
        ray.kill(actor)
    out = {
        # the slower of the sync and async calls' medians: a wait that only one kind makes cannot hide
        "median_s": max(statistics.median(latencies[0::2]), statistics.median(latencies[1::2])),
        "max_s": max(latencies),
        "first_s": latencies[0],
        **{k: stats[k] for k in ("queued", "exported", "dropped", "failed", "pending")},
    }
    print(
        f"\n{label}: call latency median (slower kind) {out['median_s'] * 1e3:.1f} ms, "
        f"first {out['first_s'] * 1e3:.1f} ms, max {out['max_s'] * 1e3:.1f} ms over {CALLS} calls; "
        f"spans queued {stats['queued']}, exported "
        f"{stats['exported']}, dropped {stats['dropped']}, failed {stats['failed']}, pending {stats['pending']}"
    )
    return out


def _accounted(out: dict[str, float]) -> None:
    # every span the worker created is counted somewhere (41 per call: 20 samples, 20 phases, 1 worker span)
    created = CALLS * 41
    assert out["queued"] + out["dropped"] == created, out
    assert out["exported"] + out["failed"] + out["pending"] == out["queued"], out


@pytest.mark.parametrize("protocol", ["grpc", "http/json"])
def test_dead_backend_adds_no_flush_timeout_to_actor_calls(ray_cluster, protocol) -> None:
    out = _run(_closed_port(), protocol, f"dead {protocol}")
    assert out["median_s"] < MEDIAN_CALL_S, out
    assert out["exported"] == 0
    _accounted(out)


def test_hung_backend_adds_no_flush_timeout_to_actor_calls(ray_cluster) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)  # accepts connections (backlog) and never answers
    try:
        out = _run(f"http://127.0.0.1:{listener.getsockname()[1]}", "http/json", "hung http/json")
    finally:
        listener.close()
    assert out["median_s"] < MEDIAN_CALL_S, out
    _accounted(out)


def test_slow_backend_still_receives_spans_without_slowing_calls(ray_cluster) -> None:
    server, endpoint, receiver = _slow_receiver()
    try:
        out = _run(endpoint, "http/json", "slow (2 s) http/json", settle_s=20)
    finally:
        server.shutdown()
    assert out["median_s"] < MEDIAN_CALL_S, out
    assert out["exported"] > 0 and len(receiver.records) == out["exported"]
    _accounted(out)


def test_live_backend_gets_every_span_before_each_call_returns(ray_cluster) -> None:
    receiver = Receiver()
    server, endpoint = start_http(receiver)
    try:
        out = _run(endpoint, "http/json", "live http/json")  # counters read right after the last call
    finally:
        server.shutdown()
    # with a live backend each call (sync or async) returns after its spans are exported: ray.kill loses nothing
    assert out["dropped"] == 0 and out["pending"] == 0, out
    assert out["exported"] == CALLS * 41 == len(receiver.records), out


def test_a_def_returning_a_ray_object_ref_keeps_it_and_is_timed_until_done(ray_cluster) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    @ray.remote(num_cpus=0)
    def slow(x: int) -> int:
        time.sleep(0.3)
        return x + 1

    memory = InMemorySpanExporter()
    handle = oal.configure("ref", exporters=[memory], set_global=False, schedule_delay_s=0.05)
    try:

        @oal.trace_tool("remote")
        def submit(x: int):
            return slow.remote(x)

        ref = submit(1)
        assert isinstance(ref, ray.ObjectRef)  # the caller holds what it would hold without us
        assert ray.get(ref, timeout=60) == 2
        deadline = time.monotonic() + 10
        while not memory.get_finished_spans() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert handle.force_flush(5)
        (span,) = memory.get_finished_spans()
        assert (span.end_time - span.start_time) / 1e9 >= 0.25
    finally:
        handle.shutdown(5)
