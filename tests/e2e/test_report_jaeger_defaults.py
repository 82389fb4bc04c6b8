"""``report --jaeger`` finds the user's traces by itself, against the real Jaeger (api_v3) behind the real Collector.

A run of a service other than the demo's, its spans three days old (written with explicit start and end times over
OTLP, as a job that ran earlier): found with no ``--service`` (every service with agent-loop spans) and with
``OTEL_SERVICE_NAME``, over the store's whole retention (``--search-depth`` still splits the window from the
epoch); ``--since`` narrows it. Each "nothing found" case is one line naming what was searched and what exists. A
run page from Jaeger has its step pages and warns about missing summaries only when a step lacks one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import JaegerClient, decode_resource_spans
from otel_agentloop.analysis._reading._source import EPOCH
from tests._support.runs import SUMMARY_DRIVER

SAMPLES = 12
AGE = timedelta(days=3)


def _env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}, **extra}


def _report(stack: Any, cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "report", "--jaeger", stack.jaeger_url, *args],
        cwd=cwd, env=env or _env(), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert "Traceback" not in out.stderr, out.stderr
    return out


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.fixture(scope="module")
def old_run(stack: Any) -> tuple[str, str]:
    """(service, run id): steps 1 and 2 of 12 samples each (a generation and a tool call in each), three days old."""
    tag = uuid.uuid4().hex[:6]
    service, run = f"grpo-{tag}", f"old-{tag}"
    provider = TracerProvider(resource=Resource.create({"service.name": service, sc.RL_RUN_ID: run}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=stack.otlp_grpc_endpoint, insecure=True)))
    tracer = provider.get_tracer("old-job")
    t0 = time.time_ns() - int(AGE.total_seconds() * 1e9)
    for step in (1, 2):
        for i in range(SAMPLES):
            start = t0 + step * 60 * 10**9 + i * 10**7
            ids = {sc.RL_STEP: step, sc.RL_SAMPLE_INDEX: i, sc.RL_ROLLOUT_N: 0}
            root = tracer.start_span(sc.SAMPLE_SPAN, attributes=ids, start_time=start)
            with_root = trace.set_span_in_context(root)
            gen = {**ids, sc.RL_PHASE: sc.GENERATE}
            tool = {**ids, sc.RL_PHASE: sc.TOOL_CALLS, sc.GEN_AI_TOOL_NAME: "search"}
            end_gen = start + (1 + i) * 10**7
            tracer.start_span("text_completion m", context=with_root, attributes=gen, start_time=start).end(end_gen)
            end = end_gen + step * 10**7
            tracer.start_span("execute_tool search", context=with_root, attributes=tool, start_time=end_gen).end(end)
            root.end(end_time=end)
    provider.shutdown()
    client = JaegerClient(stack.jaeger_url)
    got = client.wait_for(
        lambda: client.find_all_traces(service, EPOCH, datetime.now(timezone.utc)).resource_spans,
        lambda rs: sum(r.name == sc.SAMPLE_SPAN for r in decode_resource_spans(rs)) == 2 * SAMPLES,
        60,
    )
    assert sum(r.name == sc.SAMPLE_SPAN for r in decode_resource_spans(got)) == 2 * SAMPLES
    return service, run


def _metrics(out: subprocess.CompletedProcess[str]) -> dict[str, float]:
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout)["metrics"])


def test_without_service_every_service_with_agent_loop_spans_is_read_over_all_time(stack, old_run, tmp_path) -> None:
    _service, run = old_run
    listing = _report(stack, tmp_path, "--runs")
    assert listing.returncode == 0, listing.stderr
    listed = any(line.lstrip("* ").split()[0] == run for line in listing.stdout.splitlines()[1:])
    # the old run wrote no step summaries: listed when it is all Jaeger holds, else named as not listed (the
    # session's Jaeger holds other tests' runs, which have summaries)
    assert listed or "runs that wrote no step summaries (older traces) are not listed" in listing.stderr, listing
    note = listing.stderr.splitlines()[0]
    assert note.startswith("report: reading service"), listing.stderr
    assert "every service with agent-loop spans; --service or OTEL_SERVICE_NAME picks one" in note
    assert note.endswith("over all it stores")
    step = _report(stack, tmp_path, "--run-id", run, "--step", "2", "--json")
    assert _metrics(step)["agent_loop/num_samples"] == SAMPLES


def test_otel_service_name_is_the_default_service(stack, old_run, tmp_path) -> None:
    service, _ = old_run
    env = _env(OTEL_SERVICE_NAME=service)
    out = _report(stack, tmp_path, "--json", env=env)  # the latest run of that service only: the old one
    metrics = _metrics(out)
    assert metrics["agent_loop/num_samples"] == SAMPLES and metrics["agent_loop/tool_calls/max"] > 0
    assert (
        out.stderr.splitlines()[0] == f"report: reading service {service} (OTEL_SERVICE_NAME; --service picks another)"
    )


def test_search_depth_still_splits_the_window_from_the_epoch(stack, old_run, tmp_path) -> None:
    service, _ = old_run
    out = _report(stack, tmp_path, "--service", service, "--step", "1", "--json", "--search-depth", "4")
    assert "INCOMPLETE" not in out.stderr
    assert _metrics(out)["agent_loop/num_samples"] == SAMPLES  # 12 traces read 4 at a time


def _nothing(stack: Any, tmp_path: Path, *args: str) -> str:
    out = _report(stack, tmp_path, *args)
    assert out.returncode == 1 and out.stdout == ""
    return _one_line(out.stderr)


@pytest.mark.parametrize("mode", [(), ("--runs",), ("--run",)])
def test_since_narrows_the_window_and_nothing_found_says_what_exists(
    stack, old_run, tmp_path, mode: Sequence[str]
) -> None:
    service, _ = old_run
    line = _nothing(stack, tmp_path, "--service", service, "--since", "1h", *mode)
    what = "no sample spans" if not mode else "no spans" if mode == ("--runs",) else "no steps"
    assert line.startswith(
        f"report: {what} found in Jaeger {stack.jaeger_url} for service {service} (--service) over the last 60 min "
        "(--since); Jaeger lists services: "
    ), line
    assert line.endswith(f" besides {service}")


def test_an_unknown_service_lists_the_services_there_are(stack, old_run, tmp_path) -> None:
    service, _ = old_run
    line = _nothing(stack, tmp_path, "--service", "no-such-svc")
    assert line.startswith(
        f"report: no sample spans found in Jaeger {stack.jaeger_url} for service no-such-svc (--service) over all "
        "it stores; Jaeger lists services: "
    ), line
    if "more besides" not in line:
        assert service in line


def test_a_missing_step_lists_the_steps_there_are(stack, old_run, tmp_path) -> None:
    service, run = old_run
    out = _report(stack, tmp_path, "--service", service, "--step", "9")
    assert out.returncode == 1 and out.stdout == ""
    # this Jaeger (2.13) ignores query.attributes, so the step search returns the service's traces: the run's steps;
    # the run read is always said (issue 38)
    assert out.stderr.strip().splitlines() == [
        f"report: run {run}",
        f"report: no samples for step 9 in {stack.jaeger_url} (service {service}) (found steps: 1, 2)",
    ]


def test_run_page_from_jaeger_has_its_step_pages_and_no_false_warning(stack, tmp_path) -> None:
    """The live side wrote a summary for each step: every step gets its timeline page (fetched from Jaeger), and
    nothing says that steps without a summary are hidden."""
    service = f"page-{uuid.uuid4().hex[:6]}"
    sim = subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "simulate", "--workers", "0", "--steps", "2", "--prompts", "3",
         "--rollout-n", "2", "--time-scale", "0.03", "--val-every", "0", "--quiet", "--endpoint",
         stack.otlp_grpc_endpoint, "--service-name", service],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert sim.returncode == 0, sim.stderr
    client = JaegerClient(stack.jaeger_url)
    client.wait_for(
        lambda: client.find_all_traces(service, EPOCH, datetime.now(timezone.utc)).resource_spans,
        lambda rs: (
            sum(r.name == sc.STEP_SUMMARY_SPAN for r in decode_resource_spans(rs)) == 2
            and sum(r.name == sc.SAMPLE_SPAN for r in decode_resource_spans(rs)) == 12
        ),
        60,
    )
    out = _report(stack, tmp_path, "--service", service, "--run", "--html", "run.html")
    assert out.returncode == 0, out.stderr
    assert "run page written to run.html (2 steps, 2 timeline pages)" in out.stdout
    for step in (1, 2):
        assert (tmp_path / "run.steps" / f"step-{step}.html").is_file()
    assert "searched Jaeger for rl.step.summary spans only" in out.stderr
    assert "no stored summary" not in out.stderr and "not shown" not in out.stderr
    text = (tmp_path / "run.html").read_text()
    data = json.loads(text.split('type="application/json">', 1)[1].split("</script>", 1)[0])
    assert data["jaeger"] is None and not any("not shown" in n for n in data["notes"])
    assert [row[data["fields"].index("page")] for row in data["steps"]] == [
        "run.steps/step-1.html",
        "run.steps/step-2.html",
    ]


def test_run_page_from_summaries_warns_of_the_steps_without_one(stack, tmp_path) -> None:
    """Summaries of steps 1 and 3 only (the live side wrote none for step 2): the page and stderr name step 2."""
    service = f"gap-{uuid.uuid4().hex[:6]}"
    (tmp_path / "driver.py").write_text(SUMMARY_DRIVER.replace("for step in (1, 2, 3):", "for step in (1, 3):"))
    env = _env(OTEL_SERVICE_NAME=service)
    out = subprocess.run(
        [sys.executable, "driver.py", "gap", stack.otlp_grpc_endpoint],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    client = JaegerClient(stack.jaeger_url)
    client.wait_for(
        lambda: client.find_all_traces(service, EPOCH, datetime.now(timezone.utc)).resource_spans,
        lambda rs: sum(r.name == sc.STEP_SUMMARY_SPAN for r in decode_resource_spans(rs)) == 2,
        60,
    )
    page = _report(stack, tmp_path, "--run", "--html", "run.html", "--step-pages", "0", env=env)
    assert page.returncode == 0, page.stderr
    warning = (
        "report: step 2 has no stored summary and is not shown (only step summaries were read; report --step N "
        "reads a step's spans)"
    )
    assert warning in page.stderr.splitlines(), page.stderr
