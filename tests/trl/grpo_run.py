"""A real TRL GRPOTrainer run on CPU with a tiny Qwen2 made locally (no download): 2 reward functions (one slow,
one async), optionally TRL's tool loop with 2 tools (one sync, one async). Importable (tests) and runnable
(``python grpo_run.py OUT.json MODEL_DIR [--tools]``, what the ``opentelemetry-instrument`` test runs, with no
otel_agentloop code in it).

The tool loop runs with a random tiny model thanks to its generation config alone: the tokenizer has one added
token per tool call that decodes to a whole Qwen-style ``<tool_call>...</tool_call>`` block, and
``sequence_bias`` makes them likely as the first token and EOS certain after them. TRL parses them with its own
Qwen3 response template and calls the tools. Nothing of TRL or the model is changed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SLOW_S = 3.0
TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
TOOL_CALL_2 = '<tool_call>\n{"name": "lookup", "arguments": {"key": "fox"}}\n</tool_call>'


def make_model(path: Path, tools: bool) -> Path:
    """The tiny model and tokenizer of tests/engine/tiny_model.py; with ``tools``, TRL's Qwen3 chat template and
    two added tokens, each one whole tool call."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
    import tiny_model

    tiny_model.make(path)
    if tools:
        from transformers import AutoTokenizer
        from trl.chat_template_utils import qwen3_chat_template

        tok = AutoTokenizer.from_pretrained(path)
        tok.add_tokens([TOOL_CALL, TOOL_CALL_2])
        tok.chat_template = qwen3_chat_template
        tok.save_pretrained(path)
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path)  # the rendered tool schemas are ~900 byte-level tokens
        config.max_position_embeddings = 4096
        config.save_pretrained(path)
    return path


async def reward_length(completions: list[Any], **kwargs: Any) -> list[float]:
    """Fast, async (TRL runs it on its own event loop): a completion's length, scaled."""
    return [len(_text(c)) / 100.0 for c in completions]


def reward_slow_judge(completions: list[Any], **kwargs: Any) -> list[float]:
    """Slow (a judge's latency): the count of 'o' characters."""
    time.sleep(SLOW_S)
    return [float(_text(c).count("o")) for c in completions]


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    time.sleep(0.01)
    return a + b


async def lookup(key: str) -> str:
    """Look a word up.

    Args:
        key: The word.
    """
    await asyncio.sleep(0.02)
    return key.upper()


def _text(c: Any) -> str:
    if isinstance(c, str):
        return c
    return " ".join(str(m.get("content", "")) for m in c if isinstance(m, dict))


def train(model_dir: Path, out_dir: Path, *, tools: bool = False, steps: int = 2) -> dict[str, Any]:
    """Train ``steps`` steps; returns TRL's logged dicts (read through a TrainerCallback) and the losses."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    logged: list[dict[str, Any]] = []

    class Keep(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            logged.append(dict(logs or {}))

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    words = ["fox", "dog", "rollout", "sample"]
    if tools:
        rows = [{"prompt": [{"role": "user", "content": f"the quick {w}"}]} for w in words]
    else:
        rows = [{"prompt": f"the quick brown {w}"} for w in words]
    generation: dict[str, Any] = {}
    if tools:
        call, call2 = tok.convert_tokens_to_ids([TOOL_CALL, TOOL_CALL_2])
        eos = tok.convert_tokens_to_ids("<|im_end|>")
        generation = {"sequence_bias": {(call,): 7.0, (call2,): 7.0, (call, eos): 100.0, (call2, eos): 100.0}}
    args = GRPOConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=64 if tools else 8,
        max_steps=steps,
        logging_steps=1,
        learning_rate=1e-3,
        seed=1234,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        generation_kwargs=generation or None,
        max_tool_calling_iterations=2 if tools else None,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward_length, reward_slow_judge],
        args=args,
        train_dataset=Dataset.from_list(rows * 4),
        processing_class=tok,
        tools=[add, lookup] if tools else None,
        callbacks=[Keep()],
    )
    trainer.train()
    losses = [d["loss"] for d in logged if "loss" in d]
    return {"logged": logged, "losses": losses}


if __name__ == "__main__":
    out_file, model = Path(sys.argv[1]), Path(sys.argv[2])
    result = train(model, out_file.parent / "trainer", tools="--tools" in sys.argv)
    out_file.write_text(json.dumps(result, default=str))
