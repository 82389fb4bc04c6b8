"""What ``report`` prints is safe, and it reads what it was given (issue 26).

Every line the CLI prints goes through one sanitiser: run ids and service names from trace data never carry
ESC/OSC/BEL/C1, newlines or bidi controls to the terminal, and a 10,000-character id is cut. A run without an id is
never merged with a run whose id is its label. ``--run-id`` with a byte that is not UTF-8 finds the run whose id
the exporter stored with U+FFFD. A stored ``rl.phase`` (or tool name) of any type is read, never a traceback.

Spans are written through the public API in a subprocess (``OTEL_AGENTLOOP_RUN_ID``, as a user sets it); records
the API cannot write (an old file without a run id, a key-value-list ``rl.phase``) are OTLP-JSON lines. The CLI
runs as a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import read_jsonl
from otel_agentloop.metrics import PhaseMetricsProcessor
from tests._support.otlp_lines import HOSTILE, SGR, UNSAFE, otlp_line, otlp_span, run_cli, sample_attrs, sample_spans

DRIVER = """
import sys
import otel_agentloop as oal

handle = oal.configure(sys.argv[2], file=sys.argv[1])


@oal.phase("tool", tool="search")
def search() -> int:
    return 1


with oal.step(1), oal.sample(0, 0):
    search()
