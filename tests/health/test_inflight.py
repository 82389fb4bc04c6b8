"""In-flight registry, watchdog (reports, snapshot spans, slow/hung verdicts, learned thresholds) and the
library's OTel metrics with exemplars, in one process with real SDK components."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.core._inflight import OpenPhase
from otel_agentloop.core._tracer import current_tracer
from otel_agentloop.health import WatchdogSettings
from otel_agentloop.health._watchdog import parse_thresholds
from otel_agentloop.metrics import PhaseMetricsProcessor, StepMetrics
from tests._support.spans import span_metrics

HANG_S, INTERVAL_S = 0.4, 0.1


@pytest.fixture
def live(request: pytest.FixtureRequest) -> Iterator[tuple[oal.Handle, InMemorySpanExporter, InMemoryMetricReader]]:
    """A handle with the watchdog and a metric reader; on the fast path unless parametrized ``False``."""
    exporter = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    settings = WatchdogSettings(interval_s=INTERVAL_S, thresholds_s={"tool:hang": HANG_S, "tool:slow": HANG_S})
    handle = oal.configure(
        "live-test",
        exporters=[exporter],
        set_global=False,
        schedule_delay_s=0.05,
        watchdog=settings,
        metric_readers=[reader],
        fast_path=getattr(request, "param", True),
    )
    yield handle, exporter, reader
    handle.shutdown(5)


@oal.trace_generate(model="m")
async def generate(delay: float) -> None:
    await asyncio.sleep(delay)


@oal.trace_tool("hang")
async def hang(release: asyncio.Event) -> None:
    await release.wait()


@oal.trace_tool("slow")
async def slow_tool(delay: float) -> None:
    await asyncio.sleep(delay)


@oal.trace_tool("quick")
async def quick_tool() -> None:
    await asyncio.sleep(0.001)


def test_snapshot_names_every_running_sample_with_phase_tool_and_ages(live) -> None:
    handle, _, _ = live

    async def main() -> list:
        release = asyncio.Event()
        with oal.step(7):

            async def one(i: int) -> None:
                async with oal.sample(i, rollout_n=1):
                    await generate(0.01)
                    if i == 0:
                        await hang(release)
                    else:
                        await generate(5.0)

            tasks = [asyncio.create_task(one(i)) for i in range(3)]
            await asyncio.sleep(0.2)
            snap = handle.inflight()
            release.set()
            for t in tasks[1:]:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return snap

    snap = asyncio.run(main())
    assert [(s.sample_index, s.rollout_n, s.step, s.validate) for s in snap] == [
        (0, 1, 7, False),
        (1, 1, 7, False),
        (2, 1, 7, False),
    ]
    by_index = {s.sample_index: s for s in snap}
    assert (by_index[0].phase, by_index[0].tool) == (sc.TOOL_CALLS, "hang")
    assert (by_index[1].phase, by_index[1].tool) == (sc.GENERATE, None)
    for s in snap:
        # ages are wall-clock, like the span start times they come from, while the 0.2 s above is asyncio's
        # monotonic clock: a wall clock slewed by NTP (seen here once: 0.12 s after a 0.2 s sleep) reads less
        assert 0.05 < s.sample_age_s < 5 and 0.0 < s.phase_age_s <= s.sample_age_s
        assert len(s.trace_id) == 32 and s.pid == os.getpid()
    assert len({s.trace_id for s in snap}) == 3
    assert handle.inflight() == []  # all ended
    assert handle.live.registry.stats["inflight_samples"] == 0


def test_registry_is_fed_by_every_library_span_and_by_no_raw_otel_span(live) -> None:
    """Block spans, phases nested in a phase, generators and sync phases are tracked (the most recently started
    open phase wins); a phase started by a task that outlives its sample and a span started straight through
    the OTel tracer are not; every tracked phase's duration reaches its (phase, tool) window."""
    handle, _, _ = live
    registry = handle.live.registry
    tracer = handle.provider.get_tracer("raw")
    seen: dict[str, tuple[str, str | None]] = {}

    def current() -> tuple[str, str | None]:
        (running,) = handle.inflight()
        return running.phase, running.tool

    @oal.trace_tool("gen_tool")
    def gen_tool():
        seen["generator"] = current()
        yield 1

    @oal.trace_reward
    def reward() -> None:
        seen["sync"] = current()

    async def main() -> asyncio.Task:
        with oal.step(3):
            async with oal.sample(0, rollout_n=0):
                seen["none"] = current()
                with tracer.start_as_current_span("raw", attributes={sc.RL_PHASE: sc.GENERATE}):
                    seen["raw"] = current()
                async with oal.span("tool_calls"):
                    seen["block"] = current()
                    await quick_tool()
                    with oal.span("tool_calls", tool="inner"):
                        seen["nested"] = current()
                    seen["after nested"] = current()
                assert list(gen_tool()) == [1]
                reward()
                late = asyncio.get_running_loop().create_task(generate(0.2))  # outlives the sample
            await asyncio.sleep(0.05)
            seen["late"] = (len(registry._phases), len(handle.inflight()))
            await late
        return late

    asyncio.run(main())
    assert seen == {
        "none": ("other", None),
        "raw": ("other", None),
        "block": (sc.TOOL_CALLS, None),
        "nested": (sc.TOOL_CALLS, "inner"),
        "after nested": (sc.TOOL_CALLS, None),
        "generator": (sc.TOOL_CALLS, "gen_tool"),
        "sync": (sc.COMPUTE_SCORE, None),
        "late": (0, 0),
    }
    windows = {key: len(w) for key, w in registry.durations.items()}
    assert windows == {
        (sc.TOOL_CALLS, None): 1,
        (sc.TOOL_CALLS, "quick"): 1,
        (sc.TOOL_CALLS, "inner"): 1,
        (sc.TOOL_CALLS, "gen_tool"): 1,
        (sc.COMPUTE_SCORE, None): 1,
    }
    assert all(d > 0 for w in registry.durations.values() for d in w)
    assert registry._phases == {} and handle.inflight() == []


