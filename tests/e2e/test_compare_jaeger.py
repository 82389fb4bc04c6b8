"""``report --jaeger URL --compare 2 5`` on the real Jaeger (api_v3): a job whose tool ``search`` gets 10x slower
from step 3 on sends its spans over OTLP/gRPC through the real Collector; the comparison read back from Jaeger
names that tool, with the same numbers as the one read from the job's trace file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

DRIVER = Path(__file__).resolve().parents[1] / "_support" / "slow_tool_driver.py"


def test_compare_from_jaeger_names_the_slowed_tool(stack, tmp_path) -> None:
    service = f"compare-{uuid.uuid4().hex[:6]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    job = subprocess.run(
        [sys.executable, str(DRIVER), "--file", "run.jsonl", "--service", service, "--slow", "search"],
        cwd=tmp_path,
        # traces only: this test reads Jaeger, and leaves the shared Collector's Prometheus exporter to test_live
        env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": stack.otlp_grpc_endpoint, "OTEL_METRICS_EXPORTER": "none"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert job.returncode == 0, job.stderr

    def compare(*source: str) -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-m", "otel_agentloop", "report", *source, "--compare", "2", "5", "--json"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode in (0, 1), out.stderr
        return json.loads(out.stdout) if out.returncode == 0 else {}

    def comparable(found: dict[str, Any]) -> Any:
        """The figures that must equal the file's: per-phase and per-tool rows without the mean (spans arrive in
        another order from Jaeger, so a sum may differ in its last bit), the cause and the samples that moved."""
        rows = [{k: v for k, v in row.items()} for row in found.get("rows", ())]
        for row in rows:
            for side in ("a", "b"):
                row[side] = {k: v for k, v in row[side].items() if k != "mean"}
        return rows, found.get("cause"), found.get("moved")

    from_file = compare("--file", "run.jsonl")
    assert (from_file["cause"]["phase"], from_file["cause"]["tool"]) == ("tool_calls", "search")
    deadline = time.monotonic() + 90
    while True:  # until Jaeger has stored every span of both steps (and their summaries): then it equals the file
        got = compare("--jaeger", stack.jaeger_url, "--service", service)
        if got and comparable(got) == comparable(from_file):
            break
        assert time.monotonic() < deadline, f"Jaeger's comparison never equalled the file's: {got and got['a']}"
        time.sleep(1)
    assert (got["cause"]["phase"], got["cause"]["tool"]) == ("tool_calls", "search")
    assert got["a"]["num_samples"] == got["b"]["num_samples"] == 16
    assert got["a"]["summary"] == got["b"]["summary"] == "stored"
