"""The live side of the run view (issue 19): one ``rl.step.summary`` span per collected step, arriving whole
whatever the sampler, budget and attribute length limit, equal to what ``collect()`` returned; per-sample wall
times and per-tool call durations in the accumulation; the run identity on every span's resource."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap

import pytest

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop import testing
from otel_agentloop.analysis import read_jsonl
from otel_agentloop.analysis._reading._report import stored_summaries, summary_of
from otel_agentloop.metrics import PhaseMetricsProcessor, PhaseTable, StepSummary
from otel_agentloop.metrics._summary import MAX_TOOLS, OTHER_TOOLS
from tests._support import REPO_ROOT
from tests._support.otlp_receiver import Receiver, start_grpc, start_http, wait_for

ROOT = str(REPO_ROOT)
STEPS = 3
PROMPTS = 12


@oal.trace_tool("search")
async def search(i: int) -> int:
    await asyncio.sleep(0.002 + 0.001 * (i % 3))
    return i


@oal.trace_tool("python")
async def python(i: int) -> int:
    await asyncio.sleep(0.004)
    return i


@oal.trace_generate(model="m")
async def generate(i: int) -> int:
    await asyncio.sleep(0.003 + 0.002 * (i % 4))
    return i


@oal.trace_reward
def reward(i: int) -> float:
    return float(i)


async def _rollout(step: int) -> None:
    async def one(i: int) -> None:
        async with oal.sample(i, 0):
            await generate(i)
            await asyncio.gather(search(i), python(i), search(i + 1))  # parallel calls: three durations
            await generate(i + 1)
            reward(i)

    with oal.step(step):
        await asyncio.gather(*(one(i) for i in range(PROMPTS)))


def _summaries(records) -> list:
    return [r for r in records if r.name == sc.STEP_SUMMARY_SPAN]


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_summary_arrives_whole_under_sampler_budget_and_length_limit_equal_to_collect(
    protocol, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.1")
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "40")
    receiver = Receiver()
    server, endpoint = start_grpc(receiver) if protocol == "grpc" else start_http(receiver)
    path = tmp_path / "t.jsonl"
    handle = oal.configure(
        "summary",
        endpoint=endpoint,
        protocol=protocol,
        file=str(path),
        set_global=False,
        schedule_delay_s=0.05,
        max_exported_samples_per_step=1,
        keep_slowest=1,
    )
    collected = {}
    try:
        for step in range(1, STEPS + 1):
            asyncio.run(_rollout(step))
            collected[step] = handle.metrics.collect(step)
        assert handle.force_flush(10)
        assert handle.stats["summaries_written"] == STEPS and handle.stats["summaries_failed"] == 0
    finally:
        handle.shutdown(5)
        if protocol == "grpc":
            server.stop(0)
        else:
            server.shutdown()
    file_records = list(read_jsonl(str(path)))
    assert wait_for(lambda: len(_summaries(receiver.records)) == STEPS, 10)
    for records in (receiver.records, file_records):
        # the sampler and the budget held most samples back; the summaries all arrived, whole
        assert len([r for r in records if r.name == sc.SAMPLE_SPAN]) < STEPS * PROMPTS
        spans = _summaries(records)
        assert sorted(r.attributes[sc.RL_STEP] for r in spans) == list(range(1, STEPS + 1))
        assert all(r.attributes[sc.RL_VALIDATE] is False for r in spans)
        assert len({r.trace_id for r in spans}) == STEPS  # a trace of its own each
        assert all(len(r.attributes[sc.RL_STEP_SUMMARY]) > 1000 for r in spans)  # far past the 40-char limit
        stored = stored_summaries(records)
        for step, metrics in collected.items():
            summary = stored[(step, False)]
            assert dict(summary.metrics) == dict(metrics)  # every key, equal
            assert summary.num_samples == PROMPTS and summary.counts["ok"] == PROMPTS
            assert summary.tools["search"].count == 2 * PROMPTS and summary.tools["python"].count == PROMPTS
            assert 0.0015 <= summary.tools["search"].p50 <= 0.05 and summary.tools["python"].max >= 0.0035
            assert 0 < summary.start_ns <= summary.median_end_ns <= summary.end_ns <= summary.collected_ns
            assert 0.005 < summary.wall_s < 5
            assert summary.slowest is not None
            assert (
                summary.slowest.total_s
                == metrics["agent_loop/slowest/generate_sequences"]
                + metrics["agent_loop/slowest/tool_calls"]
                + metrics["agent_loop/slowest/compute_score"]
            )
        for r in spans:
            assert r.resource[sc.RL_RUN_ID] == handle.run_id and r.resource[sc.RL_RUN_ATTEMPT] == handle.run_attempt


def test_stored_and_rebuilt_summaries_agree_and_tool_calls_come_from_the_table(tmp_path) -> None:
    """The summary written live and the one ``report`` rebuilds from the sample spans share one code path."""
    path = tmp_path / "t.jsonl"
    handle = oal.configure("rebuilt", file=str(path), set_global=False, schedule_delay_s=0.05)
    try:
        asyncio.run(_rollout(7))
        table = handle.metrics.take(7, release=False)
        metrics = handle.metrics.collect(7)
    finally:
        handle.shutdown(5)
    assert table.step_key == (7, False)
    assert sorted(table.tools) == ["python", "search"]
    assert table.tools["search"].size == 2 * PROMPTS and table.tools["python"].size == PROMPTS
    assert (table.start_ns > 0).all() and (table.end_ns > table.start_ns).all()
    records = list(read_jsonl(str(path)))
    roots = {r.attributes[sc.RL_SAMPLE_INDEX]: r for r in records if r.name == sc.SAMPLE_SPAN}
    canonical = table.canonical()
    for i in range(len(canonical)):  # each sample's wall times are its rl.sample span's
        root = roots[int(canonical.sample_index[i])]
        assert (canonical.start_ns[i], canonical.end_ns[i]) == (root.start_ns, root.end_ns)
    live = stored_summaries(records)[(7, False)]
    rebuilt = summary_of(records, 7)
    assert dict(live.metrics) == dict(metrics)
    assert {k: v for k, v in rebuilt.metrics.items() if "/telemetry/" not in k} == {
        k: v for k, v in live.metrics.items() if "/telemetry/" not in k
    }
    assert rebuilt.tools == live.tools and rebuilt.phases == live.phases
    assert (rebuilt.start_ns, rebuilt.median_end_ns, rebuilt.end_ns) == (live.start_ns, live.median_end_ns, live.end_ns)


def test_tool_calls_are_bounded_and_merged_across_tables_and_running_samples_leave_theirs_out() -> None:
    proc = PhaseMetricsProcessor()
    names = [f"t{i}" for i in range(MAX_TOOLS + 6)]
    for n, name in enumerate(names):
        for call in range(1 + (n < 3)):  # t0..t2 called twice
            attrs = {sc.RL_PHASE: sc.TOOL_CALLS, sc.RL_STEP: 1, sc.RL_SAMPLE_INDEX: n, sc.GEN_AI_TOOL_NAME: name}
            start = 1_000 + 10 * call
            proc.ingest("execute_tool " + name, attrs, start, start + 1_000_000 * (n + 1), 5, False)
    snapshot = {sc.RL_PHASE: sc.TOOL_CALLS, sc.RL_STEP: 1, sc.RL_SAMPLE_INDEX: 0, sc.GEN_AI_TOOL_NAME: "t0"}
    proc.ingest("x (in progress)", {**snapshot, sc.RL_SNAPSHOT: True}, 0, 10**9, 5, False)  # not a call
    table = proc.take(1)
    # no rl.sample span: a sample's wall times are its phase spans' earliest start and latest end
    first = table.canonical()
    assert (first.start_ns[0], first.end_ns[0]) == (1_000, 1_010 + 1_000_000)
    assert (first.start_ns[5], first.end_ns[5]) == (1_000, 1_000 + 6_000_000)
    assert len(table.tools) == MAX_TOOLS + 1 and table.tools[OTHER_TOOLS].size == 6
    assert table.tools["t0"].tolist() == [0.001, 0.001]
    # two workers' tables: merged by name, bounded again, the pooled calls stay pooled
    other = PhaseTable.concat([table])
    merged = PhaseTable.concat([table, other])
    assert merged.tools["t0"].size == 4 and merged.tools[OTHER_TOOLS].size == 12
    assert len(merged.tools) == MAX_TOOLS + 1 and merged.step_key == (1, False)
    assert PhaseTable.concat([table, PhaseTable.empty()]).step_key is None  # parts disagree: unknown

    # a sample still running at collect: its calls so far go with it into the next (late) result
    with testing.capture() as cap:
        live = cap.handle.metrics

        async def run() -> None:
            with oal.step(2):
                async with oal.sample(0, 0):
                    await search(0)
                gate = asyncio.Event()

                async def late() -> None:
                    async with oal.sample(1, 0):
                        await search(1)
                        await gate.wait()
                        await python(1)

                task = asyncio.create_task(late())
                await asyncio.sleep(0.05)
                first = live.take(2)
                gate.set()
                await task
                second = live.take(2)
                assert first.tools["search"].size == 1 and "python" not in first.tools
                assert second.tools["search"].size == 1 and second.tools["python"].size == 1
                assert second.late.all() and second.start_ns[0] > 0

        asyncio.run(run())


def test_summary_writer_never_raises_and_counts_and_nothing_when_disabled(monkeypatch, tmp_path) -> None:
    with testing.capture() as cap:
        asyncio.run(_rollout(1))
        monkeypatch.setattr(StepSummary, "to_json", lambda self: 1 / 0)
        metrics = cap.handle.metrics.collect(1)  # the failure stays inside
        assert metrics["agent_loop/num_samples"] == PROMPTS
        assert cap.handle.stats["summaries_failed"] == 1 and cap.handle.stats["summaries_written"] == 0
        monkeypatch.undo()
        asyncio.run(_rollout(2))
        cap.handle.metrics.collect(2)
        assert [s.attributes[sc.RL_STEP] for s in cap.by_name(sc.STEP_SUMMARY_SPAN)] == [2]
    assert cap.handle.summaries is not None and cap.handle.summaries.closed
    off = oal.configure("off", enabled=False, file=str(tmp_path / "off.jsonl"), set_global=False)
    try:
        assert off.summaries is None and off.run_id is None
        assert oal.setup.write_step_summary(PhaseTable.empty(), off.metrics.collect(1), 1) is None
    finally:
        off.shutdown(1)
    assert not (tmp_path / "off.jsonl").exists()


RUN = textwrap.dedent("""
    import asyncio, json, sys
    import otel_agentloop as oal

    async def main():
        with oal.step(1):
            async with oal.sample(0, 0):
                await asyncio.sleep(0.001)
    handle = oal.configure("run", file=sys.argv[1], schedule_delay_s=0.05)
    asyncio.run(main())
    handle.metrics.collect(1)
    handle.shutdown(5)
    print(json.dumps([handle.settings.run_id, handle.settings.run_attempt]))
