"""The run-scale trace file (issue 29): a directory rolled per step, with an index, read at the cost of one step.

Real spans: the simulated main job (``simulate --workers 0``, on the fast path and with ``fast_path=False``)
writing the default layout, a resumed attempt appending to it, and small drivers through the public API. The CLI
runs as a subprocess. "Reads only what it needs" is proved by making every other file unreadable (replaced by a
folder: ``open`` fails even as root) and reading on.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.analysis import Skipped, decode_resource_spans, read_jsonl, read_traces
from tests._support.fork import fork_and_trace
from tests._support.runs import RUN, TRACES, assert_same_metrics, cli, report_file, simulate_run, traced_generate

STEP_FILES = {"step-00000001.jsonl", "step-00000002.jsonl", "step-00000003.jsonl", "val-00000002.jsonl"}


@pytest.fixture(scope="module", params=[True, False], ids=["fast-path", "sdk-path"])
def resumed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, bool]:
    """Attempt 1 of run ``scale``, then attempt 2 (a resume re-running steps 1-3), into one directory."""
    cwd = tmp_path_factory.mktemp("scale")
    simulate_run(cwd, seed=1, attempt=1, fast_path=request.param)
    second = simulate_run(cwd, seed=2, attempt=2, fast_path=request.param)
    return cwd, second, request.param


def _index(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "index.jsonl").read_text().splitlines()]


def _decode_every_line(path: Path) -> int:
    """Each line of a segment is one OTLP-JSON request the reader decodes without a skip; returns the spans."""
    count = 0
    for line in path.read_text().splitlines():
        obj = json.loads(line)
        assert list(obj) == ["resourceSpans"]
        skipped = Skipped()
        count += len(list(decode_resource_spans(obj["resourceSpans"], skipped)))
        assert skipped.count == 0, skipped.first
    return count


@pytest.mark.e2e  # a subprocess
def test_layout_and_index_after_a_run_and_its_resume(resumed) -> None:
    cwd, _, _ = resumed
    folder = cwd / TRACES
    run_dir = "run-" + hashlib.sha256(f"id:{RUN}".encode()).hexdigest()[:16]
    assert sorted(p.name for p in folder.iterdir()) == ["index.jsonl", run_dir, "summaries.jsonl"]
    files = {p.name for p in (folder / run_dir).iterdir()}
    assert files >= STEP_FILES and all(f.startswith("other-") for f in files - STEP_FILES)
    index = _index(folder)
    # one line per process and segment it wrote: both attempts wrote every step file, each its own line
    for name in STEP_FILES:
        lines = [e for e in index if e["segment"] == f"{run_dir}/{name}"]
        assert sorted(e["attempt"] for e in lines) == ["1", "2"], lines
        assert len({e["pid"] for e in lines}) == 2
    for e in index:
        assert e["v"] == 1 and e["run"] == RUN and e["service"] == "otel-agentloop-sim"
        assert isinstance(e["opened_ns"], int) and e["opened_ns"] > 0
        assert ("until_ns" in e) == (e["step"] is None)
        if e["step"] is not None:
            assert e["segment"].endswith(f"-{e['step']:08d}.jsonl")
            assert e["segment"].split("/")[1].startswith("val-" if e["validate"] else "step-")
    # every segment is OTLP-JSON lines; every span sits where the spec puts it
    total = 0
    for path in [*sorted(folder.glob("*/*.jsonl")), folder / "summaries.jsonl"]:
        total += _decode_every_line(path)
        for rec in read_jsonl(str(path)):
            step, validate = sc.step_key(rec.attributes)
            if path.name == "summaries.jsonl":
                assert rec.name == sc.STEP_SUMMARY_SPAN
            elif path.name.startswith(("step-", "val-")):
                assert rec.name != sc.STEP_SUMMARY_SPAN
                assert (step, validate) == (int(path.stem[-8:]), path.name.startswith("val-")) or step is None
            else:
                assert step is None
    assert total == len(list(read_traces(str(folder))))
    summaries = list(read_jsonl(str(folder / "summaries.jsonl")))
    assert sorted({(r.attributes[sc.RL_STEP], r.attributes[sc.RL_VALIDATE]) for r in summaries}) == [
        (1, False),
        (2, False),
        (2, True),
        (3, False),
    ]


@pytest.mark.e2e  # a subprocess
def test_a_step_reads_from_the_latest_attempt_and_the_default_is_the_latest_step(resumed) -> None:
    cwd, second, _ = resumed
    for args in (("--step", "3"), ()):
        rc, out, err = report_file(cwd, "--json", *args)
        assert rc == 0, err
        got = json.loads(out)
        assert got["step"] == 3
        assert_same_metrics(got["metrics"], second[(3, False)])
        assert "latest attempt (2)" in err
    rc, out, err = report_file(cwd, "--json", "--step", "2", "--validate")
    assert rc == 0, err
    assert json.loads(out)["metrics"]["agent_loop/num_samples"] == 6  # 3 prompts x 2 rollouts


@pytest.mark.e2e  # a subprocess
def test_compare_reads_two_steps(resumed) -> None:
    cwd, second, _ = resumed
    rc, out, err = report_file(cwd, "--compare", "1", "3", "--json")
    assert rc == 0, err
    got = json.loads(out)
    assert got["a"]["step"] == 1 and got["b"]["step"] == 3, list(got)
    assert got["b"]["num_samples"] == second[(3, False)]["agent_loop/num_samples"]


def _blocked(path: Path) -> None:
    """``path`` replaced by a folder of the same name: any ``open`` of it fails (even as root)."""
    path.unlink()
    path.mkdir()


@pytest.mark.e2e  # a subprocess
def test_one_step_reads_only_its_file_and_another_steps_problem_is_one_line(resumed, tmp_path) -> None:
    cwd, second, _ = resumed
    shutil.copytree(cwd / TRACES, tmp_path / TRACES)
    folder = tmp_path / TRACES
    (run_dir,) = [p for p in folder.iterdir() if p.is_dir()]
    for name in STEP_FILES - {"step-00000001.jsonl"}:
        _blocked(run_dir / name)
    rc, out, err = report_file(tmp_path, "--step", "1", "--json")
    assert rc == 0, err
    assert_same_metrics(json.loads(out)["metrics"], second[(1, False)])
    rc, out, err = report_file(tmp_path, "--step", "2")
    assert rc == 1 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("report: cannot read ") and "step-00000002.jsonl" in line, line


@pytest.mark.e2e  # a subprocess
def test_run_and_runs_read_only_the_index_and_the_summaries(resumed, tmp_path) -> None:
    cwd, second, _ = resumed
    shutil.copytree(cwd / TRACES, tmp_path / TRACES)
    folder = tmp_path / TRACES
    for path in folder.glob("*/*.jsonl"):
        _blocked(path)
    # a third attempt that has opened step 2's file but collected nothing yet: the index knows it, no summary does
    last = max(_index(folder), key=lambda e: e["opened_ns"])
    with (folder / "index.jsonl").open("a") as f:
        f.write(json.dumps({**last, "attempt": "3", "opened_ns": last["opened_ns"] + 1, "pid": 1}) + "\n")
    rc, out, err = report_file(tmp_path, "--runs")
    assert rc == 0, err
    (row,) = [line for line in out.splitlines() if line.startswith("* ")]
    assert RUN in row and " 1..3 (3) " in row and " 1,2,3 " in row, out
    rc, out, err = report_file(tmp_path, "--run", "--json")
    assert rc == 0, err
    body = json.loads(out)
    assert body["attempts"] == ["1", "2", "3"]
    steps = {(s["step"], s["validate"]): s for s in body["steps"]}
    assert sorted(steps) == [(1, False), (2, False), (2, True), (3, False)]
    for key, metrics in second.items():
        assert steps[key]["n"] == metrics["agent_loop/num_samples"]


@pytest.mark.e2e  # a subprocess
def test_a_corrupt_index_line_and_a_missing_segment_are_one_note_each(resumed, tmp_path) -> None:
    cwd, second, _ = resumed
    shutil.copytree(cwd / TRACES, tmp_path / TRACES)
    folder = tmp_path / TRACES
    (run_dir,) = [p for p in folder.iterdir() if p.is_dir()]
    first = _index(folder)[0]
    gone = {**first, "segment": f"{run_dir.name}/other-1-{first['opened_ns']}.jsonl", "step": None}
    gone["until_ns"] = first["opened_ns"] + 60 * 10**9
    with (folder / "index.jsonl").open("a") as f:
        f.write('{"v": 1, "segment": \n')  # a line cut by a crash
        f.write(json.dumps(gone) + "\n")  # a segment deleted since
    rc, out, err = report_file(tmp_path, "--step", "3", "--json")
    assert rc == 0, err
    assert_same_metrics(json.loads(out)["metrics"], second[(3, False)])
    notes = err.strip().splitlines()
    assert any("skipped 1 malformed index line" in n and "index.jsonl line" in n for n in notes), notes
    assert any(gone["segment"] in n and "No such file" in n for n in notes), notes
    (run_dir / "step-00000003.jsonl").unlink()  # the asked step's file deleted: a note, then what there is
    rc, out, err = report_file(tmp_path, "--step", "3")
    assert rc == 1
    assert "no samples for step 3" in err and "found steps: 1, 2, 3; validation: 2" in err, err
    with (run_dir / "step-00000001.jsonl").open("a") as f:
        f.write("not json\n")
    rc, out, err = report_file(tmp_path, "--step", "1")
    assert rc == 0 and "skipped 1 malformed record" in err and "step-00000001.jsonl line " in err, err


@pytest.mark.e2e  # a subprocess
def test_an_old_single_file_reads_as_before(tmp_path) -> None:
    out = cli(
        tmp_path,
        *("simulate", "--workers", "0", "--steps", "2", "--prompts", "2", "--rollout-n", "2", "--val-every", "0"),
        *("--time-scale", "0.02", "--quiet", "--json", "--file", "old.jsonl"),
        run=RUN,
    )
    assert out.returncode == 0, out.stderr
    collected = {e["step"]: e["metrics"] for e in json.loads(out.stdout)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.jsonl"]
    report = cli(tmp_path, "report", "--file", "old.jsonl", "--json", "--step", "2")
    assert report.returncode == 0, report.stderr
    assert_same_metrics(json.loads(report.stdout)["metrics"], collected[2])


@pytest.mark.e2e  # a subprocess
def test_unstepped_children_land_in_their_step_or_are_read_back_through_the_time_window(tmp_path) -> None:
    folder = tmp_path / TRACES
    handle = oal.configure("unstepped", file=str(folder), schedule_delay_s=30, watchdog=False)

    async def rollout() -> None:
        with oal.step(1):
            async with oal.sample(0, 0):
                await traced_generate(0, flush=True)
            async with oal.sample(1, 0):
                await traced_generate(1)

    try:
        asyncio.run(rollout())
        handle.metrics.collect(1)
        assert handle.force_flush(10)
        assert handle.stats["failed"] == 0 and handle.stats["dropped"] == 0
    finally:
        handle.shutdown(5)
    (run_dir,) = [p for p in folder.iterdir() if p.is_dir()]
    children: dict[str, list[str]] = {}
    for path in run_dir.iterdir():
        for rec in read_jsonl(str(path)):
            if rec.name == "user.child":
                children.setdefault(path.name.split("-")[0], []).append(rec.trace_id_hex)
    # sample 1's child ended before its parent, in the same batch: it followed its trace into the step's file;
    # sample 0's child went out alone first: an unstepped segment
    assert sorted(children) == ["other", "step"] and all(len(v) == 1 for v in children.values()), children
    for sample, trace_id in ((0, children["other"][0]), (1, children["step"][0])):
        rc, out, err = report_file(tmp_path, "--step", "1", "--sample", str(sample), "--rollout", "0")
        assert rc == 0, err
        assert trace_id in out and "user.child" in out, out


def test_more_concurrent_steps_than_descriptors_write_every_span(tmp_path) -> None:
    steps = 40  # > 32 descriptors: each batch routes to 40 step files
    folder = tmp_path / TRACES
    handle = oal.configure("fds", file=str(folder), schedule_delay_s=30, watchdog=False)

    async def one(step: int) -> None:
        with oal.step(step):
            for i in range(2):
                async with oal.sample(i, 0):
                    await asyncio.sleep(0.001)

    async def all_steps() -> None:
        await asyncio.gather(*(one(s) for s in range(1, steps + 1)))

    try:
        asyncio.run(all_steps())
        assert handle.force_flush(10)
        ours = [
            os.readlink(f"/proc/self/fd/{fd}")
            for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")
        ]
        assert 0 < sum(p.startswith(str(folder)) for p in ours) <= 32
        stats = handle.stats
        assert stats["failed"] == 0 and stats["dropped"] == 0 and stats["pending"] == 0
    finally:
        handle.shutdown(5)
    records = list(read_traces(str(folder)))
    assert len(records) == stats["exported"]
    for step in range(1, steps + 1):
        path = next(folder.glob(f"run-*/step-{step:08d}.jsonl"))
        samples = [r for r in read_jsonl(str(path)) if r.name == sc.SAMPLE_SPAN]
        assert sorted(r.attributes[sc.RL_SAMPLE_INDEX] for r in samples) == [0, 1]
    assert {e["step"] for e in _index(folder)} == set(range(1, steps + 1))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_opens_its_own_files_and_index_lines(tmp_path) -> None:
    folder = tmp_path / TRACES
    child = fork_and_trace(str(folder))
    index = _index(folder)
    step_lines = [e for e in index if e["step"] == 1]
    assert {e["pid"] for e in step_lines} == {os.getpid(), child}  # each wrote its own line for the shared file
    assert len({e["segment"] for e in step_lines}) == 1
    samples = {r.attributes[sc.RL_SAMPLE_INDEX]: r for r in read_traces(str(folder)) if r.name == sc.SAMPLE_SPAN}
    assert sorted(samples) == [0, 1, 2] and samples[1].resource["process.pid"] == child


def test_a_write_failure_fails_the_batch_counted_never_raised(tmp_path) -> None:
    folder = tmp_path / TRACES
    (folder / "index.jsonl").mkdir(parents=True)  # every first write of a segment fails: its index line cannot go
    handle = oal.configure("unwritable", file=str(folder), schedule_delay_s=30, watchdog=False)

    async def rollout() -> None:
        with oal.step(1):
            async with oal.sample(0, 0):
                await traced_generate(0)

    try:
        asyncio.run(rollout())  # the user's code runs as if nothing were wrong
        handle.force_flush(10)
        stats = handle.stats
        assert stats["exported"] == 0 and stats["failed"] >= 3 and stats["pending"] == 0, stats
    finally:
        handle.shutdown(5)
    assert not list(folder.glob("run-*/*.jsonl"))  # no data without its index line


@pytest.mark.e2e  # a subprocess
def test_an_unknown_run_id_names_the_runs_of_the_index(resumed) -> None:
    cwd, _, _ = resumed
    rc, out, err = report_file(cwd, "--run-id", "nope")
    assert rc == 1 and out == ""
    (line,) = err.strip().splitlines()
    assert "no run 'nope'" in line and RUN in line, line
    rc, out, err = report_file(cwd, "--run-id", RUN, "--step", "1", "--json")
    assert rc == 0 and json.loads(out)["step"] == 1, err


@pytest.mark.e2e  # a subprocess
def test_the_default_step_is_the_latest_with_samples(tmp_path) -> None:
    """A last step whose file holds trainer spans only (a final phase after the last rollout): ``report`` without
    ``--step`` reads the latest step with samples, as it does on one file."""
    folder = tmp_path / TRACES
    handle = oal.configure("default-step", file=str(folder), schedule_delay_s=30, watchdog=False)

    async def rollout() -> None:
        with oal.step(1):
            async with oal.sample(0, 0):
                await traced_generate(0)

    try:
        asyncio.run(rollout())
        handle.metrics.collect(1)
        with oal.step(2), oal.trainer_phase("update_actor"):
            pass
        assert handle.force_flush(10)
    finally:
        handle.shutdown(5)
    assert {e["step"] for e in _index(folder)} >= {1, 2}
    rc, out, err = report_file(tmp_path, "--json")
    assert rc == 0, err
    assert json.loads(out)["step"] == 1
