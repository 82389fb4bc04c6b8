"""The main job, run as a user runs it: metrics table, waterfall, and a trace file that rebuilds the metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from otel_agentloop.analysis import read_jsonl, read_traces
from otel_agentloop.metrics import PhaseMetricsProcessor
from tests._support.spans import span_metrics

pytestmark = pytest.mark.e2e  # the CLI or Python in subprocesses


def _simulate(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_agentloop",
            "simulate",
            "--steps",
            "2",
            "--prompts",
            "4",
            "--rollout-n",
            "2",
            "--time-scale",
            "0.05",
            *args,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def test_simulate_prints_metrics_and_waterfall(tmp_path) -> None:
    out = _simulate(tmp_path).stdout
    assert "== step 1: agent_loop metrics" in out and "== step 2: agent_loop metrics" in out
    assert "generate_sequences" in out and "slowest sample" in out
    assert "rl.sample" in out and "text_completion sim-7b" in out
    assert "dropped: 0" in out
    assert (tmp_path / "otel-agentloop-traces" / "index.jsonl").exists()  # the default: the rolled directory


def test_simulate_json_equals_metrics_rebuilt_from_the_trace_file(tmp_path) -> None:
    out = _simulate(tmp_path, "--json", "--quiet", "--file", "run.jsonl").stdout
    steps = json.loads(out)  # stdout holds the JSON document alone (jq-able); lines for people go to stderr
    records = list(read_jsonl(str(tmp_path / "run.jsonl")))
    for entry in steps:
        proc = PhaseMetricsProcessor()
        proc.ingest_records(records)
        rebuilt = proc.collect(entry["step"])
        assert span_metrics(rebuilt) == span_metrics(entry["metrics"])
        assert rebuilt.slowest_trace_id == entry["slowest_trace_id"]
        assert rebuilt["agent_loop/num_samples"] == 8


def _cli(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-m", "otel_agentloop", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_report_from_a_trace_file_matches_the_live_run_and_draws_the_waterfall(tmp_path) -> None:
    out = _simulate(tmp_path, "--json", "--quiet", "--file", "run.jsonl").stdout
    live = json.loads(out[out.index("[") : out.rindex("]") + 1])
    rep = _cli(tmp_path, "report", "--file", "run.jsonl", "--step", "2", "--json")
    assert rep.returncode == 0, rep.stderr
    data = json.loads(rep.stdout)
    assert span_metrics(data["metrics"]) == span_metrics(live[1]["metrics"])
    assert data["slowest_trace_id"] == live[1]["slowest_trace_id"]
    totals = [row["total"] for row in data["slowest"]]
    assert totals == sorted(totals, reverse=True) and len(totals) == 5

    text = _cli(tmp_path, "report", "--file", "run.jsonl", "--png", "w.png")
    assert text.returncode == 0, text.stderr
    assert "== step 2: agent_loop metrics rebuilt from run.jsonl" in text.stdout  # the last step by default
    assert "rl.sample" in text.stdout and "text_completion sim-7b" in text.stdout
    png = (tmp_path / "w.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000

    missing = _cli(tmp_path, "report", "--file", "run.jsonl", "--step", "9")
    assert missing.returncode == 1 and "no samples for step 9" in missing.stderr


def test_main_job_shows_validation_generations_trainer_phases_and_health_alarms(tmp_path) -> None:
    out = _simulate(tmp_path, "--steps", "4", "--misbehave", "--json", "--quiet", "--time-scale", "0.3").stdout
    steps = json.loads(out[out.index("[") : out.rindex("]") + 1])
    assert [s["validation_generations"] is not None for s in steps] == [False, True, False, True]
    gens = steps[1]["validation_generations"]
    assert len(gens) == 4 and all(inp.startswith("What is") and isinstance(score, float) for inp, _, score in gens)
    assert set(steps[0]["timing_raw"]) == {"gen", "old_log_prob", "ref", "adv", "update_actor"}
    assert "testing" in steps[1]["timing_raw"]
    assert steps[0]["alerts"] == [] and steps[1]["alerts"] == []
    assert "kl_high" in steps[2]["alerts"] and "step_time_swing" in steps[2]["alerts"]  # the injected faults
    records = list(read_traces(str(tmp_path / "otel-agentloop-traces")))
    step3 = [
        r for r in records if r.name == "rl.step" and r.attributes["rl.step"] == 3 and not r.attributes["rl.validate"]
    ]
    assert [e[0] for e in step3[0].events].count("rl.health.alert") == len(steps[2]["alerts"])
    train = {r.name for r in records if r.name.startswith("rl.train.") and r.parent_id == step3[0].span_id}
    assert train == {"rl.train.gen", "rl.train.old_log_prob", "rl.train.ref", "rl.train.adv", "rl.train.update_actor"}
    text = _simulate(tmp_path, "--steps", "3", "--misbehave", "--quiet").stdout
    assert "validation generations (4 kept of 8 offered" in text
    assert "HEALTH step 3: kl_high" in text and "TRIPPED kl_high at step 3" in text


def test_json_output_is_only_json_for_simulate_on_ray_and_for_report(tmp_path) -> None:
    out = _simulate(tmp_path, "--json", "--workers", "1", "--steps", "1", "--file", "ray.jsonl")
    assert [entry["step"] for entry in json.loads(out.stdout)] == [1]
    assert "spans exported" in out.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    report = subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "report", "--file", "ray.jsonl", "--step", "1", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(report.stdout)["step"] == 1
