"""Runs in one trace file: ``report`` reads one run (default the latest) and never merges runs; a step re-run by a
resumed attempt is read from the latest attempt; ``report --runs`` lists them; ``report --run`` reads the step
summaries the live side wrote (and only them in a large file).

Real spans: the simulated main job (``simulate --workers 0``) appending to one file, each launch with its run
identity in ``OTEL_RESOURCE_ATTRIBUTES`` (what a user or the live side sets); its ``--json`` output is what
``collect()`` returned, the reference each run's report must equal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import Skipped, read_jsonl
from otel_agentloop.analysis._reading._runs import group_runs, select_run
from otel_agentloop.analysis._reading._summary_lines import read_summary_lines
from otel_agentloop.metrics import StepSummary
from tests._support.runs import SUMMARY_DRIVER, assert_same_metrics, cli


def _simulate(cwd: Path, run: str | None, *, steps: int, seed: int, scale: float, attempt: int = 1) -> dict[int, Any]:
    """One launch of the main job appending to run.jsonl; returns collect()'s metrics by step."""
    out = cli(
        cwd,
        "simulate",
        "--workers",
        "0",
        "--steps",
        str(steps),
        "--prompts",
        "4",
        "--rollout-n",
        "2",
        "--time-scale",
        str(scale),
        "--seed",
        str(seed),
        "--val-every",
        "0",
        "--quiet",
        "--json",
        "--file",
        "run.jsonl",
        run=run,
        attempt=attempt,
    )
    assert out.returncode == 0, out.stderr
    return {entry["step"]: entry["metrics"] for entry in json.loads(out.stdout) if not entry.get("validate")}


def _report(cwd: Path, *args: str) -> tuple[dict[str, Any], str]:
    out = cli(cwd, "report", "--file", "run.jsonl", "--json", *args)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), out.stderr


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, Any], dict[int, Any]]:
    """Run alpha, then run beta (slower, other seed), appending to the same file."""
    cwd = tmp_path_factory.mktemp("two-runs")
    alpha = _simulate(cwd, "alpha", steps=3, seed=1, scale=0.03)
    beta = _simulate(cwd, "beta", steps=3, seed=2, scale=0.09)
    return cwd, alpha, beta


@pytest.mark.e2e  # a subprocess
def test_each_run_reports_its_own_numbers_and_the_latest_is_the_default(two_runs) -> None:
    cwd, alpha, beta = two_runs
    for step in (1, 3):
        got, note = _report(cwd, "--step", str(step), "--run-id", "alpha")
        assert_same_metrics(got["metrics"], alpha[step])
        assert "run alpha" in note and "1 other run" in note
        got, _ = _report(cwd, "--step", str(step), "--run-id", "beta")
        assert_same_metrics(got["metrics"], beta[step])
    latest, note = _report(cwd, "--step", "3")
    assert_same_metrics(latest["metrics"], beta[3])
    assert latest["metrics"]["agent_loop/num_samples"] == 8
    assert "run beta" in note
    # the merged-run symptom: samples with the same (step, index, rollout) of both runs were summed into one, so
    # the max exceeded both runs' maxima
    key = "agent_loop/generate_sequences/max"
    assert latest["metrics"][key] == pytest.approx(beta[3][key]) and latest["metrics"][key] <= max(
        alpha[3][key], beta[3][key]
    )


@pytest.mark.e2e  # a subprocess
def test_unknown_run_id_is_an_error_naming_the_runs(two_runs) -> None:
    cwd, _, _ = two_runs
    out = cli(cwd, "report", "--file", "run.jsonl", "--run-id", "gamma")
    assert out.returncode == 1
    assert "no run 'gamma'" in out.stderr and "alpha" in out.stderr and "beta" in out.stderr


@pytest.mark.e2e  # a subprocess
def test_run_page_into_a_missing_folder_is_a_one_line_error(two_runs) -> None:
    cwd, _, _ = two_runs
    out = cli(cwd, "report", "--file", "run.jsonl", "--run", "--html", "no-such-folder/run.html")
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [
        "report: cannot write --html no-such-folder/run.html: no such folder"
    ]
    assert not (cwd / "no-such-folder").exists()


@pytest.mark.e2e  # a subprocess
def test_runs_lists_each_run(two_runs) -> None:
    cwd, _, _ = two_runs
    out = cli(cwd, "report", "--file", "run.jsonl", "--runs")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:5] == ["run", "attempts", "steps", "val", "samples"]
    rows = {line.lstrip("* ").split()[0]: line for line in lines[1:]}
    assert set(rows) == {"alpha", "beta"}
    for name in ("alpha", "beta"):
        cells = rows[name].lstrip("* ").split()
        assert cells[1:6] == ["1", "1..3", "(3)", "0", "24"]  # one attempt, steps 1..3, 3 x 8 samples
    assert rows["beta"].startswith("*")  # the latest: what every mode reads by default


@pytest.mark.e2e  # a subprocess
def test_run_view_reads_one_run(two_runs) -> None:
    cwd, alpha, _ = two_runs
    got, _ = _report(cwd, "--run", "--run-id", "alpha")
    assert got["run"] == "alpha" and [s["step"] for s in got["steps"]] == [1, 2, 3]
    for s in got["steps"]:
        assert s["n"] == 8
        summary = StepSummary.from_json(json.dumps(s))
        assert_same_metrics(
            dict(summary.metrics), alpha[s["step"]]
        )  # rebuilt through the live code: collect()'s numbers
    ranged, _ = _report(cwd, "--run", "--run-id", "alpha", "--steps", "2:3")
    assert [s["step"] for s in ranged["steps"]] == [2, 3]


