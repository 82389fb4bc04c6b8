"""The main job's live view and ``simulate --misbehave``: a hung and a slow tool call, seen while they run,
reported by the watchdog, snapshotted into the trace file, classified hung/slow; in process and on Ray."""

from __future__ import annotations

import importlib.util
import json
import os
import pty
import re
import subprocess
import sys

import pytest

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import build_report, read_traces

pytestmark = pytest.mark.e2e  # simulated runs in subprocesses, one on Ray

ARGS = ["--steps", "3", "--misbehave", "--time-scale", "0.1", "--val-every", "0", "--prompts", "3", "--rollout-n", "2"]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


def _run(tmp_path, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "simulate", *ARGS, *extra],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )


def test_misbehave_shows_live_samples_and_classifies_the_hung_and_the_slow_one(tmp_path) -> None:
    done = _run(tmp_path, "--json", "--live-every", "0.3")
    err = done.stderr
    # live view (not a terminal: periodic lines) while step 3 runs: the stuck samples, then flagged overdue
    assert "step 3:" in err and "in flight:" in err and "tool_calls 2 (sandbox 2)" in err
    assert "oldest: sample 0/0 (step 3)" in err and "OVERDUE" in err
    # one watchdog warning per reported sample: the hung one and the slow one (under load another sample's tool
    # call can truly pass the 1 s threshold: it is then reported slow, once, and counted as such)
    warnings = [line for line in err.splitlines() if "watchdog: sample" in line]
    results = json.loads(done.stdout)
    step3 = results[2]
    verdicts = step3["verdicts"]
    assert len(warnings) == verdicts["slow"] + verdicts["hung"] and any("sample 0/0 (step 3)" in w for w in warnings)
    assert any("sample 1/0 (step 3)" in w for w in warnings), warnings
    assert step3["metrics"]["agent_loop/watchdog/hung"] == 1.0
    assert step3["metrics"]["agent_loop/watchdog/slow"] == verdicts["slow"] >= 1
    assert step3["failed_samples"] == 0  # the hung one is hung, not failed (cancelled after collection)
    assert verdicts["hung"] == 1 and verdicts["failed"] == 0 and sum(verdicts.values()) == 6, verdicts
    assert not any(k.startswith("agent_loop/watchdog") for r in results[:2] for k in r["metrics"])
    (hung,), slow = step3["hung_trace_ids"], step3["slow_trace_ids"]
    assert len(slow) == verdicts["slow"] and hung not in slow
    # the trace file holds one snapshot per reported sample, in its trace, and the sample spans themselves
    records = list(read_traces(str(tmp_path / "otel-agentloop-traces")))
    snapshots = [r for r in records if r.attributes.get(sc.RL_SNAPSHOT)]
    snaps = {r.trace_id_hex: r for r in snapshots}
    assert len(snaps) == len(snapshots) and set(snaps) == {hung, *slow}
    assert snaps[hung].attributes[sc.RL_SAMPLE_INDEX] == 0 and snaps[hung].attributes[sc.GEN_AI_TOOL_NAME] == "sandbox"
    roots = {r.trace_id_hex: r for r in records if r.name == sc.SAMPLE_SPAN}
    assert roots[hung].attributes.get(sc.RL_CANCELLED) is True  # ended by the cancellation after collection
    assert snaps[hung].parent_id == roots[hung].span_id
    # rebuilt from the file, the hung sample's tool time is its sandbox span, not the (longer) snapshot
    report = build_report(records, 3, False)
    sandbox = next(r for r in records if r.trace_id_hex == hung and r.name == "execute_tool sandbox")
    t = report.table.canonical()
    row = next(i for i in range(len(t)) if (t.sample_index[i], t.rollout_n[i]) == (0, 0))
    assert t.tool_calls[row] == pytest.approx((sandbox.end_ns - sandbox.start_ns) / 1e9, abs=1e-6)
    assert snaps[hung].start_ns == roots[hung].start_ns and snaps[hung].end_ns < roots[hung].end_ns
    # live, the hung sample was still running at collection: left out and counted in flight; the trace file
    # has it ended (cancelled) after the collect, and the rebuilt step counts it only when told nothing of
    # the watchdog (report itself leaves it out: tests/analysis/test_one_verdict.py)
    assert step3["metrics"]["agent_loop/num_samples"] == 5
    assert step3["metrics"]["agent_loop/telemetry/samples_in_flight"] == 1
    assert report.metrics["agent_loop/num_samples"] == 6


def test_live_view_redraws_in_place_on_a_terminal(tmp_path) -> None:
    master, slave = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "otel_agentloop", "simulate", *ARGS],
            cwd=tmp_path,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
            timeout=240,
            check=True,
        )
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
    screen = b"".join(chunks).decode(errors="replace")
    # redrawn in place: rich.live (the cli extra) erases lines and moves the cursor up; without rich (or on a
    # dumb TERM) the plain view moves up and clears to the end
    rich_redraw = "\x1b[2K" in screen and "\x1b[1A" in screen
    plain_redraw = "\x1b[J" in screen and "F" in screen
    assert (
        rich_redraw
        if importlib.util.find_spec("rich") and os.environ.get("TERM") not in ("dumb", "unknown")
        else plain_redraw
    )
    assert "in flight:" in screen and "OVERDUE" in screen
    assert "watchdog: hung: sample 0/0 in tool_calls sandbox" in proc.stdout
    # every frame adds up: the bar's done count and the in-flight lines under it are taken together
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen)
    frames = re.findall(r"(\d+)/(\d+) +[\d.]+s\r?\nin flight: +(\d+)", text)
    assert frames
    for done, total, inflight in frames:
        assert int(done) + int(inflight) <= int(total), (done, total, inflight)


def test_misbehave_on_ray_workers(tmp_path) -> None:
    pytest.importorskip("ray") if not os.environ.get("CI") else None
    done = _run(tmp_path, "--workers", "2", "--live-every", "0.5", timeout=300)
    assert "in flight:" in done.stderr and "OVERDUE" in done.stderr  # gathered from the workers
    assert "watchdog: hung: sample 0/0 in tool_calls sandbox" in done.stdout
    assert "watchdog: slow: sample 1/0 in tool_calls sandbox" in done.stdout
    records = list(read_traces(str(tmp_path / "otel-agentloop-traces")))
    snaps = [r for r in records if r.attributes.get(sc.RL_SNAPSHOT)]
    # the hung and the slow sample's snapshots, each taken on a worker; under load another sample's tool call can
    # truly pass the 1 s threshold too, and is then snapshotted as well (its own sample, once)
    keys = [(r.attributes[sc.RL_SAMPLE_INDEX], r.attributes[sc.RL_ROLLOUT_N]) for r in snaps]
    assert {(0, 0), (1, 0)} <= set(keys) and len(keys) == len(set(keys)), keys
    assert all(r.resource["process.pid"] != os.getpid() for r in snaps)
