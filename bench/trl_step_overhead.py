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


def spans_cost(rows: int = 4, rounds: int = 300) -> float:
    """Microseconds of our own work for one step's batch of ``rows`` completions, with no TRL around it: the
    samples, one generation call, two reward functions with their values, the sample totals (what the wrappers
    add to a step, less the step span and its collect)."""
    import time

    import torch

    from otel_agentloop.integrations.trl._phases import GenerationCall, end_rewards, open_reward, record_totals
    from otel_agentloop.integrations.trl._rows import Batch
    from otel_agentloop.integrations.trl._state import TrainerState

    values, weights = torch.rand(rows, 2), torch.ones(2)
    prompts, outs = [[1, 2, 3]] * rows, [[4] * 8] * rows
    t0 = time.perf_counter()
    for _ in range(rounds):
        st = TrainerState()
        st.batch = Batch(rows, 2, 0)
        GenerationCall(st.batch, list(range(rows)), "tiny").end(None, prompts, outs)
        for name in ("fast", "slow"):
            run = open_reward(st, name)
            assert run is not None
        record_totals(st.batch, end_rewards(st, ["fast", "slow"], values, None), weights)
        st.batch.close(None)
    return (time.perf_counter() - t0) / rounds * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--micro", action="store_true", help="only our per-step span work, without TRL (us per step)")
    a = ap.parse_args()
    if a.micro:
        import otel_agentloop as oal

        handle = oal.configure(service_name="bench-trl", file=tempfile.mkdtemp() + "/spans.jsonl")
        for rows in (4, 64):
            print(f"our span work per step, {rows} completions: {spans_cost(rows):.0f} us")
        handle.shutdown()
        return
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