""")


def _run(path: str, env_extra: dict[str, str]) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(PYTHONPATH=ROOT, **env_extra)
    out = subprocess.run([sys.executable, "-c", RUN, path], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    run_id, attempt = json.loads(out.stdout.strip().splitlines()[-1])
    return run_id, attempt


@pytest.mark.e2e  # a subprocess
def test_two_runs_appending_to_one_file_each_carry_their_own_run_id_on_every_span(tmp_path) -> None:
    path = str(tmp_path / "shared.jsonl")
    first = _run(path, {})
    second = _run(path, {})
    resumed = _run(path, {"OTEL_AGENTLOOP_RUN_ID": first[0]})  # a resume names its run: a new attempt of it
    assert first[0] != second[0] and len({first[1], second[1], resumed[1]}) == 3
    assert resumed[0] == first[0]
    for run_id, _ in (first, second):  # readable and sortable: UTC time, then random hex
        stamp, _, suffix = run_id.partition("-")
        assert len(stamp) == 16 and stamp.endswith("Z") and len(suffix) == 6
    records = list(read_jsonl(path))
    assert len(records) == 3 * 3  # per run: the sample, its step span ... and the step's summary
    by_attempt: dict[tuple[str, str], list[str]] = {}
    for r in records:
        by_attempt.setdefault((r.resource[sc.RL_RUN_ID], r.resource[sc.RL_RUN_ATTEMPT]), []).append(r.name)
    assert sorted(by_attempt) == sorted([first, second, resumed])
    for names in by_attempt.values():
        assert sorted(names) == sorted([sc.SAMPLE_SPAN, sc.STEP_SUMMARY_SPAN, "rl.step"])


def test_run_id_argument_and_worker_env(tmp_path) -> None:
    handle = oal.configure("arg", run_id="my-run", file=str(tmp_path / "a.jsonl"), set_global=False)
    try:
        assert handle.run_id == "my-run" and handle.run_attempt
        assert handle.worker_env["OTEL_AGENTLOOP_RUN_ID"] == "my-run"
        assert handle.worker_env["OTEL_AGENTLOOP_RUN_ATTEMPT"] == handle.run_attempt
        assert handle.provider is not None
        assert handle.provider.resource.attributes[sc.RL_RUN_ID] == "my-run"
    finally:
        handle.shutdown(1)
    with pytest.raises(ValueError, match="run_id"):
        oal.configure("bad", run_id="", set_global=False)
    again = oal.configure("again", file=str(tmp_path / "b.jsonl"), set_global=False)
    try:  # no id given: the process's generated one, the same on every configure of this launch
        other = oal.configure("again2", file=str(tmp_path / "c.jsonl"), set_global=False)
        assert other.run_id == again.run_id and other.run_attempt == again.run_attempt
        other.shutdown(1)
    finally:
        again.shutdown(1)


def test_a_later_collect_of_late_samples_does_not_replace_the_steps_summary(tmp_path) -> None:
    """collect(step) while a sample runs, then again when it ended: two summaries of the step; the reader keeps the
    step's own (its samples, not only the late one), while the later one still says it holds a late sample."""
    path = tmp_path / "late.jsonl"
    handle = oal.configure("late", file=str(path), set_global=False, watchdog=False)
    try:

        async def scenario() -> None:
            release = asyncio.Event()

            async def one(i: int, wait: bool) -> None:
                async with oal.sample(i, rollout_n=0):
                    if wait:
                        await release.wait()
                    await generate(i)

            with oal.step(1):
                tasks = [asyncio.create_task(one(i, wait=i == 3)) for i in range(4)]
                await asyncio.gather(*tasks[:3])
                first = handle.metrics.collect(1)
                assert first[f"{sc.METRIC_PREFIX}/num_samples"] == 3
                release.set()
                await tasks[3]
            second = handle.metrics.collect(1)
            assert second[f"{sc.METRIC_PREFIX}/{sc.LATE_SAMPLES}"] == 1

        asyncio.run(scenario())
        assert handle.force_flush(10)
    finally:
        handle.shutdown(10)
    records = list(read_jsonl(str(path)))
    written = [
        StepSummary.from_json(r.attributes[sc.RL_STEP_SUMMARY]) for r in records if r.name == sc.STEP_SUMMARY_SPAN
    ]
    assert sorted(s.num_samples for s in written) == [1, 3]
    kept = stored_summaries(records)[(1, False)]
    assert kept.num_samples == 3 and f"{sc.METRIC_PREFIX}/{sc.LATE_SAMPLES}" not in kept.metrics