def test_a_phase_ended_at_a_time_measured_elsewhere_leaves_the_registry(live) -> None:
    """verl's timers end a phase span at the time verl measured (not now): the registry forgets it and learns
    that duration; an error ends it through the same scope."""
    from otel_agentloop.core._phase import PhaseSpec, start
    from otel_agentloop.integrations.verl._phases import end_span

    handle, _, _ = live
    registry = handle.live.registry
    with oal.step(1), oal.sample(0):
        started = start(PhaseSpec.build(sc.TOOL_CALLS, tool="timed"))
        assert handle.inflight()[0].tool == "timed"
        end_span(started, None, 0.25)
        assert handle.inflight()[0].phase == "other" and registry._phases == {}
        failed = start(PhaseSpec.build(sc.TOOL_CALLS, tool="failed"))
        end_span(failed, ValueError("boom"), 0.0)
        assert registry._phases == {}
    assert list(registry.durations[(sc.TOOL_CALLS, "timed")]) == [250_000_000]
    assert len(registry.durations[(sc.TOOL_CALLS, "failed")]) == 1


def test_hung_tool_is_reported_once_within_threshold_plus_interval_with_a_snapshot_and_classified_hung(
    live, caplog
) -> None:
    handle, exporter, _ = live
    caplog.set_level(logging.WARNING, logger="otel_agentloop")
    reported: dict[str, float] = {}

    async def main() -> StepMetrics:
        release = asyncio.Event()
        with oal.step(3):

            async def hung_sample() -> None:
                async with oal.sample(5, rollout_n=2):
                    await generate(0.01)
                    reported["tool_start"] = time.monotonic()
                    await hang(release)

            task = asyncio.create_task(hung_sample())
            deadline = time.time() + 10
            while not any(s.name.endswith(sc.SNAPSHOT_SUFFIX) for s in exporter.get_finished_spans()):
                assert time.time() < deadline, "no snapshot exported"
                await asyncio.sleep(0.02)
            reported["snapshot_seen"] = time.monotonic()
            assert handle.inflight()[0].overdue  # still running, and known to be overdue
            await asyncio.sleep(3 * INTERVAL_S)  # more checks: still one report
            metrics = handle.metrics.collect(3)  # the step is collected while the sample still runs ...
            release.set()  # ... then the rollout is cancelled/ended
            await task
        return metrics

    metrics = asyncio.run(main())
    warnings = [r.getMessage() for r in caplog.records if "watchdog" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "sample 5/2 (step 3)" in warnings[0] and "tool_calls (tool hang)" in warnings[0]
    snaps = [s for s in exporter.get_finished_spans() if s.attributes.get(sc.RL_SNAPSHOT)]
    assert len(snaps) == 1
    snap = snaps[0]
    root = next(s for s in handle_spans(handle, exporter) if s.name == sc.SAMPLE_SPAN)
    # the contract shared with the HTML timeline
    assert snap.name == "rl.sample (in progress)"
    assert snap.context.trace_id == root.context.trace_id
    assert snap.parent.span_id == root.context.span_id
    assert [link.context.span_id for link in snap.links] == [root.context.span_id]
    assert snap.start_time == root.start_time and snap.end_time < root.end_time
    attrs = dict(snap.attributes)
    assert attrs[sc.RL_STEP] == 3 and attrs[sc.RL_SAMPLE_INDEX] == 5 and attrs[sc.RL_ROLLOUT_N] == 2
    assert attrs[sc.RL_VALIDATE] is False
    assert attrs[sc.RL_PHASE] == sc.TOOL_CALLS and attrs[sc.GEN_AI_TOOL_NAME] == "hang"
    # reported once past the threshold, its age the phase's real age at the snapshot: no more than the time from
    # before the tool call to seeing the snapshot (orderings that hold under any load; the first check at or after
    # the threshold, exactly: test_watchdog_boundary_is_exact_with_an_injected_clock)
    age = attrs[sc.RL_SNAPSHOT_PHASE_AGE]
    assert HANG_S <= age <= reported["snapshot_seen"] - reported["tool_start"], (age, reported)
    # classified hung, with its trace id
    assert metrics["agent_loop/watchdog/hung"] == 1.0 and metrics["agent_loop/watchdog/slow"] == 0.0
    assert metrics.hung_trace_ids == (format(root.context.trace_id, "032x"),)
    # a sample still running at collection is left out of the step's phase metrics (counted as in flight), and
    # the snapshot (ended before collection, rl.phase=tool_calls, 0.5 s long) is never phase time
    assert "agent_loop/tool_calls/max" not in metrics and metrics["agent_loop/num_samples"] == 0.0
    assert metrics["agent_loop/telemetry/samples_in_flight"] == 1.0


def handle_spans(handle: oal.Handle, exporter: InMemorySpanExporter) -> list:
    assert handle.force_flush(5)
    return list(exporter.get_finished_spans())


def test_watchdog_boundary_is_exact_with_an_injected_clock(live) -> None:
    """The scan reports a phase at the first check at or after start + threshold, never before."""
    handle, _, _ = live
    monitor = handle.live
    monitor._stop.set()  # drive checks by hand
    monitor._thread.join(2)
    started = threading.Event()
    release = threading.Event()

    @oal.trace_tool("hang")
    def blocking() -> None:
        started.set()
        release.wait(10)

    def run() -> None:
        with oal.step(1), oal.sample(0):
            blocking()

    worker = threading.Thread(target=run)
    worker.start()
    assert started.wait(5)
    span = next(iter(monitor.registry._phases))
    rec = OpenPhase(span.sample, span.phase, span.tool, span.start_mono)
    threshold_ns = int(HANG_S * 1e9)
    monitor.check(now_ns=rec.start_mono_ns + threshold_ns - 1)
    assert monitor.reports == 0
    monitor.check(now_ns=rec.start_mono_ns + threshold_ns)
    assert monitor.reports == 1
    monitor.check(now_ns=rec.start_mono_ns + 10 * threshold_ns)
    assert monitor.reports == 1
    release.set()
    worker.join(5)
    metrics = handle.metrics.collect(1)
    assert metrics["agent_loop/watchdog/slow"] == 1.0 and metrics["agent_loop/watchdog/hung"] == 0.0


def test_slow_tool_that_finishes_is_classified_slow(live) -> None:
    handle, exporter, _ = live

    async def main() -> StepMetrics:
        with oal.step(4):

            async def one(i: int) -> None:
                async with oal.sample(i):
                    await generate(0.01)
                    if i == 1:
                        await slow_tool(HANG_S + 3 * INTERVAL_S)
                    else:
                        await quick_tool()

            await asyncio.gather(*(one(i) for i in range(4)))
        return handle.metrics.collect(4)

    metrics = asyncio.run(main())
    assert metrics["agent_loop/watchdog/slow"] == 1.0 and metrics["agent_loop/watchdog/hung"] == 0.0
    slow = metrics.slow_samples[0]
    assert (slow.sample_index, slow.phase, slow.tool) == (1, sc.TOOL_CALLS, "slow")
    spans = handle_spans(handle, exporter)
    roots = {s.attributes[sc.RL_SAMPLE_INDEX]: s for s in spans if s.name == sc.SAMPLE_SPAN}
    assert metrics.slow_trace_ids == (format(roots[1].context.trace_id, "032x"),)
    # the next step starts clean
    asyncio.run(_quick_step(5))
    assert "agent_loop/watchdog/slow" not in handle.metrics.collect(5)


async def _quick_step(step: int, n: int = 4) -> None:
    with oal.step(step):

        async def one(i: int) -> None:
            async with oal.sample(i):
                await generate(0.002)
                await quick_tool()

        await asyncio.gather(*(one(i) for i in range(n)))


def test_snapshot_spans_are_not_counted_as_phase_time(traced) -> None:
    """A stored snapshot (e.g. read back from Jaeger) changes nothing in the rebuilt metrics."""
    proc = PhaseMetricsProcessor()
    base = {sc.RL_STEP: 1, sc.RL_VALIDATE: False, sc.RL_SAMPLE_INDEX: 0, sc.RL_ROLLOUT_N: 0}
    proc.ingest("execute_tool t", {**base, sc.RL_PHASE: sc.TOOL_CALLS}, 0, 10**9, 1, False)
    proc.ingest(
        sc.SAMPLE_SPAN + sc.SNAPSHOT_SUFFIX,
        {**base, sc.RL_PHASE: sc.TOOL_CALLS, sc.RL_SNAPSHOT: True},
        0,
        9 * 10**9,
        1,
        False,
    )
    assert proc.collect(1)["agent_loop/tool_calls/max"] == 1.0


def test_thresholds_are_learned_from_collected_steps_and_explicit_ones_win() -> None:
    exporter = InMemorySpanExporter()
    settings = WatchdogSettings(
        interval_s=10,
        min_s=0.05,
        p99_multiple=3.0,
        min_observations=20,
        default_s=123.0,
        thresholds_s={"tool:slow": 7.0},
    )
    handle = oal.configure("learn", exporters=[exporter], set_global=False, watchdog=settings)
    try:
        monitor = handle.live
        assert monitor.threshold_s(sc.TOOL_CALLS, "quick") == 123.0  # nothing learned yet
        asyncio.run(_quick_step(1, n=30))
        assert monitor.threshold_s(sc.TOOL_CALLS, "quick") == 123.0  # learned only when a step is collected
        handle.metrics.collect(1)
        learned = monitor.threshold_s(sc.TOOL_CALLS, "quick")
        durations = sorted(
            (s.end_time - s.start_time) / 1e9
            for s in handle_spans(handle, exporter)
            if s.attributes.get(sc.GEN_AI_TOOL_NAME) == "quick"
        )
        assert len(durations) == 30
        assert max(0.05, 3 * durations[-2]) <= learned <= max(0.05, 3 * durations[-1]) + 1e-9
        assert monitor.threshold_s(sc.TOOL_CALLS, "never-seen") == monitor.threshold_s(sc.TOOL_CALLS)
        assert monitor.threshold_s(sc.TOOL_CALLS, "slow") == 7.0
        assert monitor.threshold_s(sc.COMPUTE_SCORE) == 123.0
    finally:
        handle.shutdown(5)


def test_settings_parse_and_validate(monkeypatch, caplog) -> None:
    assert parse_thresholds("tool_calls=60, tool:python=300,generate=900") == {
        (sc.TOOL_CALLS, None): 60.0,
        (sc.TOOL_CALLS, "python"): 300.0,
        (sc.GENERATE, None): 900.0,
    }
    for bad in ("nope=3", "tool_calls=-1", "tool_calls", "tool_calls=x"):
        with pytest.raises(ValueError):
            parse_thresholds(bad)
    with pytest.raises(ValueError):
        WatchdogSettings(interval_s=0)
    monkeypatch.setenv("OTEL_AGENTLOOP_WATCHDOG_INTERVAL", "0.25")
    monkeypatch.setenv("OTEL_AGENTLOOP_WATCHDOG_THRESHOLDS", "tool:python=30")
    monkeypatch.setenv("OTEL_AGENTLOOP_WATCHDOG_P99_MULTIPLE", "oops")
    settings = WatchdogSettings.from_env()
    assert settings.interval_s == 0.25 and settings.parsed == {(sc.TOOL_CALLS, "python"): 30.0}
    assert settings.p99_multiple == 3.0 and "OTEL_AGENTLOOP_WATCHDOG_P99_MULTIPLE" in caplog.text
    again = WatchdogSettings.from_env.__func__(WatchdogSettings)  # same result from its own worker_env
    for key, value in settings.worker_env().items():
        monkeypatch.setenv(key, value)
    assert WatchdogSettings.from_env().parsed == again.parsed
    monkeypatch.setenv("OTEL_AGENTLOOP_WATCHDOG", "false")
    handle = oal.configure("off", exporters=[InMemorySpanExporter()], set_global=False)
    try:
        assert handle.live.settings.enabled is False
        assert not handle.live.registry.keep_ended and not handle.live.registry.learn  # nothing kept: not needed
    finally:
        handle.shutdown(5)


def test_registry_is_bounded_and_counts_evictions() -> None:
    handle = oal.configure("bounded", exporters=[InMemorySpanExporter()], set_global=False, max_inflight_samples=4)
    try:
        with oal.step(1):
            scopes = [oal.sample(i) for i in range(6)]
            for s in scopes:
                s.__enter__()
            snap = handle.inflight()
            for s in reversed(scopes):
                s.__exit__(None, None, None)
        assert [s.sample_index for s in snap] == [2, 3, 4, 5]
        assert handle.live.registry.stats["inflight_samples_evicted"] == 2
        assert handle.inflight() == []
    finally:
        handle.shutdown(5)


def test_disabled_and_shut_down_cost_nothing_and_stop_the_thread() -> None:
    off = oal.configure("off", enabled=False)
    assert off.live is None and off.inflight() == []
    handle = oal.configure("on", exporters=[InMemorySpanExporter()], set_global=False)
    thread = handle.live._thread
    assert thread.is_alive() and thread.daemon
    handle.shutdown(5)
    assert not thread.is_alive() and handle.inflight() == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_child_starts_empty_with_a_running_thread(live) -> None:
    handle, _, _ = live
    with oal.step(1), oal.sample(0):
        assert len(handle.inflight()) == 1
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: empty registry, a fresh live thread, tracking works
            try:
                ok = handle.inflight() == [] and handle.live._thread.is_alive()
                with oal.sample(9):
                    ok = ok and [s.sample_index for s in handle.inflight()] == [9]
                os.write(write, b"1" if ok else b"0")
            finally:
                os._exit(0)
        os.close(write)
        assert os.read(read, 1) == b"1"
        os.waitpid(pid, 0)


@pytest.mark.parametrize("live", [True, False], indirect=True, ids=["fast_path", "sdk_path"])
def test_library_histograms_have_low_cardinality_attributes_and_exemplars(live) -> None:
    handle, exporter, reader = live
    asyncio.run(_quick_step(1, n=3))
    handle.metrics.collect(1)
    handle.live.check()  # records what ended; a flush would collect (and reset) the exemplars first
    data = reader.get_metrics_data()
    points: dict[str, list] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points.setdefault(metric.name, []).extend(metric.data.data_points)
    assert {
        sc.GEN_AI_CLIENT_OPERATION_DURATION,
        sc.GEN_AI_EXECUTE_TOOL_DURATION,
        sc.RL_SAMPLE_DURATION,
        sc.RL_INFLIGHT_SAMPLES,
        sc.RL_INFLIGHT_OLDEST_AGE,
    } <= set(points)
    gen = points[sc.GEN_AI_CLIENT_OPERATION_DURATION]
    assert [dict(p.attributes) for p in gen] == [
        {
            sc.GEN_AI_OPERATION_NAME: "text_completion",
            sc.GEN_AI_REQUEST_MODEL: "m",
            sc.RL_VALIDATE: False,
            sc.RL_PHASE: sc.GENERATE,
        }
    ]
    assert gen[0].count == 3 and gen[0].explicit_bounds[0] == 0.005 and gen[0].explicit_bounds[-1] == 1800
    tool = points[sc.GEN_AI_EXECUTE_TOOL_DURATION]
    assert dict(tool[0].attributes)[sc.GEN_AI_TOOL_NAME] == "quick"
    spans = handle_spans(handle, exporter)
    span_ids = {(s.context.trace_id, s.context.span_id) for s in spans}
    for name in (sc.GEN_AI_CLIENT_OPERATION_DURATION, sc.GEN_AI_EXECUTE_TOOL_DURATION, sc.RL_SAMPLE_DURATION):
        for p in points[name]:
            assert sc.RL_SAMPLE_INDEX not in p.attributes and sc.RL_STEP not in p.attributes
            assert p.exemplars, name
            for ex in p.exemplars:
                assert (ex.trace_id, ex.span_id) in span_ids
    inflight = {dict(p.attributes)[sc.RL_PHASE]: p.value for p in points[sc.RL_INFLIGHT_SAMPLES]}
    assert inflight[sc.GENERATE] == 0 and set(sc.PHASES) <= set(inflight)


def test_collect_without_reports_keeps_the_exact_metric_keys(live) -> None:
    handle, _, _ = live
    asyncio.run(_quick_step(1))
    metrics = handle.metrics.collect(1)
    assert not any(k.startswith("agent_loop/watchdog/") for k in span_metrics(metrics))


def test_bad_arguments_raise_before_anything_is_installed() -> None:
    with pytest.raises(ValueError, match="max_inflight_samples"):
        oal.configure("bad", exporters=[InMemorySpanExporter()], set_global=False, max_inflight_samples=0)
    assert current_tracer() is None


def test_registry_counters_are_reported_with_the_step(live) -> None:
    handle, _, _ = live
    asyncio.run(_quick_step(1))
    metrics = handle.metrics.collect(1)
    for key in ("inflight_samples_evicted", "inflight_phases_untracked", "inflight_ended_dropped"):
        assert metrics[f"agent_loop/telemetry/{key}"] == 0.0
