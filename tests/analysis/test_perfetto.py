"""``report --step N --perfetto step.json``: the step in Chrome Trace Event Format, checked against the
format's specification (``tests/_support/trace_event_format.py``: no consumer of the format runs offline
here, see its docstring).

Inputs are real spans: the ``simulate --misbehave`` demo writing a trace file (a hung and a slow sample reported
by the watchdog), and a step run in-process with the library where every sample makes parallel tool calls, a
user's own span sits inside a tool call, and one sample hangs (its span never ends; the watchdog's snapshot is
all that says so).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop import testing
from otel_agentloop.analysis import read_jsonl
from otel_agentloop.analysis._rendering._perfetto import step_trace
from otel_agentloop.core._context import SampleHandle
from otel_agentloop.demo._agent import SimConfig, generate
from otel_agentloop.health import OverdueSample
from otel_agentloop.metrics import SpanRecord, StepSummary
from otel_agentloop.metrics._summary import FAILED, HUNG, OK, SLOW
from tests._support.trace_event_format import Slice, Trace, TraceFormatError, parse

SIM = ["--steps", "3", "--misbehave", "--time-scale", "0.1", "--val-every", "0", "--prompts", "3", "--rollout-n", "2"]


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-m", "otel_agentloop", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240
    )


def _ids(rec: SpanRecord) -> tuple[str, str]:
    return (rec.trace_id_hex, format(rec.span_id, "016x"))


def _step_records(records: list[SpanRecord], step: int) -> list[SpanRecord]:
    return [r for r in records if r.attributes.get(sc.RL_STEP) == step and r.name != sc.STEP_SUMMARY_SPAN]


def _span_events(t: Trace) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in t.events:
        args = e.get("args") or {}
        if e["ph"] != "M" and "span_id" in args:
            out.setdefault((args["trace_id"], args["span_id"]), []).append(e)
    return out


def _sample_tracks(t: Trace) -> dict[str, list[tuple[int, int]]]:
    """'I/R' -> the sample's tracks (its own first, then its lanes), from the thread names."""
    tracks: dict[str, list[tuple[int, int]]] = {}
    for track, name in sorted(t.thread_names.items(), key=lambda kv: t.thread_sort[kv[0]]):
        if name.startswith("sample "):
            tracks.setdefault(name.split()[1], []).append(track)
    return tracks


def _check_nesting(t: Trace) -> int:
    """Every complete event's enclosing event on its track is its parent span's event; an event whose parent
    span is elsewhere (a lane, or not in the file) is at the top of its track, a lane holds only events of its
    own sample, and a sample's own slice tops its track (its parent, the step's span, elsewhere). Returns the
    number of events that sit on a lane."""
    where: dict[str, tuple[int, int]] = {}
    slices: dict[str, Slice] = {}
    for track, items in t.tracks.items():
        for s in items:
            if s.event["ph"] == "X":
                where[s.args["span_id"]] = track
                slices[s.args["span_id"]] = s
    owner = {track: sample for sample, tracks in _sample_tracks(t).items() for track in tracks}
    on_lanes = 0
    for span_id, s in slices.items():
        parent_id = s.args.get("parent_span_id")
        if s.parent is not None:
            # the parent span's event, or the snapshot standing in for a sample span that never ended
            enclosing = s.parent.args.get("open_sample_span_id", s.parent.args["span_id"])
            assert parent_id in (enclosing, s.parent.args["span_id"]), (s.event, s.parent.event)
        elif parent_id in where:
            parent_track, track = where[parent_id], where[span_id]
            assert parent_track != track, s.event  # a parent on the same track would enclose it
            if "verdict" in s.args:  # a sample's own slice: the top of its track; its parent is the step's
                assert track == _sample_tracks(t)[s.args["sample"]][0], s.event
                continue
            assert owner.get(track) == owner.get(parent_track), s.event  # a lane of the same sample
            lanes = _sample_tracks(t).get(owner[track], []) if track in owner else []
            assert track in lanes[1:] or track not in owner, s.event
            on_lanes += 1
    return on_lanes


