"""Jobs and ``report`` against a real Jaeger (tests/e2e): an environment without the outer ``OTEL_*`` (with a run id),
``report --jaeger`` in a subprocess, and a wait until Jaeger has stored a number of samples and step summaries."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import JaegerClient, decode_resource_spans


def wait_stored(stack: Any, service: str, samples: int, summaries: int) -> None:
    client = JaegerClient(stack.jaeger_url)
    start = datetime.now(timezone.utc) - timedelta(minutes=10)
    end = datetime.now(timezone.utc) + timedelta(minutes=1)

    def counts(rs: list[dict[str, Any]]) -> tuple[int, int]:
        records = list(decode_resource_spans(rs))
        return sum(r.name == sc.SAMPLE_SPAN for r in records), sum(r.name == sc.STEP_SUMMARY_SPAN for r in records)

    got = client.wait_for(
        lambda: client.find_all_traces(service, start, end, search_depth=1000).resource_spans,
        lambda rs: counts(rs) == (samples, summaries),
        90,
    )
    assert counts(got) == (samples, summaries)


def run_env(run: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if run:
        env["OTEL_RESOURCE_ATTRIBUTES"] = f"{sc.RL_RUN_ID}={run},{sc.RL_RUN_ATTEMPT}=1"
        env["OTEL_AGENTLOOP_RUN_ID"], env["OTEL_AGENTLOOP_RUN_ATTEMPT"] = run, "1"  # the live side's names
    return env


def report_jaeger(stack: Any, cwd: Path, service: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "report", "--jaeger", stack.jaeger_url, "--service", service, *args],
        cwd=cwd, env=run_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
