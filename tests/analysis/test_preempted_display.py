"""verl's ``num_preempted`` -1 (the engine reported no count) is explained where `report` shows it (issue 38, item
8): ``n/a`` in the grid and the slowest line when every sample has it, a line under the table when some do; the
metric values stay verl's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from otel_agentloop.analysis._rendering._display import NOT_REPORTED, metrics_table

DRIVER = """
import asyncio, sys
import otel_agentloop as oal

handle = oal.configure(service_name="npre", file=sys.argv[1], watchdog=False)
known = sys.argv[2] == "some"

@oal.trace_generate(model="m")
async def generate(i):
    await asyncio.sleep(0.01 * (i + 1))
    oal.record_generation(output_tokens=3, num_preempted=1 if known and i % 2 else None)

async def one(i):
    async with oal.sample(i, rollout_n=0):
        await generate(i)

async def main():
    with oal.step(0):
        await asyncio.gather(*(one(i) for i in range(4)))
    metrics = handle.metrics.collect(0)
    print(metrics["agent_loop/num_preempted/min"], metrics["agent_loop/num_preempted/max"])

asyncio.run(main())
handle.shutdown(5)
"""


def _report(tmp_path: Path, which: str) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    path = tmp_path / f"{which}.jsonl"
    made = subprocess.run([sys.executable, "-c", DRIVER, str(path), which], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert made.returncode == 0, made.stderr
    out = subprocess.run([sys.executable, "-m", "otel_agentloop", "report", "--file", str(path), "--step", "0"],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return made.stdout.strip(), out.stdout


@pytest.mark.e2e  # a subprocess
def test_every_sample_unreported_shows_na_and_says_why(tmp_path: Path) -> None:
    values, out = _report(tmp_path, "none")
    assert values == "-1.0 -1.0"  # verl's values, unchanged
    row = next(line for line in out.splitlines() if line.startswith("num_preempted"))
    assert row.split() == ["num_preempted", "n/a", "n/a", "n/a"]
    assert "num_preempted n/a" in next(line for line in out.splitlines() if line.startswith("slowest:"))
    assert f"num_preempted n/a: {NOT_REPORTED}, for every sample" in out
    assert "num_preempted -1" not in out


@pytest.mark.e2e  # a subprocess
def test_some_samples_unreported_keep_verls_values_and_get_a_line(tmp_path: Path) -> None:
    values, out = _report(tmp_path, "some")
    assert values == "-1.0 1.0"
    row = next(line for line in out.splitlines() if line.startswith("num_preempted"))
    assert row.split() == ["num_preempted", "-1", "0.00", "1"]  # verl: (-1 + 1 - 1 + 1) / 4
    assert f"num_preempted -1: {NOT_REPORTED}; verl's min and mean include those -1s" in out


def test_known_counts_get_no_note() -> None:
    p = "agent_loop"
    metrics = {f"{p}/num_preempted/min": 0.0, f"{p}/num_preempted/mean": 0.5, f"{p}/num_preempted/max": 2.0}
    text = metrics_table(metrics)
    assert NOT_REPORTED not in text and "n/a" not in text
    assert "num_preempted               0     0.50" in text