# -- the misbehave demo, end to end through the CLI -----------------------------------------------------
@pytest.fixture(scope="module")
def misbehave(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]], Trace]:
    cwd = tmp_path_factory.mktemp("misbehave")
    sim = _cli(cwd, "simulate", *SIM, "--json", "--quiet", "--file", "run.jsonl")
    assert sim.returncode == 0, sim.stderr
    out = _cli(cwd, "report", "--file", "run.jsonl", "--step", "3", "--perfetto", "step3.json")
    assert out.returncode == 0, out.stderr
    assert "Perfetto trace written to step3.json" in out.stdout
    return cwd, json.loads(sim.stdout), parse((cwd / "step3.json").read_text(encoding="utf-8"))


@pytest.mark.e2e  # a subprocess
def test_misbehave_step_has_one_event_per_span_and_one_track_per_sample(misbehave) -> None:
    cwd, _, t = misbehave
    records = list(read_jsonl(str(cwd / "run.jsonl")))
    step = _step_records(records, 3)
    events = _span_events(t)
    assert set(events) == {_ids(r) for r in step} and all(len(v) == 1 for v in events.values())
    assert len(step) > 30
    samples = {
        f"{r.attributes[sc.RL_SAMPLE_INDEX]}/{r.attributes[sc.RL_ROLLOUT_N]}" for r in step if r.name == sc.SAMPLE_SPAN
    }
    tracks = _sample_tracks(t)
    assert set(tracks) == samples and len(samples) == 6
    for sample, (main, *lanes) in tracks.items():
        assert t.thread_names[main].startswith(f"sample {sample}")
        assert [t.thread_names[lane] for lane in lanes] == [
            f"{t.thread_names[main]} (lane {k})" for k in range(1, len(lanes) + 1)
        ]
    # sample order: the tracks sort as the samples do, and each sample's lanes follow it
    order = [t.thread_names[tr].split()[1] for tr in sorted(t.thread_sort, key=t.thread_sort.__getitem__)]
    firsts = [s for i, s in enumerate(order) if s in samples and s not in order[:i]]
    assert firsts == sorted(samples, key=lambda s: tuple(int(x) for x in s.split("/")))
    # one process, the in-process workers' (the demo's trainer runs in it too), named after it
    worker = step[0].resource["host.name"]
    assert len(t.process_names) == 1 and next(iter(t.process_names.values())).startswith(f"worker {worker}:")
    # times: integer microseconds since the step's first start, exactly the spans' times
    t0 = t.other["t0_unix_ns"]
    assert t0 == min(r.start_ns for r in step) and t.display_time_unit == "ms"
    for r in step:
        (e,) = events[_ids(r)]
        if e["ph"] == "X":
            skew = e["args"].get("skew_us", [0, 0])  # a child sticking out of its parent by < 1 ms is moved in
            assert max(map(abs, skew)) <= 1000
            assert (e["ts"] + skew[0], e["ts"] + e["dur"] + skew[1]) == (
                (r.start_ns - t0) // 1000,
                (r.end_ns - t0) // 1000,
            )
    _check_nesting(t)


@pytest.mark.e2e  # a subprocess
def test_misbehave_hung_and_slow_samples_are_flagged_as_the_live_view_classified_them(misbehave) -> None:
    _, sim, t = misbehave
    (hung_trace,), slow_traces = sim[2]["hung_trace_ids"], sim[2]["slow_trace_ids"]
    samples = {
        e["args"]["sample"]: e
        for e in t.events
        if e["ph"] == "X" and e.get("cat") == "sample" and "sample" in e["args"]
    }
    assert len(samples) == 6
    verdicts = {s: e["args"]["verdict"] for s, e in samples.items()}
    # 0/0 hung and 1/0 slow by design, the others ok; under load another sample's tool call can truly pass the
    # threshold too: it is then slow here as the live view classified it
    slow = sorted(s for s, v in verdicts.items() if v == SLOW)
    assert verdicts["0/0"] == HUNG and "1/0" in slow and len(slow) == len(slow_traces), (verdicts, slow_traces)
    assert all(v == OK for s, v in verdicts.items() if s != "0/0" and s not in slow), verdicts
    assert samples["0/0"]["args"]["trace_id"] == hung_trace
    assert {samples[s]["args"]["trace_id"] for s in slow} == set(slow_traces)
    assert samples["0/0"]["name"] == "rl.sample [HUNG]" and samples["1/0"]["name"] == "rl.sample [SLOW]"
    tracks = _sample_tracks(t)
    assert t.thread_names[tracks["0/0"][0]] == "sample 0/0 [hung]"
    assert t.thread_names[tracks["1/0"][0]] == "sample 1/0 [slow]"
    # the watchdog's snapshot: an instant on the sample's track, inside the sandbox call it was stuck in
    for sample, word in (("0/0", "hung"), ("1/0", "slow")):
        (instant,) = [s for s in t.tracks[tracks[sample][0]] if s.event["ph"] == "i"]
        assert instant.event["name"] == f"watchdog: {word} in tool_calls (sandbox)"
        assert instant.event["args"]["verdict"] == word and instant.event["args"]["trace_id"] in (
            hung_trace,
            *slow_traces,
        )
        assert instant.parent is not None and instant.parent.event["name"] == "execute_tool sandbox"
    assert t.other["hung"] == ["0/0"] and sorted(t.other["slow"]) == slow
    assert t.other["verdicts"] == {HUNG: 1, OK: 5 - len(slow), SLOW: len(slow)}


