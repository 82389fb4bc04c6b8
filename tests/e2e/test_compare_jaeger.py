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

DRIVER = Path(__file__).resolve().parents[1] / "slow_tool_driver.py"


def test_compare_from_jaeger_names_the_slowed_tool(stack, tmp_path) -> None:
    service = f"compare-{uuid.uuid4().hex[:6]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    job = subprocess.run(
        [sys.executable, str(DRIVER), "--file", "run.jsonl", "--service", service, "--slow", "search"],
        cwd=tmp_path,
        env={**env, "OTEL_EXPORTER_OTLP_ENDPOINT": stack.otlp_grpc_endpoint},
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

    deadline = time.monotonic() + 60
    while True:  # until Jaeger has stored every sample of both steps
        got = compare("--jaeger", stack.jaeger_url, "--service", service)
        if got and got["a"]["num_samples"] == got["b"]["num_samples"] == 16:
            break
        assert time.monotonic() < deadline, f"Jaeger never had both steps' 16 samples: {got and got['a']}"
        time.sleep(1)
    assert (got["cause"]["phase"], got["cause"]["tool"]) == ("tool_calls", "search")
    from_file = compare("--file", "run.jsonl")
    # per-phase and per-tool figures equal the file's (a mean may differ in its last bit: spans arrive in
    # another order from Jaeger, so the sum runs in another order)
    for jaeger_row, file_row in zip(got["rows"], from_file["rows"], strict=True):
        for side in ("a", "b"):
            jaeger_row[side].pop("mean")
            file_row[side].pop("mean")
        assert jaeger_row == file_row
    assert got["cause"] == from_file["cause"] and got["moved"] == from_file["moved"]
