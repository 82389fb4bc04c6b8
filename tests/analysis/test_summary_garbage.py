"""A hostile or garbage ``rl.step.summary`` cannot change a step's numbers (issue 41, item 7). Each summary is
checked as it is read (``StepSummary.from_json``: counts and seconds not negative, times in order; and its span
names the step its summary does): one that fails is no step, stands in for no step, and is counted on stderr with
the first reason. Real spans: the simulated main job into one file and into a trace folder, garbage appended as
another writer would append it; the CLI runs as a subprocess."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import read_jsonl
from otel_agentloop.metrics import StepSummary
from tests._support.runs import RUN, TRACES, assert_same_metrics, cli, simulate_run

STEPS = [(1, False), (2, False), (2, True), (3, False)]


def _value(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    return {"stringValue": str(v)}


def _summary_line(resource: dict[str, Any], step: int, text: str, end_ns: int, n: int) -> str:
    """One OTLP-JSON line holding one ``rl.step.summary`` span, as the exporters write it."""
    span = {
        "traceId": f"{0xBAD0 + n:032x}",
        "spanId": f"{0xBAD0 + n:016x}",
        "name": sc.STEP_SUMMARY_SPAN,
        "kind": 1,
        "startTimeUnixNano": str(end_ns - 1000),
        "endTimeUnixNano": str(end_ns),
        "attributes": [
            {"key": sc.RL_STEP, "value": _value(step)},
            {"key": sc.RL_VALIDATE, "value": _value(False)},
            {"key": sc.RL_STEP_SUMMARY, "value": _value(text)},
        ],
        "status": {},
    }
    res = {"attributes": [{"key": k, "value": _value(v)} for k, v in resource.items()]}
    return json.dumps({"resourceSpans": [{"resource": res, "scopeSpans": [{"spans": [span]}]}]}) + "\n"


def _garbage(real_file: Path) -> str:
    """Four summaries another writer appended, each later than the real ones (the latest summary of a step wins
    when two are readable): text that is not a summary (as step 7), negative verdict counts (as step 8), step 1's
    summary on a span of step 9, and step 2's with negative phase seconds."""
    (real,) = [r for r in read_jsonl(str(real_file)) if r.name == sc.STEP_SUMMARY_SPAN and r.attributes[sc.RL_STEP] == 2
               and r.attributes.get(sc.RL_VALIDATE) is not True][:1]  # fmt: skip
    body = json.loads(real.attributes[sc.RL_STEP_SUMMARY])
    later = real.end_ns + 10**12
    negative_counts = {**body, "step": 8, "counts": {"ok": -5, "failed": 0, "slow": 0, "hung": 0}}
    other_step = {**body, "step": 1}
    negative_seconds = {**body, "slowest": [*body["slowest"][:3], -9.0, *body["slowest"][4:]]}
    negative_seconds["phases"] = {**body["phases"], "tool_calls": [6, -1.0, -1.0, -1.0, -1.0, -1.0, -6.0]}
    resource = dict(real.resource)
    return "".join(
        _summary_line(resource, step, text, later, i)
        for i, (step, text) in enumerate(
            [
                (7, "{not a summary"),
                (8, json.dumps(negative_counts)),
                (9, json.dumps(other_step)),
                (2, json.dumps(negative_seconds)),
            ]
        )
    )


def _report(cwd: Path, source: str, *args: str) -> tuple[str, str]:
    out = cli(cwd, "report", "--file", source, *args)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    return out.stdout, out.stderr


