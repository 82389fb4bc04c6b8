"""A user's process with vLLM in it: ``otel_agentloop.integrations.vllm.instrument()``, one real ``AsyncLLM``
(max_num_seqs=2) and concurrent multi-turn samples, each turn a ``@trace_generate(model=...)`` phase around a plain
``engine.generate(...)`` call (no trace_headers passed: the instrumentation adds them).

Run: ``python inproc_driver.py MODEL ENDPOINT SERVICE OUT.json``. Two steps:
- step 0, every sample traced: 8 samples x 2 turns, all at once;
- step 1, a 1-in-4 sampler (``configure(sampler=ParentBased(EveryFourth()))``): 8 samples x 2 turns. Every
  4th root, not ``TraceIdRatioBased(0.25)``, whose random ids sample none of 8 samples one run in ten.
- step 2, how vLLM streams (issue 41): one sample per case, each one turn: ``n=2`` with the default cumulative
  outputs, ``DELTA``, ``FINAL_ONLY`` with ``n=2``, and a turn whose ``engine.generate`` the user wraps in a span
  of their own (a retry helper).
Writes what the engine returned per turn (ids, tokens, its timestamps) and the metrics of each step.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import otel_agentloop as oal

MODEL = "tiny-qwen2"
N_SAMPLES = 8
TURNS = 2
MAX_TOKENS = 12


@oal.trace_generate(model=MODEL)
async def _turn(engine: Any, prompt: list[int], request_id: str) -> Any:
    """One turn: a generation phase (what verl's turn is) around a plain ``engine.generate``."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0)
    final = None
    async for out in engine.generate({"prompt_token_ids": prompt}, params, request_id):
        final = out
    return final


async def _sample(engine: Any, step: int, index: int) -> dict[str, Any]:
    prompt = [5 + (index * 7 + k) % 300 for k in range(10 + 3 * index)]
    turns = []
    with oal.sample(index) as handle:
        for turn in range(TURNS):
            out = await _turn(engine, prompt, f"s{step}-{index}-t{turn}")
            stats = out.metrics
            tokens = list(out.outputs[0].token_ids)
            turns.append(
                {
                    "request_id": out.request_id,
                    "input_tokens": len(out.prompt_token_ids),
                    "output_tokens": len(tokens),
                    "finish_reason": out.outputs[0].finish_reason,
                    "queued_ts": stats.queued_ts,
                    "scheduled_ts": stats.scheduled_ts,
                    "first_token_ts": stats.first_token_ts,
                    "last_token_ts": stats.last_token_ts,
                    "ttft": stats.first_token_latency,
                }
            )
            prompt = prompt + tokens + [7, 8, 9]
        handle.record(turns=TURNS)
        trace_id = handle.trace_id
        sampled = bool(handle.span.get_span_context().trace_flags.sampled)
    return {"index": index, "trace_id": trace_id, "sampled": sampled, "turns": turns}


async def _step(engine: Any, step: int) -> list[dict[str, Any]]:
    with oal.step(step):
        return list(await asyncio.gather(*(_sample(engine, step, i) for i in range(N_SAMPLES))))


def every_fourth() -> Any:
    """A deterministic 1-in-4 root sampler (the step's root counts as one: samples 3 and 7 of 8 are sampled)."""
    import itertools

    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

    class EveryFourth(Sampler):
        def __init__(self) -> None:
            self.count = itertools.count()

        def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
            return SamplingResult(Decision.RECORD_AND_SAMPLE if next(self.count) % 4 == 0 else Decision.DROP)

        def get_description(self) -> str:
            return "EveryFourth"

    return EveryFourth()


STREAM_TOKENS = 6
STREAMS = ("cumulative_n2", "delta", "final_only_n2", "retry")


async def _stream_case(engine: Any, tracer: Any, case: str) -> dict[str, Any]:
    """One step-2 sample: one turn streamed as ``case`` says; what vLLM itself yielded (outputs, completions)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    kind = {"delta": RequestOutputKind.DELTA, "final_only_n2": RequestOutputKind.FINAL_ONLY}
    n = 2 if case.endswith("_n2") else 1
    max_tokens = 10 if case == "delta" else STREAM_TOKENS
    params = SamplingParams(
        n=n, max_tokens=max_tokens, ignore_eos=True, temperature=1.0, seed=3,
        output_kind=kind.get(case, RequestOutputKind.CUMULATIVE),
    )  # fmt: skip
    seen: list[int] = []

    @oal.trace_generate(model=MODEL)
    async def turn() -> None:
        async def call() -> None:
            async for out in engine.generate({"prompt_token_ids": list(range(5, 25))}, params, f"s2-{case}"):
                seen.append(len(out.outputs))

        if case == "retry":  # a retry helper's span of its own around the engine call
            with tracer.start_as_current_span("retry"):
                await asyncio.wait_for(call(), 300)
        else:
            await call()

    with oal.sample(STREAMS.index(case)) as handle:
        await turn()
        trace_id = handle.trace_id
    return {"case": case, "trace_id": trace_id, "outputs": len(seen), "tokens": n * max_tokens, "n": n}


def _metrics(handle: Any, step: int) -> dict[str, float]:
    collected = handle.metrics.collect(step)
    return {k: float(v) for k, v in collected.items() if isinstance(v, (int, float))}


async def main(model: str, endpoint: str, service: str) -> dict[str, Any]:
    from opentelemetry.sdk.trace.sampling import ParentBased
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from otel_agentloop.integrations import vllm as oal_vllm

    assert oal_vllm.instrument()
    handle = oal.configure(service, endpoint=endpoint, protocol="grpc", set_global=False)
    args = AsyncEngineArgs(model=model, dtype="bfloat16", enforce_eager=True, max_model_len=256, max_num_seqs=2, seed=0)
    engine = AsyncLLM.from_engine_args(args)  # no otlp_traces_endpoint: instrument() gives ours
    result: dict[str, Any] = {"engine_endpoint": engine.observability_config.otlp_traces_endpoint}
    try:
        result["step0"] = await _step(engine, 0)
        result["metrics0"] = _metrics(handle, 0)
        handle.shutdown()
        handle = oal.configure(
            service, endpoint=endpoint, protocol="grpc", set_global=False, sampler=ParentBased(every_fourth())
        )
        result["step1"] = await _step(engine, 1)
        result["metrics1"] = _metrics(handle, 1)
        handle.shutdown()
        handle = oal.configure(service, endpoint=endpoint, protocol="grpc", set_global=False)
        tracer = handle.provider.get_tracer("user")
        with oal.step(2):
            result["step2"] = [await _stream_case(engine, tracer, case) for case in STREAMS]
        result["metrics2"] = _metrics(handle, 2)
        handle.shutdown()
    finally:
        engine.shutdown()
        from opentelemetry import trace

        provider: Any = trace.get_tracer_provider()  # vLLM's own, with its batch processor
        if hasattr(provider, "force_flush"):
            provider.force_flush()
    return result


if __name__ == "__main__":
    out = asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
    with open(sys.argv[4], "w") as f:
        json.dump(out, f)