@pytest.mark.e2e  # a subprocess
@pytest.mark.parametrize("validate", [False, True])
def test_one_trace_per_step_and_the_validation_pass(tmp_path, validate: bool) -> None:
    """``--trace-per step`` (samples under the step's span in one trace) and ``--validate`` (the validation
    pass of a step): the step's own spans, one event each, a track per sample."""
    args = ["--steps", "2", "--time-scale", "0.05", "--val-every", "2", "--prompts", "3", "--rollout-n", "2"]
    sim = _cli(tmp_path, "simulate", *args, "--quiet", "--trace-per", "step", "--file", "run.jsonl")
    assert sim.returncode == 0, sim.stderr
    flag = ["--validate"] if validate else []
    out = _cli(tmp_path, "report", "--file", "run.jsonl", "--step", "2", *flag, "--perfetto", "step.json")
    assert out.returncode == 0, out.stderr
    t = parse((tmp_path / "step.json").read_text(encoding="utf-8"))
    step = [
        r
        for r in _step_records(list(read_jsonl(str(tmp_path / "run.jsonl"))), 2)
        if bool(r.attributes.get(sc.RL_VALIDATE, False)) == validate
    ]
    assert len({r.trace_id for r in step if r.name == sc.SAMPLE_SPAN}) == 1  # one trace for the step's samples
    events = _span_events(t)
    assert set(events) == {_ids(r) for r in step} and all(len(v) == 1 for v in events.values())
    assert len(_sample_tracks(t)) == 6 and t.other["validate"] is validate
    _check_nesting(t)


@pytest.mark.e2e  # a local Ray cluster, the demo in a subprocess
def test_on_ray_workers_each_worker_is_a_process_holding_its_samples(tmp_path) -> None:
    """The demo on 2 Ray actor workers (a local Ray cluster): a process per worker, each sample's track in the
    process of the worker that ran it, the driver's trainer spans in a process of their own, first."""
    pytest.importorskip("ray") if not os.environ.get("CI") else None
    sim = _cli(tmp_path, "simulate", *SIM, "--workers", "2", "--quiet", "--file", "run.jsonl")
    assert sim.returncode == 0, sim.stderr
    out = _cli(tmp_path, "report", "--file", "run.jsonl", "--step", "3", "--perfetto", "step3.json")
    assert out.returncode == 0, out.stderr
    t = parse((tmp_path / "step3.json").read_text(encoding="utf-8"))
    records = _step_records(list(read_jsonl(str(tmp_path / "run.jsonl"))), 3)
    workers = {r.attributes[sc.RL_WORKER] for r in records if r.name == sc.SAMPLE_SPAN}
    assert len(workers) == 2
    names = t.process_names
    assert sorted(n for n in names.values() if n.startswith("worker ")) == sorted(f"worker {w}" for w in workers)
    driver = min(names, key=t.process_sort.__getitem__)  # the trainer's process first, without samples
    assert not names[driver].startswith("worker ")
    assert {s.event["name"] for s in next(iter(v for k, v in t.tracks.items() if k[0] == driver))} >= {sc.STEP_SPAN}
    for r in records:
        if r.name == sc.SAMPLE_SPAN:
            sample = f"{r.attributes[sc.RL_SAMPLE_INDEX]}/{r.attributes[sc.RL_ROLLOUT_N]}"
            (pid, _), *_ = _sample_tracks(t)[sample]
            assert names[pid] == f"worker {r.attributes[sc.RL_WORKER]}"
    # 1/0 slow by design; on loaded workers another sample's tool call can truly pass the threshold too
    assert t.other["hung"] == ["0/0"] and "1/0" in t.other["slow"] and "0/0" not in t.other["slow"]
    assert len(_span_events(t)) == len(records)
    _check_nesting(t)