def _check(cwd: Path, source: str, collected: dict[tuple[int, bool], Any]) -> None:
    out, err = _report(cwd, source, "--runs")
    (row,) = [line for line in out.splitlines() if line.startswith("* ")]
    assert RUN in row and " 1..3 (3) " in row, out
    assert "skipped 4 unreadable step summaries" in err, err
    out, err = _report(cwd, source, "--run", "--json")
    body = json.loads(out)
    steps = {(s["step"], s["validate"]): s for s in body["steps"]}
    assert sorted(steps) == STEPS, sorted(steps)
    for key, metrics in collected.items():
        assert_same_metrics(steps[key]["metrics"], metrics)
        assert min(steps[key]["counts"].values()) >= 0 and steps[key]["slowest"][3] >= 0
        assert min(min(d) for d in steps[key]["phases"].values()) >= 0
    (line,) = [n for n in err.splitlines() if "unreadable step summaries" in n]
    assert "skipped 4 unreadable step summaries" in line and "(first: trace " in line, line
    out, err = _report(cwd, source, "--run")
    assert [r.split()[0] for r in out.splitlines()[1:]] == ["1", "2", "2", "3"], out
    assert "-9.00" not in out and "-5" not in out, out


@pytest.fixture(scope="module")
def one_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[tuple[int, bool], Any]]:
    cwd = tmp_path_factory.mktemp("garbage")
    out = cli(
        cwd,
        *("simulate", "--workers", "0", "--steps", "3", "--prompts", "3", "--rollout-n", "2", "--val-every", "2"),
        *("--time-scale", "0.03", "--seed", "5", "--quiet", "--json", "--file", "run.jsonl"),
        run=RUN,
    )
    assert out.returncode == 0, out.stderr
    collected = {(e["step"], False): e["metrics"] for e in json.loads(out.stdout)}
    return cwd, collected


@pytest.mark.e2e  # a subprocess
def test_garbage_summaries_in_one_file_change_no_step(one_file) -> None:
    cwd, collected = one_file
    path = cwd / "run.jsonl"
    with path.open("a") as f:
        f.write(_garbage(path))
    _check(cwd, "run.jsonl", collected)


@pytest.mark.e2e  # a subprocess
def test_garbage_summaries_in_a_trace_folder_change_no_step(tmp_path: Path) -> None:
    collected = simulate_run(tmp_path, seed=6, attempt=1)
    path = tmp_path / TRACES / "summaries.jsonl"
    with path.open("a") as f:
        f.write(_garbage(path))
    _check(tmp_path, TRACES, collected)
    out = cli(tmp_path, "report", "--file", TRACES, "--step", "2", "--json")
    assert out.returncode == 0 and "skipped 4 unreadable step summaries" in out.stderr, out.stderr
    assert_same_metrics(json.loads(out.stdout)["metrics"], collected[(2, False)])


def _real() -> dict[str, Any]:
    return {
        "v": 3, "step": 1, "validate": False, "n": 2, "metrics": {"agent_loop/tool_calls/max": 0.5},
        "phases": {"tool_calls": [2, 0.25, 0.45, 0.495, 0.5, 0.25, 0.5]}, "tools": {},
        "counts": {"ok": 2, "failed": 0, "slow": 0, "hung": 0}, "t": [10, 20, 30, 40], "hung": [], "slow": [],
        "slowest": [0, 0, None, 0.1, 0.5, 0.0, "ok"], "top": [], "failed": [],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"counts": {"ok": -1}}, "not a count"),
        ({"counts": {"ok": 1.5}}, "not a count"),
        ({"counts": {"ok": 5}}, "do not add up"),
        ({"n": 7}, "do not add up"),
        ({"phases": {"tool_calls": [2, -0.25, 0.45, 0.495, 0.5, 0.25, 0.5]}}, "negative"),
        ({"tools": {"search": [1, 0.1, 0.1, 0.1, -0.1, 0.1, 0.1]}}, "negative"),
        ({"slowest": [0, 0, None, -0.1, 0.5, 0.0, "ok"]}, "negative"),
        ({"metrics": {"agent_loop/generate_sequences/p50": -2.0}}, "negative"),
        ({"t": [10, 40, 30, 40]}, "out of order"),
        ({"t": [25, 20, 30, 40]}, "out of order"),
    ],
)
def test_a_summary_with_impossible_figures_is_not_read(change: dict[str, Any], reason: str) -> None:
    assert StepSummary.from_json(json.dumps(_real())).counts["ok"] == 2  # the real one reads
    with pytest.raises(ValueError, match=reason):
        StepSummary.from_json(json.dumps({**_real(), **change}))
