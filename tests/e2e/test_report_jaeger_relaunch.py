"""``report --jaeger --step N`` chooses the run first, then the step (issue 38, item 2), against the real Jaeger
behind the real Collector.

A job ran 3 steps (run ``old-*``), then was relaunched (a new run id, ``new-*``) more than a step's search
window later and ran 1 step. ``--step 3`` must
not show the old run's step 3 as today's: it fails as a trace folder does ("found steps: 1") and names the run
that has step 3; ``--run-id NEW --step 3`` says the same (it answered "no run" before); ``--run-id`` with the id
``--runs`` marks as the latest works; the old run's step 3 is read when asked for by id; the ``run ...`` line is
printed every time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from otel_agentloop.analysis._reading._source import STEP_WINDOW_SLACK
from tests._support.jaeger_runs import report_jaeger, run_env, wait_stored

OLD_SAMPLES, NEW_SAMPLES = 8, 4
"""Samples per step of each run (4 x 2 and 2 x 2): each run's numbers are told apart."""


def _simulate(stack: Any, cwd: Path, service: str, run: str, steps: int, prompts: int) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "simulate", "--workers", "0", "--steps", str(steps), "--prompts",
         str(prompts), "--rollout-n", "2", "--time-scale", "0.03", "--val-every", "0", "--quiet",
         "--endpoint", stack.otlp_grpc_endpoint, "--service-name", service],
        cwd=cwd, env=run_env(run), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr


def _run_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("report: run ")]
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_relaunch_with_fewer_steps_is_read_as_its_own_run(stack, tmp_path) -> None:
    tag = uuid.uuid4().hex[:6]
    service, old, new = f"relaunch-{tag}", f"old-{tag}", f"new-{tag}"
    _simulate(stack, tmp_path, service, old, 3, OLD_SAMPLES // 2)
    ended = time.monotonic()
    wait_stored(stack, service, 3 * OLD_SAMPLES, 3)
    alone = report_jaeger(stack, tmp_path, service, "--step", "3", "--json")  # one run: its line is printed too
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout)["metrics"]["agent_loop/num_samples"] == OLD_SAMPLES
    assert _run_line(alone.stderr) == f"report: run {old}", alone.stderr
    # relaunched later than a step's window reaches (as a relaunch the next day): the old run's step 3 window
    # then holds none of the new run's spans, and a search by step alone finds only the old run's step 3
    time.sleep(max(0.0, ended + STEP_WINDOW_SLACK.total_seconds() + 5 - time.monotonic()))
    _simulate(stack, tmp_path, service, new, 1, NEW_SAMPLES // 2)
    wait_stored(stack, service, 3 * OLD_SAMPLES + NEW_SAMPLES, 4)

    listing = report_jaeger(stack, tmp_path, service, "--runs")
    assert listing.returncode == 0, listing.stderr
    latest = [line[2:].split()[0] for line in listing.stdout.splitlines()[1:] if line.startswith("* ")]
    assert latest == [new], listing.stdout

    # the step the new run does not have: an error naming its steps and the run that has it, never the old one's
    for pick in ([], ["--run-id", latest[0]]):
        missing = report_jaeger(stack, tmp_path, service, "--step", "3", "--json", *pick)
        assert missing.returncode == 1, (missing.stdout, missing.stderr)
        assert missing.stdout == "" and "Traceback" not in missing.stderr
        error = missing.stderr.strip().splitlines()[-1]
        assert f"no samples for step 3 in run {new}" in error and "(found steps: 1)" in error, missing.stderr
        assert f"step 3 is in run {old} (report --run-id {old} --step 3)" in error, missing.stderr

    # the new run's step, by default and by the id --runs marks: the new run's numbers, and the run line
    for pick in ([], ["--run-id", latest[0]]):
        for extra in ([], ["--from-spans"]):  # from the stored summary, and from the spans
            got = report_jaeger(stack, tmp_path, service, "--step", "1", "--json", *pick, *extra)
            assert got.returncode == 0, got.stderr
            assert json.loads(got.stdout)["metrics"]["agent_loop/num_samples"] == NEW_SAMPLES
            assert _run_line(got.stderr).startswith(f"report: run {new}"), got.stderr

    # the old run's step 3 when asked for by its id
    for extra in ([], ["--from-spans"]):
        got = report_jaeger(stack, tmp_path, service, "--step", "3", "--json", "--run-id", old, *extra)
        assert got.returncode == 0, got.stderr
        assert json.loads(got.stdout)["metrics"]["agent_loop/num_samples"] == OLD_SAMPLES
        assert _run_line(got.stderr).startswith(f"report: run {old}"), got.stderr
