"""Step time of TRL's GRPOTrainer with and without ``integrations.trl.instrument()``, side by side in one process.

Real GRPOTrainer on CPU, a tiny Qwen2 made locally (tests/trl/grpo_run.py), fast reward functions only (so the
ratio is not diluted by a sleep). Runs the plain and the instrumented training alternately, ``--pairs`` times, each
``--steps`` steps, and compares TRL's own logged ``step_time`` (first step of each run dropped: warm-up). Run
with the TRL venv: ``PYTHONPATH=. $(bash scripts/trl_env.sh | tail -1) bench/trl_step_overhead.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "trl"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    import grpo_run

    import otel_agentloop as oal
    from otel_agentloop.integrations import trl as oal_trl

    grpo_run.SLOW_S = 0.0
    tmp = Path(tempfile.mkdtemp())
    model = grpo_run.make_model(tmp / "model", tools=False)
    times: dict[str, list[float]] = {"plain": [], "instrumented": []}
    handle = oal.configure(service_name="bench-trl", file=str(tmp / "spans.jsonl"))
    for i in range(a.pairs):
        for mode in ("plain", "instrumented"):
            if mode == "instrumented":
                oal_trl.instrument()
            try:
                out = grpo_run.train(model, tmp / f"{mode}{i}", steps=a.steps)
            finally:
                oal_trl.uninstrument()
            times[mode] += [d["step_time"] for d in out["logged"] if "step_time" in d][1:]
    handle.shutdown()
    plain, inst = statistics.median(times["plain"]), statistics.median(times["instrumented"])
    print("plain", [round(t, 3) for t in times["plain"]], "instrumented", [round(t, 3) for t in times["instrumented"]])
    print(f"steps per mode: {len(times['plain'])} (pairs {a.pairs} x {a.steps - 1} after warm-up)")
    print(f"median step_time: plain {plain:.3f} s, instrumented {inst:.3f} s, ratio {inst / plain:.3f}")


if __name__ == "__main__":
    main()