# -- a step made with the library: parallel tool calls, a user's span, a sample that never ends ---------------
@oal.trace_tool("search")
async def _search(delay_s: float, tracer: trace.Tracer) -> str:
    with tracer.start_as_current_span("http GET /search"):  # the user's own span: no rl.* attributes
        await asyncio.sleep(delay_s)
    return "found"


@oal.trace_tool("python")
async def _python(delay_s: float) -> str:
    await asyncio.sleep(delay_s)
    return "ran"


@oal.trace_tool("calculator")
async def _calculator(delay_s: float) -> str:
    await asyncio.sleep(delay_s)
    return "42"


@oal.trace_reward
async def _reward() -> float:
    await asyncio.sleep(0.002)
    return 1.0


@oal.trace_tool("search")
async def _stuck(release: asyncio.Event) -> str:
    await release.wait()
    return "never"


def _snapshot(tracer: trace.Tracer, handle: SampleHandle, phase: str, tool: str) -> None:
    """What the watchdog exports for a still-open sample."""
    attrs = dict(handle.phase_attributes)
    attrs.update({sc.RL_PHASE: phase, sc.RL_SNAPSHOT: True, sc.GEN_AI_TOOL_NAME: tool})
    root = handle.span
    tracer.start_span(
        sc.SAMPLE_SPAN + sc.SNAPSHOT_SUFFIX,
        context=trace.set_span_in_context(root),
        attributes=attrs,
        start_time=root.start_time,  # type: ignore[union-attr]
    ).end()


async def _library_step(handle: oal.Handle, step: int) -> None:
    tracer = handle.provider.get_tracer("otel_agentloop.test.perfetto")  # type: ignore[union-attr]
    cfg = SimConfig(time_scale=0.1, seed=5)
    release = asyncio.Event()
    open_samples: dict[str, SampleHandle] = {}

    async def one(index: int, rollout: int) -> None:
        rng = random.Random(index * 7 + rollout)
        async with oal.sample(index, rollout):
            await generate(rng, cfg, 50)
            # three calls at once: search is the longest, the others start and end inside it
            await asyncio.gather(_search(0.08, tracer), _python(0.02), _calculator(0.03))
            await generate(rng, cfg, 80)
            await generate(rng, cfg, 90)
            await _reward()

    async def hung() -> None:
        async with oal.sample(9, 0) as h:
            open_samples["hung"] = h
            await generate(random.Random(1), cfg, 50)
            await _stuck(release)

    with oal.step(step), oal.trainer_phase("gen"):
        hung_task = asyncio.ensure_future(hung())
        await asyncio.gather(*(one(i, n) for i in range(3) for n in range(2)))
        await asyncio.sleep(0.05)
        _snapshot(tracer, open_samples["hung"], sc.TOOL_CALLS, "search")
    assert handle.force_flush(10)
    handle.shutdown(10)  # the hung sample's span is never exported
    hung_task.cancel()
    await asyncio.gather(hung_task, return_exceptions=True)


@pytest.fixture(scope="module")
def library_step(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[SpanRecord], Trace]:
    cwd = tmp_path_factory.mktemp("library")
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.startswith("OTEL_")]:
            mp.delenv(key)
        handle = oal.configure("perfetto-job", file=str(cwd / "job.jsonl"), set_global=False, schedule_delay_s=0.05)
        try:
            asyncio.run(_library_step(handle, 4))
        finally:
            handle.shutdown(5)
            testing.reset()
    records = list(read_jsonl(str(cwd / "job.jsonl")))
    out = _cli(cwd, "report", "--file", "job.jsonl", "--step", "4", "--perfetto", "step4.json")
    assert out.returncode == 0, out.stderr
    return records, parse((cwd / "step4.json").read_text(encoding="utf-8"))