@pytest.mark.e2e  # a subprocess
def test_a_resumed_run_reads_each_step_from_its_latest_attempt(tmp_path: Path) -> None:
    first = _simulate(tmp_path, "resumed", steps=4, seed=3, scale=0.03, attempt=1)
    second = _simulate(tmp_path, "resumed", steps=2, seed=4, scale=0.03, attempt=2)  # re-runs steps 1 and 2
    got, note = _report(tmp_path, "--step", "2")
    assert_same_metrics(got["metrics"], second[2])
    assert got["metrics"]["agent_loop/num_samples"] == 8
    assert "recorded by more than one attempt" in note and "1, 2" in note
    got, _ = _report(tmp_path, "--step", "4")
    assert_same_metrics(got["metrics"], first[4])
    run, _ = _report(tmp_path, "--run")
    assert run["attempts"] == ["1", "2"] and [s["n"] for s in run["steps"]] == [8, 8, 8, 8]
    listing = cli(tmp_path, "report", "--file", "run.jsonl", "--runs")
    assert "1,2" in listing.stdout.splitlines()[1] and " 48 " in listing.stdout  # 32 + 16 sample spans stored


def _otlp_line(resource: dict[str, str], spans: list[dict[str, Any]]) -> str:
    attrs = [{"key": k, "value": {"stringValue": v}} for k, v in resource.items()]
    return json.dumps({"resourceSpans": [{"resource": {"attributes": attrs}, "scopeSpans": [{"spans": spans}]}]})


@pytest.mark.e2e  # a subprocess
def test_records_without_a_run_id_are_one_run_per_service(tmp_path: Path) -> None:
    """An older file (no rl.run.id): one run per service name, labelled so."""

    def sample(service_step: int, index: int, start: int) -> dict[str, Any]:
        return {
            "traceId": f"{index + 1:032x}",
            "spanId": f"{index + 1:016x}",
            "name": sc.SAMPLE_SPAN,
            "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(start + 10**9),
            "attributes": [
                {"key": sc.RL_STEP, "value": {"intValue": str(service_step)}},
                {"key": sc.RL_SAMPLE_INDEX, "value": {"intValue": str(index)}},
            ],
        }

    path = tmp_path / "old.jsonl"
    t = 1_700_000_000 * 10**9
    path.write_text(
        _otlp_line({"service.name": "a"}, [sample(1, 0, t), sample(1, 1, t)])
        + "\n"
        + _otlp_line({"service.name": "b"}, [sample(1, 2, t + 10**9)])
        + "\n"
    )
    runs = group_runs(read_jsonl(str(path)))
    assert [(r.label, r.samples(), r.has_id) for r in runs] == [
        ("(no run id) service a", 2, False),
        ("(no run id) service b", 1, False),
    ]
    selection = select_run(read_jsonl(str(path)))
    assert selection is not None and selection.run.label == "(no run id) service b"
    out = cli(tmp_path, "report", "--file", "old.jsonl", "--json", "--run-id", "(no run id) service a")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["metrics"]["agent_loop/num_samples"] == 2


@pytest.mark.e2e  # a subprocess
def test_run_view_reads_the_stored_summaries(tmp_path: Path) -> None:
    (tmp_path / "driver.py").write_text(SUMMARY_DRIVER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "driver.py", "stored", "run.jsonl"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    written = [StepSummary.from_json(line) for line in out.stdout.splitlines()]
    got, note = _report(tmp_path, "--run")
    assert got["run"] == "stored" and got["rebuilt"] == []
    assert [StepSummary.from_json(json.dumps(s)) for s in got["steps"]] == written
    assert "rebuilt" not in note
    # the large-file path: summary lines only, the others skipped unparsed; same records as a full read
    only = list(read_summary_lines(str(tmp_path / "run.jsonl"), Skipped()))
    full = [r for r in read_jsonl(str(tmp_path / "run.jsonl")) if r.name == sc.STEP_SUMMARY_SPAN]
    assert only == full and len(only) == 3
    assert all(np.isfinite(s.wall_s) and s.wall_s > 1 for s in written)


def test_summary_lines_in_another_layout_are_parsed_whole(tmp_path: Path) -> None:
    """A line whose spans do not start with traceId (another writer's key order) is parsed whole, not missed."""
    from otel_agentloop.metrics import Distribution

    summary = StepSummary(
        7, False, 2, {"agent_loop/num_samples": 2.0}, {}, {"search": Distribution.of([1.0])}, {"ok": 2}
    )  # a readable summary: its 2 samples' verdicts counted
    span = {
        "name": sc.STEP_SUMMARY_SPAN,
        "traceId": "ab" * 16,
        "spanId": "cd" * 8,
        "startTimeUnixNano": "1",
        "endTimeUnixNano": "2",
        "attributes": [
            {"key": sc.RL_STEP, "value": {"intValue": "7"}},
            {"key": sc.RL_STEP_SUMMARY, "value": {"stringValue": summary.to_json()}},
        ],
    }
    other = {"traceId": "ef" * 16, "spanId": "01" * 8, "name": sc.SAMPLE_SPAN}
    path = tmp_path / "other.jsonl"
    path.write_text(_otlp_line({sc.RL_RUN_ID: "x"}, [other, span]) + "\n" + _otlp_line({}, [other]) + "\n")
    skipped = Skipped()
    (record,) = read_summary_lines(str(path), skipped)
    assert skipped.count == 0 and record.resource == {sc.RL_RUN_ID: "x"}
    assert StepSummary.from_json(record.attributes[sc.RL_STEP_SUMMARY]) == StepSummary.from_json(summary.to_json())
