"""TRL 1.16's GRPOTrainer, real, on CPU with a tiny model made locally, under ``integrations.trl.instrument()``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpo_run
import pytest

import otel_agentloop as oal
from otel_agentloop.integrations import trl as oal_trl

OURS = "agent_loop/"
TIMING = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")


@pytest.fixture
def instrumented() -> Iterator[None]:
    assert oal_trl.instrument()
    try:
        yield
    finally:
        oal_trl.uninstrument()


def _spans(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        for rs in json.loads(line).get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                out.extend(ss.get("spans", []))
    return out


def _attrs(span: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for a in span.get("attributes", []):
        kind, value = next(iter(a["value"].items()))
        out[a["key"]] = int(value) if kind == "intValue" else value
    return out


def _report(path: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(Path(oal.__file__).resolve().parents[1])}
    out = subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "report", "--file", str(path), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _theirs(logged: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in d.items() if not k.startswith(OURS) and k not in TIMING} for d in logged]


@pytest.fixture(scope="module")
def two_runs(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same seeded 2-step run, first plain, then instrumented (spans to a file)."""
    tmp = tmp_path_factory.mktemp("runs")
    plain = grpo_run.train(models["plain"], tmp / "plain")
    spans = tmp / "spans.jsonl"
    handle = oal.configure(service_name="trl-test", file=str(spans))
    assert oal_trl.instrument()
    try:
        traced = grpo_run.train(models["plain"], tmp / "traced")
    finally:
        oal_trl.uninstrument()
        handle.shutdown()
    return {"plain": plain, "traced": traced, "spans": spans}


def test_seeded_losses_and_trl_logged_values_are_identical(two_runs: dict[str, Any]) -> None:
    plain, traced = two_runs["plain"], two_runs["traced"]
    assert len(plain["losses"]) == 2
    assert all(d["grad_norm"] > 0 for d in plain["logged"] if "loss" in d)  # GRPO's loss starts near 0: not its grads
    assert traced["losses"] == plain["losses"]
    assert _theirs(traced["logged"]) == _theirs(plain["logged"])
    assert not any(k.startswith(OURS) for d in plain["logged"] for k in d)


def test_our_metrics_reach_trls_logged_dict(two_runs: dict[str, Any]) -> None:
    steps = [d for d in two_runs["traced"]["logged"] if "loss" in d]
    assert len(steps) == 2
    for logged in steps:  # read through a TrainerCallback's on_log: what wandb/trackio get
        assert logged[OURS + "num_samples"] == 4.0  # 2 prompts x 2 generations
        assert logged[OURS + "compute_score/min"] >= grpo_run.SLOW_S
        assert logged[OURS + "generate_sequences/max"] > 0
    assert oal_trl.last_metrics() is not None and oal_trl.last_metrics()[0] == 2


def test_report_run_shows_every_step_and_step_names_the_slow_reward(two_runs: dict[str, Any]) -> None:
    spans = two_runs["spans"]
    run = _report(spans, "--run")
    rows = [line.split()[0] for line in run.splitlines() if line[:1].isdigit()]
    assert rows == ["1", "2"], run
    step = _report(spans, "--step", "2")
    phases = {}
    for line in step.splitlines():  # the slowest sample's waterfall: "  <span name> |bars|  <secs>s"
        if line.startswith("  ") and "|" in line and line.rstrip().endswith("s"):
            name = line.split("|")[0].strip()
            phases[name] = float(line.rsplit("|", 1)[1].strip().rstrip("s"))
    assert "rl.reward reward_slow_judge" in phases and "rl.reward reward_length" in phases, step
    assert max(phases, key=lambda k: phases[k]) == "rl.reward reward_slow_judge", step


