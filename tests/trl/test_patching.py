"""instrument() never imports TRL, patches GRPOTrainer when TRL is imported, and uninstrument() puts back the very
same objects (in a fresh interpreter: TRL not imported yet)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import otel_agentloop as oal

PROBE = """
import sys
from otel_agentloop.integrations import trl as oal_trl
assert oal_trl.instrument() is True
assert "trl" not in sys.modules, "instrument() imported trl"
from trl.trainer import grpo_trainer
cls = grpo_trainer.GRPOTrainer
patched = {a: vars(cls).get(a) for a in ("__init__", "_generate", "_calculate_rewards", "log", "train")}
assert all(getattr(f, "__wrapped__", None) is not None for f in patched.values()), patched
assert grpo_trainer.profiling_context.__wrapped__ is not None
vllm_generation = sys.modules["trl.generation.vllm_generation"]
llm = vars(vllm_generation).get("LLM")  # vLLM installed (scripts/trl_vllm_env.sh): the LLM TRL builds, wrapped
assert llm is None or llm.__wrapped__ is not None
oal_trl.uninstrument()
assert vars(vllm_generation).get("LLM") is getattr(llm, "__wrapped__", None)
assert "train" not in vars(cls)  # inherited from transformers' Trainer: our class attribute removed
assert not hasattr(vars(cls)["_generate"], "__wrapped__") and not hasattr(grpo_trainer.profiling_context, "__wrapped__")
assert oal_trl.instrument() is True  # trl imported now: patched at once
assert hasattr(vars(cls)["_generate"], "__wrapped__")
oal_trl.uninstrument()
print("ok")
"""


def test_instrument_is_lazy_and_uninstrument_restores(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(oal.__file__).resolve().parents[1])}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
