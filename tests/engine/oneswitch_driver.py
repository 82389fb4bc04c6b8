"""A user's Ray driver with no tracing code at all, run as ``opentelemetry-instrument python oneswitch_driver.py
MODEL OUT.json`` (the one switch; endpoint and service from ``OTEL_*`` in its environment). A Ray actor starts
its own vLLM ``AsyncLLM`` (no ``otlp_traces_endpoint``) and runs 2 samples x 2 turns, each turn a
``span("generate_sequences")`` around a plain ``engine.generate(...)``. Writes the actor's trace ids, request ids
and the endpoint its engine was given."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import ray


@ray.remote(num_cpus=0)
class Rollout:
    def __init__(self, model: str) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(model=model, dtype="bfloat16", enforce_eager=True, max_model_len=256, max_num_seqs=2)
        self.engine = AsyncLLM.from_engine_args(args)

    async def run(self) -> dict[str, Any]:
        from vllm import SamplingParams

        import otel_agentloop as oal

        params = SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.0)

        async def sample(index: int) -> dict[str, Any]:
            requests = []
            with oal.sample(index) as handle:
                for turn in range(2):
                    with oal.span("generate_sequences"):
                        rid = f"os-{index}-{turn}"
                        async for _ in self.engine.generate({"prompt_token_ids": [5, 6, 7 + index]}, params, rid):
                            pass
                        requests.append(rid)
                return {"trace_id": handle.trace_id, "requests": requests}

        with oal.step(0):
            samples = await asyncio.gather(sample(0), sample(1))
        handle = oal.current_handle()
        return {
            "samples": samples,
            "engine_endpoint": self.engine.observability_config.otlp_traces_endpoint,
            "service": handle.settings.service_name if handle is not None else None,
        }

    def close(self) -> None:
        from opentelemetry import trace

        self.engine.shutdown()
        handle = __import__("otel_agentloop").current_handle()
        if handle is not None:
            handle.force_flush(10)
        provider: Any = trace.get_tracer_provider()  # vLLM's own, when it installed it here
        if hasattr(provider, "force_flush"):
            provider.force_flush()


def main() -> None:
    ray.init(num_cpus=2, include_dashboard=False)
    actor = Rollout.remote(sys.argv[1])  # type: ignore[attr-defined]
    out = ray.get(actor.run.remote(), timeout=600)
    ray.get(actor.close.remote(), timeout=120)
    ray.shutdown()
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