@pytest.mark.e2e  # a subprocess
def test_parallel_tool_calls_go_to_lanes_named_after_their_sample(library_step) -> None:
    _, t = library_step
    tracks = _sample_tracks(t)
    assert set(tracks) == {f"{i}/{n}" for i in range(3) for n in range(2)} | {"9/0"}
    for i in range(3):
        for n in range(2):
            main, *lanes = tracks[f"{i}/{n}"]
            assert len(lanes) == 2, t.thread_names[main]  # three overlapping calls: one on the sample's track
            on_main = [s.event["name"] for s in t.tracks[main]]
            assert on_main.count("text_completion sim-7b") == 3 and "rl.reward" in on_main
            tools = [s for lane in (main, *lanes) for s in t.tracks[lane] if s.event.get("cat") == sc.TOOL_CALLS]
            assert sorted(s.event["name"] for s in tools) == [
                "execute_tool calculator",
                "execute_tool python",
                "execute_tool search",
            ]
            # search (the longest, first to start) nests in the sample span; the others are on top of a lane each
            for s in tools:
                assert (s.depth, s.parent is not None) == (
                    (1, True) if s.event["name"].endswith("search") else (0, False)
                )
    assert _check_nesting(t) == 12  # two calls per sample on lanes


@pytest.mark.e2e  # a subprocess
def test_a_users_own_span_nests_under_its_tool_call(library_step) -> None:
    records, t = library_step
    user = [r for r in records if r.name == "http GET /search"]
    assert len(user) == 6 and all(sc.RL_STEP not in r.attributes for r in user)  # no rl.* on the user's span
    events = _span_events(t)
    slices = {s.args["span_id"]: s for items in t.tracks.values() for s in items if s.event["ph"] == "X"}
    for r in user:
        (e,) = events[_ids(r)]
        parent = slices[e["args"]["span_id"]].parent
        assert parent is not None and parent.event["name"] == "execute_tool search"
    # and every span of the step is one event, the user's included
    step_ids = {_ids(r) for r in _step_records(records, 4)} | {_ids(r) for r in user}
    assert set(events) == step_ids and all(len(v) == 1 for v in events.values())


@pytest.mark.e2e  # a subprocess
def test_a_sample_that_never_ended_is_drawn_by_its_snapshot_and_flagged_hung(library_step) -> None:
    records, t = library_step
    assert not [r for r in records if r.name == sc.SAMPLE_SPAN and r.attributes[sc.RL_SAMPLE_INDEX] == 9]
    (main,) = _sample_tracks(t)["9/0"]
    assert t.thread_names[main] == "sample 9/0 [hung]"
    top, *inside = t.tracks[main]
    assert top.event["name"] == "rl.sample (in progress) [HUNG]" and top.event["args"]["verdict"] == HUNG
    assert top.event["args"]["attributes"][sc.RL_SNAPSHOT] is True
    # its generation turn (finished) nests in it; the stuck search call never ended, so it is not there
    assert [(s.event["name"], s.parent) for s in inside] == [("text_completion sim-7b", top)]
    assert t.other["hung"] == ["9/0"] and t.other["slow"] == []


@pytest.mark.e2e  # a subprocess
def test_trainer_spans_get_their_own_track_above_the_samples(library_step) -> None:
    _, t = library_step
    assert len(t.process_names) == 1
    first = min(t.thread_sort, key=t.thread_sort.__getitem__)
    assert t.thread_names[first] == "step (spans outside samples)"
    names = {s.event["name"] for s in t.tracks[first]}
    assert {"rl.train.gen", "rl.step"} <= names, names