handle.shutdown()
"""
LONG_ID = "r" * 10_000


def _write_run(cwd: Path, path: str, run_id: str, service: str = "svc") -> None:
    """One sample of step 1 in run ``run_id`` of ``service``, appended to ``path`` through the public API."""
    (cwd / "driver.py").write_text(DRIVER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_AGENTLOOP_RUN_ID"] = run_id
    out = subprocess.run(
        [sys.executable, "driver.py", path, service], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr


def _unsafe(text: str) -> list[str]:
    return UNSAFE.findall(SGR.sub("", text))


def _report(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    out = run_cli(["report", "--file", "runs.jsonl", *args], cwd)
    assert "Traceback" not in out.stderr, out.stderr
    return out


@pytest.fixture(scope="module")
def hostile_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("hostile-runs")
    ids = [h for h in HOSTILE if "\ud800" not in h] + ["line\nbreak", LONG_ID]  # a lone surrogate: see below
    for n, run_id in enumerate(ids):
        _write_run(cwd, "runs.jsonl", run_id, service=f"svc{n}\x1b[2J\u202e")
    return cwd


@pytest.mark.e2e  # a subprocess
def test_runs_listing_prints_no_control_character_and_cuts_long_ids(hostile_runs: Path) -> None:
    out = _report(hostile_runs, "--runs")
    assert out.returncode == 0, out.stderr
    assert _unsafe(out.stdout) == [] and _unsafe(out.stderr) == []
    lines = out.stdout.splitlines()
    assert len(lines) == 1 + len(HOSTILE) - 1 + 2  # a header and one row per run: no id printed a line break
    assert "\\x1b]0;pwned\\x07" in out.stdout and "line\\x0abreak" in out.stdout  # shown escaped, not dropped
    assert "svc0\\x1b[2J\\u202e" in out.stdout
    assert max(len(line) for line in lines) < 400  # the 10,000-character id is cut ...
    assert "r" * 100 + "…" in out.stdout  # ... and says so


@pytest.mark.e2e  # a subprocess
@pytest.mark.parametrize(
    "args",
    [
        ["--run"],
        ["--run", "--run-id", LONG_ID],
        ["--run-id", LONG_ID, "--json"],
        ["--run-id", "\x1b]0;pwned\x07"],
        ["--run-id", "no such \x1b[31m run"],
        ["--step", "9"],
        ["--compare", "1", "9"],
    ],
)
def test_every_report_line_is_sanitised(hostile_runs: Path, args: Sequence[str]) -> None:
    """Whatever the mode and however it ends (a table, JSON, a note, an error), no line carries a control
    character from the data, and no stderr line is longer than the cap."""
    out = _report(hostile_runs, *args)
    assert _unsafe(out.stdout) == [] and _unsafe(out.stderr) == [], (out.stdout, out.stderr)
    assert all(len(line) <= 2000 for line in out.stderr.splitlines())
    if "--json" in args:
        assert json.loads(out.stdout)["metrics"]["agent_loop/num_samples"] == 1
    if args[-1].startswith("no such"):
        assert out.returncode == 1 and "no run 'no such \\x1b[31m run'" in out.stderr


@pytest.mark.e2e  # a subprocess
def test_a_run_without_an_id_and_a_run_named_like_it_are_two_runs(tmp_path: Path) -> None:
    old = sample_spans(0, dur_ms=300)  # an old file's run: service svc, no rl.run.id
    (tmp_path / "runs.jsonl").write_text(otlp_line(old) + "\n")
    _write_run(tmp_path, "runs.jsonl", "(no run id) service svc")  # then a run whose id is that label
    out = _report(tmp_path, "--runs")
    assert out.returncode == 0, out.stderr
    rows = out.stdout.splitlines()[1:]
    assert len(rows) == 2 and all("(no run id) service svc" in r for r in rows), out.stdout
    assert [r.split()[-1] for r in rows] == ["svc", "svc"]
    by_id = json.loads(_report(tmp_path, "--run-id", "(no run id) service svc", "--json").stdout)
    assert by_id["metrics"]["agent_loop/num_samples"] == 1  # the literal id's run: one sample, not the two merged
    latest = json.loads(_report(tmp_path, "--run", "--json").stdout)
    assert latest["run"] == "(no run id) service svc" and [s["n"] for s in latest["steps"]] == [1]


@pytest.mark.e2e  # a subprocess
def test_run_id_with_a_byte_that_is_not_utf8_finds_its_run(tmp_path: Path) -> None:
    """``OTEL_AGENTLOOP_RUN_ID=$'run-\\xff'``: stored as ``run-\\ufffd``; ``--run-id $'run-\\xff'`` reads it."""
    raw = os.fsdecode(b"run-\xff")  # what Python makes of the byte in the environment and in argv
    _write_run(tmp_path, "runs.jsonl", raw)
    _write_run(tmp_path, "runs.jsonl", "later")
    stored = {str(r.resource.get(sc.RL_RUN_ID)) for r in read_jsonl(str(tmp_path / "runs.jsonl"))}
    assert stored == {"run-\ufffd", "later"}  # what the exporter wrote
    for run_id in (raw, "run-\ufffd"):
        out = _report(tmp_path, "--run-id", run_id, "--json")
        assert out.returncode == 0, out.stderr
        assert "run run-\ufffd" in out.stderr and json.loads(out.stdout)["metrics"]["agent_loop/num_samples"] == 1
    missing = _report(tmp_path, "--run-id", os.fsdecode(b"other-\xfe"))
    assert missing.returncode == 1 and "no run 'other-\\udcfe'" in missing.stderr, missing.stderr


# -- a stored rl.phase of any type ----------------------------------------------------------------------------------
ODD_VALUES = [
    {"kvlistValue": {"values": [{"key": "a", "value": {"intValue": "1"}}]}},
    {"arrayValue": {"values": [{"stringValue": "generate_sequences"}, {"kvlistValue": {"values": []}}]}},
    {"intValue": "3"},
    {"doubleValue": 2.5},
    {"boolValue": True},
    {"bytesValue": "AAE="},
    {},
]


def _odd_file(path: Path) -> None:
    spans = sample_spans(0, dur_ms=300) + sample_spans(1, dur_ms=200)
    root = int(spans[0]["spanId"], 16)
    for n, value in enumerate(ODD_VALUES):
        for key in (sc.RL_PHASE, sc.GEN_AI_TOOL_NAME):
            span = otlp_span("odd", 0x900 + 2 * n + (key == sc.RL_PHASE), parent=root, attrs=sample_attrs(0))
            span["attributes"].append({"key": key, "value": value})
            spans.append(span)
    path.write_text(otlp_line(spans) + "\n")


@pytest.mark.e2e  # a subprocess
@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--json"],
        ["--html", "p.html"],
        ["--timeline-png", "t.png"],
        ["--png", "w.png"],
        ["--perfetto", "p.json"],
        ["--run"],
        ["--run", "--html", "r.html"],
        ["--runs"],
        ["--compare", "1", "1", "--html", "c.html"],
    ],
)
def test_a_stored_phase_of_any_type_is_read_never_a_traceback(tmp_path: Path, args: Sequence[str]) -> None:
    _odd_file(tmp_path / "runs.jsonl")
    out = _report(tmp_path, *args)
    assert out.returncode == 0, out.stderr
    if "--json" in args:
        assert json.loads(out.stdout)["metrics"]["agent_loop/num_samples"] == 2  # the odd spans are no phase


def test_the_metrics_processor_ignores_an_unhashable_phase() -> None:
    proc = PhaseMetricsProcessor()
    base = {sc.RL_STEP: 1, sc.RL_SAMPLE_INDEX: 0, sc.RL_ROLLOUT_N: 0}
    proc.ingest("odd", {**base, sc.RL_PHASE: {"a": 1}}, 0, 10**9, 1, False)
    proc.ingest("odd", {**base, sc.RL_PHASE: [sc.GENERATE]}, 0, 10**9, 1, False)
    proc.ingest("g", {**base, sc.RL_PHASE: sc.GENERATE}, 0, 10**9, 1, False)
    proc.ingest(sc.SAMPLE_SPAN, base, 0, 2 * 10**9, 1, False)
    metrics = proc.collect(1)
    assert metrics[f"{sc.METRIC_PREFIX}/num_samples"] == 1
    assert metrics[f"{sc.METRIC_PREFIX}/{sc.GENERATE}/max"] == pytest.approx(1.0)
