"""A user's process with a real ``AsyncLLM`` under load (issue 36): ``integrations.vllm.instrument()``, the
user's own stat logger passed to ``AsyncLLM.from_engine_args(stat_loggers=[...])``, a KV cache too small for
the load (``num_gpu_blocks_override=16`` blocks of 32 tokens, ``max_num_seqs=8``: the scheduler preempts),
prefix caching on and a 96-token system prompt every sample shares.

Run: ``python load_driver.py MODEL ENDPOINT SERVICE OUT.json``.
- step 0: 10 samples x 2 turns, all at once, plus a turn whose request is aborted through ``AsyncLLM.abort()``
  after a few outputs and resumed by a second request in the same turn (two segments);
- step 1: 2 samples x 2 turns (a newer step closes the engine's load window).
Then ``engine.shutdown()`` (the last window) and the handle's shutdown. Writes what vLLM returned per turn
(ids, preemptions, cached tokens, tokens), what the user's logger summed from vLLM's own stats, and the
wall-clock span of the run.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import otel_agentloop as oal

MODEL = "tiny-qwen2"
N_SAMPLES = 10
TURNS = 2
MAX_TOKENS = 32
SYSTEM = [5 + (k * 11) % 300 for k in range(96)]  # the shared system prompt: 3 full KV blocks
ABORT_AFTER = 4  # outputs before the aborted request is aborted
ABORTED_ID = "s0-aborted"
RESUMED_ID = "s0-resumed"
RESUMED_TOKENS = 8

USER_LOGGER: dict[str, float] = {"records": 0, "preempted": 0, "hits": 0, "preempted_hits": 0, "finished_cached": 0}


def user_logger_class() -> type[Any]:
    """The user's own stat logger: vLLM's interface, summing vLLM's own preemption and prefix-cache counts."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class UserLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            USER_LOGGER["records"] += 1
            if iteration_stats is not None:
                USER_LOGGER["preempted"] += iteration_stats.num_preempted_reqs
                for done in iteration_stats.finished_requests:
                    USER_LOGGER["finished_cached"] += getattr(done, "num_cached_tokens", 0)
            if scheduler_stats is not None:
                USER_LOGGER["hits"] += scheduler_stats.prefix_cache_stats.hits
                USER_LOGGER["preempted_hits"] += scheduler_stats.prefix_cache_stats.preempted_hits

        def log_engine_initialized(self) -> None:
            pass

    return UserLogger


def _params(max_tokens: int = MAX_TOKENS) -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)


@oal.trace_generate(model=MODEL)
async def _turn(engine: Any, prompt: list[int], request_id: str) -> Any:
    final = None
    async for out in engine.generate({"prompt_token_ids": prompt}, _params(), request_id):
        final = out
    return final


def _numbers(out: Any) -> dict[str, Any]:
    return {
        "request_id": out.request_id,
        "preemptions": out.metrics.num_preemptions,
        "cached": out.num_cached_tokens,
        "output_tokens": len(out.outputs[0].token_ids),
        "input_tokens": len(out.prompt_token_ids),
    }


async def _sample(engine: Any, step: int, index: int) -> dict[str, Any]:
    prompt = SYSTEM + [300 + (index * 7 + k) % 90 for k in range(10)]
    turns = []
    with oal.sample(index) as handle:
        for turn in range(TURNS):
            out = await _turn(engine, prompt, f"s{step}-{index}-t{turn}")
            turns.append(_numbers(out))
            prompt = prompt + list(out.outputs[0].token_ids) + [7, 8, 9]
        trace_id = handle.trace_id
    return {"index": index, "trace_id": trace_id, "turns": turns}


async def _aborted(engine: Any) -> dict[str, Any]:
    """A sample whose one turn is aborted through ``AsyncLLM.abort()`` after a few outputs."""
    seen: list[Any] = []

    resumed: list[Any] = []

    @oal.trace_generate(model=MODEL)
    async def turn() -> None:
        prompt = SYSTEM + list(range(200, 220))
        async for out in engine.generate({"prompt_token_ids": prompt}, _params(200), ABORTED_ID):
            seen.append(out)
            if len(seen) == ABORT_AFTER:
                await engine.abort(ABORTED_ID)
        prompt = prompt + list(seen[-1].outputs[0].token_ids)  # resumed in the same turn: a second attempt
        async for out in engine.generate({"prompt_token_ids": prompt}, _params(RESUMED_TOKENS), RESUMED_ID):
            resumed.append(out)

    with oal.sample(N_SAMPLES) as handle:
        await turn()
        trace_id = handle.trace_id
    last = seen[-1]
    return {
        "trace_id": trace_id,
        "outputs": len(seen),
        "finish_reason": str(last.outputs[0].finish_reason),
        "output_tokens": len(last.outputs[0].token_ids),
        "preemptions": last.metrics.num_preemptions,
        "cached": last.num_cached_tokens,
        "resumed": _numbers(resumed[-1]),
    }


async def main(model: str, endpoint: str, service: str) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from otel_agentloop.integrations import vllm as oal_vllm

    assert oal_vllm.instrument()
    handle = oal.configure(service, endpoint=endpoint, protocol="grpc", set_global=False)
    args = AsyncEngineArgs(
        model=model, dtype="bfloat16", enforce_eager=True, seed=0, max_num_seqs=8, block_size=32,
        num_gpu_blocks_override=16, max_model_len=448, enable_prefix_caching=True,
    )  # fmt: skip
    engine = AsyncLLM.from_engine_args(args, stat_loggers=[user_logger_class()])
    result: dict[str, Any] = {"start": time.time()}
    try:
        with oal.step(0):
            *samples, aborted = await asyncio.gather(
                *(_sample(engine, 0, i) for i in range(N_SAMPLES)), _aborted(engine)
            )
        result["step0"], result["aborted"] = samples, aborted
        result["metrics0"] = {k: v for k, v in handle.metrics.collect(0).items() if isinstance(v, (int, float))}
        with oal.step(1):
            result["step1"] = list(await asyncio.gather(*(_sample(engine, 1, i) for i in range(2))))
    finally:
        engine.shutdown()  # closes the engine's load window: its span goes out with the handle's shutdown
        result["end"] = time.time()
        handle.shutdown()
    result["user_logger"] = USER_LOGGER
    return result


if __name__ == "__main__":
    out = asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
    with open(sys.argv[4], "w") as f:
        json.dump(out, f)
