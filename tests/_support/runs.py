"""Runs of the simulated main job for the run-view tests: the CLI in a subprocess (with a run id and attempt),
a three-step launch into a rolled trace folder, a driver script that writes step summaries, and the check that
``report``'s metrics equal what ``collect()`` returned."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import otel_agentloop as oal
from otel_agentloop import semconv as sc

COMPARED = ("generate_sequences", "tool_calls", "compute_score", "num_samples", "slowest")


def assert_same_metrics(report: dict[str, float], collected: dict[str, float]) -> None:
    """``report``'s ``agent_loop/`` keys of the COMPARED families equal ``collect()``'s (and there are over 20)."""
    keys = [k for k in collected if k.startswith("agent_loop/") and k.split("/")[1] in COMPARED]
    assert len(keys) > 20
    assert {k: report[k] for k in keys} == pytest.approx({k: collected[k] for k in keys}, rel=1e-6, abs=2e-9)


SUMMARY_DRIVER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from opentelemetry import trace
    import otel_agentloop as oal
    from otel_agentloop import semconv as sc
    from otel_agentloop.metrics._summary import summarize
    from otel_agentloop.metrics._table import PhaseTable, compute_metrics

    def table(n, rng, t0):
        z = np.zeros(n, np.int64)
        start = t0 + rng.integers(0, 10**8, n)
        return PhaseTable(
            sample_index=np.arange(n, dtype=np.int64) // 2, rollout_n=np.arange(n, dtype=np.int64) % 2,
            generate_sequences=rng.gamma(2.0, 0.5, n), tool_calls=rng.gamma(1.0, 0.2, n),
            compute_score=rng.gamma(1.0, 0.05, n), num_preempted=z, prompt_length=z - 1, response_length=z - 1,
            error=np.arange(n) % 7 == 0, trace_id_hi=rng.integers(1, 2**62, n, dtype=np.uint64),
            trace_id_lo=rng.integers(1, 2**62, n, dtype=np.uint64),
            start_ns=start, end_ns=start + rng.integers(10**9, 5 * 10**9, n))

    run, dest = sys.argv[1], sys.argv[2]  # a file, or an OTLP/gRPC endpoint (http://...)
    where = {"endpoint": dest, "protocol": "grpc"} if dest.startswith("http") else {"file": dest}
    handle = oal.configure(resource_attributes={sc.RL_RUN_ID: run, sc.RL_RUN_ATTEMPT: 1}, trace_per="sample", **where)
    tracer = trace.get_tracer("summary-writer")
    rng = np.random.default_rng(5)
    for step in (1, 2, 3):
        t = table(16, rng, 1_700_000_000 * 10**9 + step * 10**10)
        s = summarize(t, compute_metrics(t), step, tools={"search": [0.1, 0.2 * step]}, staleness=[0, 1, 1])
        with tracer.start_as_current_span(sc.SAMPLE_SPAN, attributes={sc.RL_STEP: step, sc.RL_SAMPLE_INDEX: 0}):
            pass  # a sample span in the same file: the run view must not need it
        tracer.start_span(sc.STEP_SUMMARY_SPAN, attributes={
            sc.RL_STEP: step, sc.RL_VALIDATE: False, sc.RL_STEP_SUMMARY: s.to_json()}).end()
        print(s.to_json())
    handle.shutdown()
    """
)
RUN = "scale"
TRACES = "traces"


def cli(cwd: Path, *args: str, run: str | None = None, attempt: int = 1) -> subprocess.CompletedProcess[str]:
    """The CLI as a subprocess; a first argument ``NAME=value`` is set in its environment."""
    extra = {}
    if args and "=" in args[0]:
        name, _, value = args[0].partition("=")
        extra[name], args = value, args[1:]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if run is not None:
        env["OTEL_RESOURCE_ATTRIBUTES"] = f"{sc.RL_RUN_ID}={run},{sc.RL_RUN_ATTEMPT}={attempt}"
        env["OTEL_AGENTLOOP_RUN_ID"], env["OTEL_AGENTLOOP_RUN_ATTEMPT"] = run, str(attempt)
    return subprocess.run(
        [sys.executable, "-m", "otel_agentloop", *args],
        cwd=cwd,
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=180,
    )


def simulate_run(cwd: Path, *, seed: int, attempt: int, fast_path: bool = True) -> dict[tuple[int, bool], Any]:
    """One launch of the main job (3 steps, a validation pass at step 2) into ``cwd/traces``."""
    out = cli(
        cwd,
        "OTEL_AGENTLOOP_FAST_PATH=" + ("true" if fast_path else "false"),
        *("simulate", "--workers", "0", "--steps", "3", "--prompts", "3", "--rollout-n", "2", "--val-every", "2"),
        *("--time-scale", "0.03", "--seed", str(seed), "--quiet", "--json", "--file", TRACES),
        run=RUN,
        attempt=attempt,
    )
    assert out.returncode == 0, out.stderr
    return {(e["step"], False): e["metrics"] for e in json.loads(out.stdout)}  # training steps only


def report_file(cwd: Path, *args: str) -> tuple[int, str, str]:
    out = cli(cwd, "report", "--file", TRACES, *args)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, out.stdout, out.stderr


# -- in-process drivers through the public API ---------------------------------------------------------
@oal.trace_generate(model="m")
async def traced_generate(i: int, *, flush: bool = False) -> int:
    handle = oal.current_handle()
    assert handle is not None and handle.provider is not None  # not the global provider: another test may own it
    with handle.provider.get_tracer("user").start_as_current_span("user.child"):  # the user's SDK span: no rl.step
        await asyncio.sleep(0.002)
    if flush:  # the child is exported now, alone, before any stepped span of its trace
        assert handle.force_flush(10)
    await asyncio.sleep(0.002)
    return i
