"""A trainer's side of prime-rl's env-server hop: ``instrument()`` (tracing with ``trace_per="step"``), then
inside ``oal.step(--step)`` one rollout per task of ``vf_tools_env`` through verifiers' ``EnvClient`` against the
env server at the address in ``--address-file``; writes the step span's ids and, per rollout, verifiers' trace
id, task and reward to ``--out`` (JSON)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from eval_driver import sampling


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address-file", required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--otlp", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--step", type=int, required=True)
    parser.add_argument("--logit-bias", default="{}")
    args = parser.parse_args()
    from opentelemetry import trace

    import otel_agentloop as oal
    from otel_agentloop.integrations import verifiers as oal_verifiers

    handle = oal.configure("vf-trainer", endpoint=args.otlp, protocol="grpc", trace_per="step")
    oal_verifiers.instrument()
    import verifiers.v1 as vf
    from verifiers.v1.configs.client import EvalClientConfig
    from verifiers.v1.serve import EnvClient
    from verifiers.v1.types import SamplingConfig

    client = EnvClient(Path(args.address_file).read_text().strip())
    await client.wait_for_server_startup(timeout=300)
    config = EvalClientConfig(base_url=args.base_url, api_key_var="VF_TEST_API_KEY")
    knobs = SamplingConfig.model_validate(sampling(json.loads(args.logit_bias)))
    with oal.step(args.step):
        step_span = trace.get_current_span().get_span_context()
        episodes = await asyncio.gather(
            *(
                client.run(config, "tiny", knobs, vf.TaskData(idx=i, prompt=f"ping {i}").model_dump(mode="json"))
                for i in range(2)
            )
        )
    rollouts: list[dict[str, Any]] = [
        {"id": t.id, "task": t.task.data.idx, "reward": t.reward, "calls": len(t.calls)}
        for episode in episodes
        for t in episode.traces
    ]
    await client.close()
    handle.shutdown()
    result = {"trace_id": step_span.trace_id, "span_id": step_span.span_id, "rollouts": rollouts}
    Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