def test_summary_lists_the_slowest_samples_and_the_failed_ones_bounded() -> None:
    """What ``report --step`` prints from a summary (``top``, ``failed``) is ``PhaseTable.slowest``'s rows and the
    sorted failed keys, bounded; ``top_complete``/``failed_complete`` say when a command needs more."""
    from otel_agentloop.metrics import compute_metrics, summarize
    from otel_agentloop.metrics._summary import FAILED_STORED, TOP_STORED

    proc = PhaseMetricsProcessor()
    n = FAILED_STORED + 200
    for i in range(n):
        attrs = {sc.RL_PHASE: sc.GENERATE, sc.RL_STEP: 1, sc.RL_SAMPLE_INDEX: i, sc.RL_ROLLOUT_N: 0}
        end = 1_000 + 1_000_000 * (1 + (i * 7919) % n)
        proc.ingest("chat m", attrs, 1_000, end, (i + 1) << 64 | 9, False)
        ids = {k: attrs[k] for k in (sc.RL_STEP, sc.RL_SAMPLE_INDEX, sc.RL_ROLLOUT_N)}
        proc.ingest(sc.SAMPLE_SPAN, ids, 1_000, end, (i + 1) << 64 | 9, i % 10 != 0)  # every 10th one fails
    table = proc.take(1)
    metrics = compute_metrics(table)
    summary = StepSummary.from_json(summarize(table, metrics, 1).to_json())
    rows = table.slowest(TOP_STORED)
    assert [(s.index, s.rollout, s.trace_id, s.generate_s, s.verdict == "failed") for s in summary.top] == [
        (r["sample_index"], r["rollout_n"], r["trace_id"], r[sc.GENERATE], r["error"]) for r in rows
    ]
    assert summary.top[0] == summary.slowest
    failed = sorted((i, 0) for i in range(n) if i % 10 != 0)
    assert summary.counts["failed"] == len(failed) > FAILED_STORED
    assert list(summary.failed) == failed[:FAILED_STORED] and not summary.failed_complete
    assert summary.top_complete(TOP_STORED) and not summary.top_complete(TOP_STORED + 1)
    few = summarize(proc.take(2), compute_metrics(PhaseTable.empty()), 2)  # no samples: nothing is missing
    assert few.top == () and few.failed == () and few.top_complete(100) and few.failed_complete
