"""Runs and paging against the real Jaeger (api_v3): two runs under one service name, each reported with its own
numbers; a step of 64 samples read completely with a search depth of 8 (the time window is split); what cannot be
split is reported as missing; the run view searches the step summaries only."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import JaegerClient, decode_resource_spans
from otel_agentloop.metrics import StepSummary
from tests._support.jaeger_runs import report_jaeger, run_env
from tests._support.runs import SUMMARY_DRIVER, assert_same_metrics


def _simulate(stack: Any, cwd: Path, service: str, run: str, prompts: int, rollouts: int) -> dict[int, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "simulate", "--workers", "0", "--steps", "1", "--prompts",
         str(prompts), "--rollout-n", str(rollouts), "--time-scale", "0.03", "--val-every", "0", "--quiet", "--json",
         "--endpoint", stack.otlp_grpc_endpoint, "--service-name", service],
        cwd=cwd, env=run_env(run), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return {e["step"]: e["metrics"] for e in json.loads(out.stdout) if not e.get("validate")}


def _wait_samples(stack: Any, service: str, n: int) -> None:
    client = JaegerClient(stack.jaeger_url)
    start = datetime.now(timezone.utc) - timedelta(minutes=5)
    end = datetime.now(timezone.utc) + timedelta(minutes=1)
    got = client.wait_for(
        lambda: client.find_all_traces(service, start, end, search_depth=400).resource_spans,
        lambda rs: sum(r.name == sc.SAMPLE_SPAN for r in decode_resource_spans(rs)) >= n,
        60,
    )
    assert sum(r.name == sc.SAMPLE_SPAN for r in decode_resource_spans(got)) == n


def test_two_runs_in_jaeger_each_with_its_own_numbers_read_completely_past_the_search_depth(stack, tmp_path) -> None:
    service = f"runs-{uuid.uuid4().hex[:6]}"
    alpha = _simulate(stack, tmp_path, service, "alpha", 4, 2)  # 8 samples
    beta = _simulate(stack, tmp_path, service, "beta", 16, 4)  # 64 samples, started later: the default
    _wait_samples(stack, service, 72)
    for run, expected, n in (("alpha", alpha, 8), ("beta", beta, 64), (None, beta, 64)):
        pick = ["--run-id", run] if run else []
        out = report_jaeger(stack, tmp_path, service, "--step", "1", "--json", "--search-depth", "8", *pick)
        assert out.returncode == 0, out.stderr
        assert "INCOMPLETE" not in out.stderr
        metrics = json.loads(out.stdout)["metrics"]
        assert metrics["agent_loop/num_samples"] == n  # was 20 of 64 with --search-depth 20, and runs merged
        assert_same_metrics(metrics, expected[1])
    listing = report_jaeger(stack, tmp_path, service, "--runs", "--search-depth", "8")
    assert listing.returncode == 0, listing.stderr
    rows = {line.lstrip("* ").split()[0]: line.lstrip("* ").split() for line in listing.stdout.splitlines()[1:]}
    assert rows["alpha"][5] == "8" and rows["beta"][5] == "64"
    # the run view of one run: its step with its own numbers (stored summaries, or rebuilt from the spans when
    # the live side wrote none), and the step's timeline page from its spans
    run = report_jaeger(stack, tmp_path, service, "--run", "--run-id", "alpha", "--json", "--search-depth", "8")
    assert run.returncode == 0, run.stderr
    (step,) = json.loads(run.stdout)["steps"]
    assert step["n"] == 8
    assert_same_metrics(step["metrics"], alpha[1])
    args = ("--run", "--run-id", "alpha", "--html", "run.html", "--search-depth", "8", "--step-pages", "1")
    page = report_jaeger(stack, tmp_path, service, *args)
    assert page.returncode == 0, page.stderr
    assert "INCOMPLETE" not in page.stderr
    assert "(1 step, 1 timeline page)" in page.stdout and (tmp_path / "run.steps" / "step-1.html").exists()


def test_a_window_that_cannot_be_split_is_reported_as_missing(stack, tmp_path) -> None:
    """30 traces starting in the same nanosecond: no time split separates them, so a search depth of 10 cannot
    fetch them all; the report says so (never a silent partial answer)."""
    service = f"dense-{uuid.uuid4().hex[:6]}"
    provider = TracerProvider(resource=Resource.create({"service.name": service, sc.RL_RUN_ID: "dense"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=stack.otlp_grpc_endpoint, insecure=True)))
    tracer = provider.get_tracer("dense")
    t0 = time.time_ns() - 10**9
    for i in range(30):
        attrs = {sc.RL_STEP: 1, sc.RL_SAMPLE_INDEX: i, sc.RL_ROLLOUT_N: 0}
        tracer.start_span(sc.SAMPLE_SPAN, attributes=attrs, start_time=t0).end(end_time=t0 + 10**6)
    provider.shutdown()
    _wait_samples(stack, service, 30)
    out = report_jaeger(stack, tmp_path, service, "--step", "1", "--json", "--search-depth", "10")
    assert out.returncode == 0, out.stderr
    # the traces share one instant: one 1 us window holds them, or two when the instant is a split point (both
    # halves include it, and each may return another 10 of the 30); either way the answer says what it fetched
    fetched = re.search(r"NOT fetched \((\d+) traces were\)", out.stderr)
    assert "INCOMPLETE" in out.stderr and "(10 traces)" in out.stderr and fetched is not None, out.stderr
    assert 10 <= int(fetched.group(1)) < 30
    assert json.loads(out.stdout)["metrics"]["agent_loop/num_samples"] == int(fetched.group(1))
    whole = report_jaeger(
        stack, tmp_path, service, "--step", "1", "--json", "--search-depth", "31"
    )  # 30 is a full page
    assert "INCOMPLETE" not in whole.stderr and json.loads(whole.stdout)["metrics"]["agent_loop/num_samples"] == 30
    # no step summaries under this service: the run view fetches every trace (paged) and rebuilds the step
    run = report_jaeger(stack, tmp_path, service, "--run", "--json", "--search-depth", "31")
    assert run.returncode == 0, run.stderr
    assert "every trace was fetched" in run.stderr and "rebuilt from their spans" in run.stderr
    assert [s["n"] for s in json.loads(run.stdout)["steps"]] == [30]


def test_run_view_from_jaeger_searches_the_step_summaries_only(stack, tmp_path) -> None:
    service = f"summaries-{uuid.uuid4().hex[:6]}"
    (tmp_path / "driver.py").write_text(SUMMARY_DRIVER)
    env = run_env()
    env["OTEL_SERVICE_NAME"] = service
    out = subprocess.run(
        [sys.executable, "driver.py", "stored", stack.otlp_grpc_endpoint],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    written = [StepSummary.from_json(line) for line in out.stdout.splitlines()]
    _wait_samples(stack, service, 3)
    got = report_jaeger(stack, tmp_path, service, "--run", "--json", "--search-depth", "2")
    assert got.returncode == 0, got.stderr
    assert f"searched Jaeger for {sc.STEP_SUMMARY_SPAN} spans only" in got.stderr
    body = json.loads(got.stdout)
    assert body["run"] == "stored" and body["rebuilt"] == []
    assert [StepSummary.from_json(json.dumps(s)) for s in body["steps"]] == written
    # the page from the summaries; --step-pages fetches the chosen steps' spans (here: one sample span each)
    page = report_jaeger(stack, tmp_path, service, "--run", "--html", "run.html", "--step-pages", "2", "--steps", "2:3")
    assert page.returncode == 0, page.stderr
    assert "run page written to run.html (2 steps, 2 timeline pages)" in page.stdout
    assert sorted(os.listdir(tmp_path / "run.steps")) == ["step-2.html", "step-3.html"]
