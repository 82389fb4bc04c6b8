"""``report --runs`` and ``--run`` on a trace folder read runs and steps from its index (issue 41, item 4), as
docs/traces-and-reports.md says: a run whose summaries are lost, or that never called ``collect()``, is listed
and its steps shown (rebuilt from their step files, marked ``*``); a cut last summary line hides no step; a step
with neither a summary nor finished sample spans is listed as such, never as zeros. Real spans: the simulated main
job and small drivers through the public API; the CLI runs as a subprocess."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import otel_agentloop as oal
from otel_agentloop.analysis._reading import _run_load
from tests._support.runs import RUN, TRACES, assert_same_metrics, report_file, simulate_run, traced_generate

pytestmark = pytest.mark.e2e  # the CLI or Python in subprocesses

STEPS = [(1, False), (2, False), (2, True), (3, False)]


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[tuple[int, bool], Any]]:
    cwd = tmp_path_factory.mktemp("index")
    return cwd, simulate_run(cwd, seed=3, attempt=1)


def _copy(simulated: tuple[Path, Any], tmp_path: Path) -> Path:
    shutil.copytree(simulated[0] / TRACES, tmp_path / TRACES)
    return tmp_path / TRACES


def _run_json(cwd: Path, *args: str) -> tuple[dict[str, Any], str]:
    rc, out, err = report_file(cwd, "--run", "--json", *args)
    assert rc == 0, err
    return json.loads(out), err


def _runs_row(cwd: Path) -> tuple[str, str]:
    rc, out, err = report_file(cwd, "--runs")
    assert rc == 0, err
    (row,) = [line for line in out.splitlines() if line.startswith("* ")]
    return row, err


def test_a_run_that_lost_its_summaries_is_listed_and_its_steps_rebuilt(simulated, tmp_path: Path) -> None:
    collected = simulated[1]
    (_copy(simulated, tmp_path) / "summaries.jsonl").unlink()
    row, err = _runs_row(tmp_path)
    assert RUN in row and " 1..3 (3) " in row, row
    assert "4 steps of its index (1, 2, 3; validation: 2) without a stored summary" in err, err
    body, err = _run_json(tmp_path)
    steps = {(s["step"], s["validate"]): s for s in body["steps"]}
    assert sorted(steps) == STEPS and sorted(map(tuple, body["rebuilt"])) == STEPS and body["unsummarized"] == []
    for key, metrics in collected.items():
        assert_same_metrics(steps[key]["metrics"], metrics)
    rc, out, err = report_file(tmp_path, "--run")
    assert rc == 0 and "hold no spans" not in err and "holds no spans" not in err, err
    assert [line.split()[:2] for line in out.splitlines()[1:]] == [["1", "*"], ["2", "*"], ["2", "val"], ["3", "*"]]


def test_a_cut_last_summary_line_hides_no_step(simulated, tmp_path: Path) -> None:
    collected = simulated[1]
    path = _copy(simulated, tmp_path) / "summaries.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    last = json.loads(lines[-1])
    hidden = sorted(_key(s) for rs in last["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"])
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # the writer died mid-line
    row, _ = _runs_row(tmp_path)
    assert " 1..3 (3) " in row, row
    body, err = _run_json(tmp_path)
    assert "skipped 1 malformed record" in err and "summaries.jsonl" in err, err
    steps = {(s["step"], s["validate"]): s for s in body["steps"]}
    assert sorted(steps) == STEPS
    assert sorted(map(tuple, body["rebuilt"])) == hidden and hidden
    for key, metrics in collected.items():
        assert_same_metrics(steps[key]["metrics"], metrics)


def _key(span: dict[str, Any]) -> tuple[int, bool]:
    """A summary span's (rl.step, rl.validate), from its OTLP-JSON attributes."""
    attrs = {a["key"]: a["value"] for a in span["attributes"]}
    return int(attrs["rl.step"]["intValue"]), attrs.get("rl.validate", {}).get("boolValue") is True


def test_a_run_that_never_collected_is_listed_with_its_steps(tmp_path: Path) -> None:
    folder = tmp_path / TRACES
    handle = oal.configure("never-collected", file=str(folder), schedule_delay_s=30, watchdog=False)

    async def rollout() -> None:
        for step in (1, 2):
            with oal.step(step):
                for index in range(3):
                    async with oal.sample(index, 0):
                        await traced_generate(index)
        with oal.step(3), oal.trainer_phase("update_actor"):  # a step of trainer spans only
            pass

    try:
        asyncio.run(rollout())  # no collect(): no summary is written
        assert handle.force_flush(10)
    finally:
        handle.shutdown(5)
    assert not (folder / "summaries.jsonl").exists()
    row, _ = _runs_row(tmp_path)
    assert "never-collected" in row and " 1..3 (3) " in row, row
    body, err = _run_json(tmp_path)
    assert [(s["step"], s["n"]) for s in body["steps"]] == [(1, 3), (2, 3)], body
    assert body["unsummarized"] == [[3, False]], body
    assert "step 3 has no stored summary and no finished sample span" in err, err
    rc, out, err = report_file(tmp_path, "--run")
    assert rc == 0, err
    (three,) = [line.split() for line in out.splitlines() if line.startswith("3 ")]
    assert three[:3] == ["3", "no", "summary"] and set(three[3:]) == {"-"}, out


def test_steps_too_large_to_read_are_listed_without_figures(simulated, tmp_path: Path, monkeypatch) -> None:
    folder = _copy(simulated, tmp_path)
    (folder / "summaries.jsonl").unlink()
    monkeypatch.setattr(_run_load, "FULL_READ_BYTES", 0)
    notes: list[str] = []
    _, steps = _run_load.store_run_steps(str(folder), None, None, notes.append)
    assert steps is not None and not steps.summaries and steps.unsummarized == STEPS
    assert steps.run.label == RUN and sorted(steps.run.steps()) == STEPS
    assert any("were not read" in n and "listed without figures" in n for n in steps.notes), steps.notes


def test_a_folder_of_runs_without_steps_says_so_not_that_it_holds_no_spans(tmp_path: Path) -> None:
    handle = oal.configure("no-steps", file=str(tmp_path / TRACES), schedule_delay_s=30, watchdog=False)
    try:
        assert handle.provider is not None
        with handle.provider.get_tracer("user").start_as_current_span("mine"):  # the user's own span, no step
            pass
        assert handle.force_flush(10)
    finally:
        handle.shutdown(5)
    rc, out, err = report_file(tmp_path, "--run")
    assert rc == 1 and out == ""
    (line,) = err.strip().splitlines()
    assert "holds no spans" not in line and "its index lists runs without steps" in line, line