# -- untrusted and adversarial input ---------------------------------------------------------------------
def _rec(span_id: int, parent: int, name: str, start_ms: float, end_ms: float, **attrs: Any) -> SpanRecord:
    base = 1_700_000_000_000_000_000
    attrs.setdefault(sc.RL_STEP, 1)
    return SpanRecord(
        trace_id=0xABC,
        span_id=span_id,
        parent_id=parent,
        name=name,
        start_ns=base + int(start_ms * 1e6),
        end_ns=base + int(end_ms * 1e6),
        attributes=attrs,
        resource={"host.name": "node-a", "process.pid": 7},
    )


def _sample_attrs(index: int) -> dict[str, Any]:
    return {sc.RL_SAMPLE_INDEX: index, sc.RL_ROLLOUT_N: 0}


def test_skewed_children_cycles_and_odd_values_still_give_a_valid_trace() -> None:
    records = [
        _rec(1, 0, sc.SAMPLE_SPAN, 0, 100, **_sample_attrs(0)),
        # a call on another host whose clock runs ahead: it ends after its sample span
        _rec(2, 1, "execute_tool remote", 90, 130, **_sample_attrs(0), **{sc.RL_PHASE: sc.TOOL_CALLS}),
        _rec(3, 2, "inner", 95, 120),  # its child, no rl.* attributes: follows it
        # two spans whose parents point at each other (malformed input)
        _rec(4, 5, "loop a", 10, 20, **_sample_attrs(0)),
        _rec(5, 4, "loop b", 12, 18, **_sample_attrs(0)),
        # values JSON cannot hold as they are
        _rec(
            6, 1, "odd", 30, 40, **_sample_attrs(0), nan=float("nan"), raw=b"\x00\xff", deep=(("a",),), long="x" * 5000
        ),
        _rec(7, 0, "other step", 0, 1, **{sc.RL_STEP: 2}),
    ]
    t = parse(json.dumps(step_trace(records, 1), allow_nan=False))
    events = _span_events(t)
    assert {int(k[1], 16) for k in events} == {1, 2, 3, 4, 5, 6} and all(len(v) == 1 for v in events.values())
    _, *lanes = _sample_tracks(t)["0/0"]
    remote = next(s for s in t.tracks[lanes[0]] if s.event["name"] == "execute_tool remote")
    assert remote.parent is None and [s.parent for s in t.tracks[lanes[0]] if s.event["name"] == "inner"] == [remote]
    odd = events[("00000000000000000000000000000abc", format(6, "016x"))][0]["args"]["attributes"]
    assert odd["nan"] == "nan" and odd["raw"] == "00ff" and odd["deep"] == [["a"]] and len(odd["long"]) == 1001


def test_a_stored_step_summary_decides_hung_and_slow() -> None:
    """With the live side's ``rl.step.summary`` record for the step, its hung/slow lists (made at collect)
    decide, as in ``report``; without it, the snapshot rule (a cancelled or missing sample span is hung)."""
    snap = {sc.RL_SNAPSHOT: True, sc.RL_PHASE: sc.TOOL_CALLS}
    records = [
        _rec(1, 0, sc.SAMPLE_SPAN, 0, 100, **_sample_attrs(0), **{sc.RL_CANCELLED: True}),
        _rec(2, 1, sc.SAMPLE_SPAN + sc.SNAPSHOT_SUFFIX, 0, 50, **_sample_attrs(0), **snap),
        _rec(3, 0, sc.SAMPLE_SPAN, 0, 80, **_sample_attrs(1)),
        _rec(4, 3, sc.SAMPLE_SPAN + sc.SNAPSHOT_SUFFIX, 0, 40, **_sample_attrs(1), **snap),
        _rec(5, 0, sc.SAMPLE_SPAN, 0, 60, **_sample_attrs(2)),
    ]
    records[4].error = True

    def verdicts(recs: list[SpanRecord]) -> dict[str, str]:
        t = parse(json.dumps(step_trace(recs, 1)))
        return {
            e["args"]["sample"]: e["args"]["verdict"]
            for e in t.events
            if e["ph"] == "X" and e.get("cat") == "sample" and "verdict" in e.get("args", {})
        }

    assert verdicts(records) == {"0/0": HUNG, "1/0": SLOW, "2/0": FAILED}
    summary = StepSummary(
        step=1,
        validate=False,
        num_samples=3,
        metrics={},
        phases={},
        tools={},
        counts={"ok": 1, "failed": 1, "slow": 1, "hung": 1},
        hung=(OverdueSample(1, 0, "x" * 32, sc.TOOL_CALLS, None),),
        slow=(OverdueSample(0, 0, "y" * 32, sc.TOOL_CALLS, None),),
    )
    stored = _rec(9, 0, sc.STEP_SUMMARY_SPAN, 200, 200, **{sc.RL_STEP_SUMMARY: summary.to_json()})
    assert verdicts([*records, stored]) == {"0/0": SLOW, "1/0": HUNG, "2/0": FAILED}
    assert "0000000000000009" not in {
        e.get("args", {}).get("span_id") for e in step_trace([*records, stored], 1)["traceEvents"]
    }


