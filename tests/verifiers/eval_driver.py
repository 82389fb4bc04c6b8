"""Run the ``vf_tools_env`` taskset through verifiers' own eval runner (``run_eval``) against an OpenAI server,
with ``instrument()`` (``--traced``; spans over OTLP/gRPC to ``--otlp``) or without, and write what verifiers
returned (per rollout: task, reward, turns, call timing, tool counts, errors) and, traced, ``collect()``'s
metrics to ``--out`` (JSON)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

ENV: dict[str, Any] = {
    "taskset": {"id": "vf_tools_env"},
    "agent": {
        "harness": {"id": "null"},
        "runtime": {"type": "subprocess"},
        "max_turns": 3,
        "timeout": {"rollout": 300, "scoring": 60},
    },
}
"""The env: the ``vf_tools_env`` taskset, the ``null`` harness in the local subprocess runtime, 3 turns."""


def sampling(logit_bias: dict[str, int]) -> dict[str, Any]:
    return {
        "max_tokens": 64,
        "temperature": 0.0,
        "seed": 0,
        "tool_choice": "required",  # vLLM's structured outputs: a JSON array of tool calls...
        "parallel_tool_calls": False,  # ...of exactly one call
        "logit_bias": logit_bias,  # JSON allows any whitespace, which a random model then emits forever
    }


def eval_config(
    base_url: str, out_dir: Path, rollouts: int, logit_bias: dict[str, int], taskset: str = "vf_tools_env"
) -> Any:
    from verifiers.v1.configs.cli.eval import EvalConfig

    return EvalConfig(
        env={**ENV, "taskset": {"id": taskset}},
        client={"type": "eval", "base_url": base_url, "api_key_var": "VF_TEST_API_KEY"},
        model="tiny",
        sampling=sampling(logit_bias),
        num_rollouts=rollouts,
        max_concurrent=4,
        rich=None,
        push=False,
        output_dir=out_dir,
        run={"dir": "run"},
    )


def summary(episodes: list[Any]) -> list[dict[str, Any]]:
    rows = []
    for episode in episodes:
        for trace in episode.traces:
            rows.append(
                {
                    "id": trace.id,
                    "task": trace.task.data.idx,
                    "reward": trace.reward,
                    "rewards": {k: (v.score if v else None) for k, v in trace.rewards.items()},
                    "turns": trace.num_turns,
                    "ok": trace.ok,
                    "stop": trace.stop_condition,
                    "errors": [e.type for e in trace.errors],
                    "calls": [[c.time.start, c.time.end] for c in trace.calls],
                    "call_tools": [_handed_tools(trace, c.node) for c in trace.calls],
                    "agent": [trace.timing.agent.start, trace.timing.agent.end],
                    "harness_s": trace.timing.agent.harness.duration,
                    "finish": [c.finish_reason for c in trace.calls],
                    "model_s": trace.timing.agent.model.duration,
                    "scoring": [trace.timing.scoring.start, trace.timing.scoring.end],
                    "tool_calls": sum(len(n.message.tool_calls or []) for n in trace.nodes if _is_reply(n)),
                }
            )
    return rows


def _handed_tools(trace: Any, node: Any) -> bool:
    """Whether the call committed an assistant node with tool calls (handed to the harness to run)."""
    if type(node) is not int or not 0 <= node < len(trace.nodes):
        return False
    return bool(getattr(trace.nodes[node].message, "tool_calls", None))


def _is_reply(node: Any) -> bool:
    return getattr(getattr(node, "message", None), "role", None) == "assistant"


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--otlp", default="")
    parser.add_argument("--traced", action="store_true")
    parser.add_argument("--rollouts", type=int, default=2)
    parser.add_argument("--logit-bias", default="{}", help="JSON: token id -> bias (the whitespace-only tokens)")
    parser.add_argument("--taskset", default="vf_tools_env")
    args = parser.parse_args()
    out = Path(args.out)
    handle = None
    if args.traced:
        import otel_agentloop as oal
        from otel_agentloop.integrations import verifiers as oal_verifiers

        handle = (
            oal.configure("vf-eval", endpoint=args.otlp, protocol="grpc") if args.otlp else oal.configure("vf-eval")
        )
        oal_verifiers.instrument()
    from verifiers.v1.cli.eval.runner import run_eval

    episodes = await run_eval(
        eval_config(args.base_url, out.parent / "vf-out", args.rollouts, json.loads(args.logit_bias), args.taskset)
    )
    result: dict[str, Any] = {"rollouts": summary(episodes)}
    if handle is not None:
        result["metrics"] = handle.metrics.collect(0)
        handle.shutdown()
    out.write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    asyncio.run(main())