def test_samples_rewards_and_trainer_phases(two_runs: dict[str, Any]) -> None:
    spans = _spans(two_runs["spans"])
    by_id = {s["spanId"]: s for s in spans}
    samples = [s for s in spans if s["name"] == "rl.sample"]
    ids = sorted(
        (_attrs(s)["rl.step"], _attrs(s)["rl.sample.index"], _attrs(s)["rl.sample.rollout_n"]) for s in samples
    )
    assert ids == [(st, p, g) for st in (1, 2) for p in (0, 1) for g in (0, 1)]
    batches = {s["spanId"] for s in spans if s["name"] == "rl.generate.batch"}
    assert len(batches) == 2
    gens = [s for s in spans if _attrs(s).get("rl.phase") == "generate_sequences"]
    assert len(gens) == 8
    for gen in gens:  # under its sample, linked to its batch, with its own tokens
        assert by_id[gen["parentSpanId"]]["name"] == "rl.sample"
        assert {link["spanId"] for link in gen.get("links", [])} & batches
        assert _attrs(gen)["gen_ai.usage.output_tokens"] > 0
    rewards = [s for s in spans if s["name"].startswith("rl.reward ")]
    assert sorted({_attrs(r)["rl.reward.function"] for r in rewards}) == ["reward_length", "reward_slow_judge"]
    assert len(rewards) == 16 and all("rl.reward.score" in _attrs(r) for r in rewards)
    names = {s["name"] for s in spans}
    assert {"rl.train.gen", "rl.train.loss", "rl.train.optimizer_step", "rl.step"} <= names


def test_tool_loop_calls_are_tool_spans_under_their_sample(
    models: dict[str, Path], tmp_path: Path, instrumented: None
) -> None:
    spans_file = tmp_path / "spans.jsonl"
    handle = oal.configure(service_name="trl-tools", file=str(spans_file))
    try:
        result = grpo_run.train(models["tools"], tmp_path / "out", tools=True)
    finally:
        handle.shutdown()
    assert any(d.get("tools/call_frequency", 0) > 0 for d in result["logged"])
    spans = _spans(spans_file)
    by_id = {s["spanId"]: s for s in spans}
    tools = [s for s in spans if s["name"].startswith("execute_tool ")]
    assert {s["name"] for s in tools} == {"execute_tool add", "execute_tool lookup"}
    for tool in tools:
        parent = by_id[tool["parentSpanId"]]
        assert parent["name"] == "rl.sample" and parent["traceId"] == tool["traceId"]
        assert _attrs(tool)["rl.sample.index"] == _attrs(parent)["rl.sample.index"]
    # the tool loop's second generation call is a batch of its own, with a turn for each sample in it
    assert len([s for s in spans if s["name"] == "rl.generate.batch"]) > 2
    turns: dict[str, int] = {}
    for s in spans:
        if _attrs(s).get("rl.phase") == "generate_sequences":
            turns[s["parentSpanId"]] = turns.get(s["parentSpanId"], 0) + 1
    assert max(turns.values()) >= 2


class JudgeDownError(RuntimeError):
    pass


def test_reward_function_exception_keeps_its_type(models: dict[str, Path], tmp_path: Path, instrumented: None) -> None:
    handle = oal.configure(service_name="trl-err", file=str(tmp_path / "spans.jsonl"))

    def broken(completions: list[Any], **kwargs: Any) -> list[float]:
        raise JudgeDownError("the judge is down")

    original = grpo_run.reward_slow_judge
    grpo_run.reward_slow_judge = broken  # type: ignore[assignment]
    try:
        with pytest.raises(JudgeDownError, match="the judge is down"):
            grpo_run.train(models["plain"], tmp_path / "out", steps=1)
    finally:
        grpo_run.reward_slow_judge = original  # type: ignore[assignment]
        handle.shutdown()
    spans = _spans(tmp_path / "spans.jsonl")
    failed = [s for s in spans if s["name"] == "rl.reward broken"]
    assert failed and all(_attrs(s).get("error.type", "").endswith("JudgeDownError") for s in failed)


def test_opentelemetry_instrument_with_no_code_change(models: dict[str, Path], tmp_path: Path) -> None:
    cli = Path(sys.executable).with_name("opentelemetry-instrument")
    spans = tmp_path / "spans.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(  # traces: the SDK's default (otlp); with no endpoint set our configure() writes the file
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_AGENTLOOP_FILE=str(spans),
        PYTHONPATH=str(Path(oal.__file__).resolve().parents[1]),
    )
    out = subprocess.run(
        [str(cli), sys.executable, grpo_run.__file__, str(tmp_path / "out.json"), str(models["plain"])],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    logged = json.loads((tmp_path / "out.json").read_text())["logged"]
    assert [d[OURS + "num_samples"] for d in logged if "loss" in d] == [4.0, 4.0]
    run = _report(spans, "--run")
    assert [line.split()[0] for line in run.splitlines() if line[:1].isdigit()] == ["1", "2"], run