@pytest.mark.e2e  # a subprocess
def test_the_same_spans_in_any_order_give_the_same_file(library_step, tmp_path) -> None:
    records, _ = library_step
    shuffled = list(records)
    random.Random(0).shuffle(shuffled)
    first = json.dumps(step_trace(records, 4), sort_keys=True)
    assert first == json.dumps(step_trace(shuffled, 4), sort_keys=True)
    assert step_trace(records, 99)["traceEvents"] == []  # a step without spans: a valid, empty trace


# -- the checker itself fails on what it must reject --------------------------------------------------------
def _meta(pid: int, tid: int) -> list[dict[str, Any]]:
    return [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "p"}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": "t"}},
    ]


@pytest.mark.parametrize(
    ("events", "why"),
    [
        (
            [
                {"name": "a", "ph": "X", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
                {"name": "b", "ph": "X", "ts": 5, "dur": 10, "pid": 1, "tid": 1},
            ],
            "partially overlaps",
        ),
        ([{"name": "a", "ph": "X", "ts": 0, "pid": 1, "tid": 1}], "without a finite dur"),
        ([{"name": "a", "ph": "X", "ts": -1, "dur": 1, "pid": 1, "tid": 1}], "ts is not"),
        ([{"name": "a", "ph": "i", "ts": 0, "s": "x", "pid": 1, "tid": 1}], "scope"),
        ([{"name": "a", "ph": "X", "ts": 0, "dur": 1, "pid": 2, "tid": 1}], "used by pid"),
        ([{"name": "a", "ph": "X", "ts": 0, "dur": 1, "pid": 1, "tid": 2}], "no thread_name"),
        ([{"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": 1, "args": {"sort_index": "1"}}], "metadata"),
        ([{"name": "a", "ph": "Q", "ts": 0, "pid": 1, "tid": 1}], "phase"),
        (
            [
                {"name": "process_name", "ph": "M", "pid": 2, "tid": 3, "args": {"name": "q"}},
                {"name": "thread_name", "ph": "M", "pid": 1, "tid": 2, "args": {"name": "t2"}},
                {"name": "a", "ph": "X", "ts": 0, "dur": 1, "pid": 1, "tid": 2},
            ],
            "also a pid",
        ),
    ],
)
def test_the_format_checker_rejects(events: list[dict[str, Any]], why: str) -> None:
    with pytest.raises(TraceFormatError, match=why):
        parse(json.dumps({"traceEvents": [*_meta(1, 1), *events]}))


def test_the_format_checker_rejects_non_json_numbers_and_units() -> None:
    with pytest.raises(TraceFormatError, match="not JSON"):
        parse('{"traceEvents": [{"name": "a", "ph": "X", "ts": NaN, "dur": 1, "pid": 1, "tid": 1}]}')
    with pytest.raises(TraceFormatError, match="displayTimeUnit"):
        parse(json.dumps({"traceEvents": [], "displayTimeUnit": "us"}))
    # and nests what touches: b and c (c starts where b ends) are both inside a
    nested = [
        {"name": "a", "ph": "X", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
        {"name": "b", "ph": "X", "ts": 2, "dur": 3, "pid": 1, "tid": 1},
        {"name": "c", "ph": "X", "ts": 5, "dur": 5, "pid": 1, "tid": 1},
    ]
    track = parse(json.dumps({"traceEvents": [*_meta(1, 1), *nested]})).tracks[(1, 1)]
    assert Counter(s.depth for s in track) == {0: 1, 1: 2}
