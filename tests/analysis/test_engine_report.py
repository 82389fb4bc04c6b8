"""Issue 28, item 3: the engine's timing inside each generation turn, read back.

Per step ``agent_loop/engine/<stat>/{p50,p90,p99,max}`` (exact, the same code live and in ``report``), the cause
of the slowest and slow samples in words (``metrics._summary.cause``), and each turn's engine part drawn inside
the turn: terminal waterfall, step page, Perfetto. Spans are written through the public API: a ``trace_generate``
phase whose body sets the engine's attributes on the current span, as an engine integration does.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from opentelemetry import trace

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.analysis import read_jsonl
from otel_agentloop.analysis._reading._report import stored_summaries, summary_of
from otel_agentloop.metrics import PhaseMetricsProcessor, PhaseTable, StepSummary, compute_metrics
from otel_agentloop.metrics._causes import StepEngine, cause
from otel_agentloop.metrics._table import EngineSample
from tests._support.browser import open_page, severe_console
from tests._support.trace_event_format import parse

P = f"{sc.METRIC_PREFIX}/{sc.ENGINE_METRIC}"


@dataclass
class Turn:
    """One generation turn: how long it sleeps, and the engine attributes it sets (None: not set)."""

    sleep_s: float = 0.001
    queue_s: float | None = 0.001
    ttft_s: float | None = 0.002
    prefill_s: float | None = 0.001
    decode_s: float | None = 0.01
    output_tokens: int | None = 100


@dataclass
class Sample:
    turns: Sequence[Turn]
    tool_s: float = 0.0
    reward_s: float = 0.0


@oal.trace_generate(model="tiny")
async def _generate(turn: Turn) -> None:
    span = trace.get_current_span()
    values: Mapping[str, object] = {
        sc.RL_ENGINE_NAME: "vllm",
        sc.RL_ENGINE_QUEUE_S: turn.queue_s,
        sc.RL_ENGINE_TTFT_S: turn.ttft_s,
        sc.RL_ENGINE_PREFILL_S: turn.prefill_s,
        sc.RL_ENGINE_DECODE_S: turn.decode_s,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: turn.output_tokens,
        sc.GEN_AI_USAGE_INPUT_TOKENS: 10,
    }
    for key, value in values.items():
        if value is not None:
            span.set_attribute(key, value)  # type: ignore[arg-type]
    await asyncio.sleep(turn.sleep_s)


@oal.trace_tool("search")
async def _search(seconds: float) -> None:
    await asyncio.sleep(seconds)


@oal.trace_reward
async def _reward(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return 1.0


async def _rollout(step: int, samples: Sequence[Sample]) -> None:
    async def one(i: int, s: Sample) -> None:
        async with oal.sample(i, 0):
            for turn in s.turns:
                await _generate(turn)
            if s.tool_s:
                await _search(s.tool_s)
            await _reward(s.reward_s)

    with oal.step(step):
        await asyncio.gather(*(one(i, s) for i, s in enumerate(samples)))


def normal(n: int = 2) -> Sample:
    return Sample([Turn() for _ in range(n)])


def plain(n: int = 2) -> Sample:
    """A sample whose turns carry no engine attribute at all (today's spans)."""
    return Sample([Turn(queue_s=None, ttft_s=None, prefill_s=None, decode_s=None, output_tokens=None)] * n)


def _run(
    path: Path, steps: Mapping[int, Sequence[Sample]], monkeypatch: pytest.MonkeyPatch, fast_path: bool = True
) -> tuple[dict[int, dict[str, float]], oal.Handle]:
    """Each step rolled out and collected by a handle writing ``path``; the collected dicts, by step."""
    monkeypatch.setenv("OTEL_AGENTLOOP_FAST_PATH", "true" if fast_path else "false")
    handle = oal.configure("engine-report", file=str(path), set_global=False, schedule_delay_s=0.05)
    collected = {}
    try:
        for step, samples in steps.items():
            asyncio.run(_rollout(step, samples))
            collected[step] = dict(handle.metrics.collect(step))
        assert handle.force_flush(10)
    finally:
        handle.shutdown(5)
    return collected, handle


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["NO_COLOR"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "otel_agentloop", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )


# A step whose turns carry the engine's timing unevenly: the numbers below are what each statistic must be built from.
MIXED = [
    Sample([Turn(queue_s=0.5, ttft_s=0.6, decode_s=2.0, output_tokens=400), Turn(queue_s=0.0, decode_s=1.0)]),
    Sample([Turn(queue_s=None, ttft_s=0.25, prefill_s=None, decode_s=4.0, output_tokens=100)]),
    Sample([Turn(queue_s=1.5, ttft_s=None, prefill_s=0.1, decode_s=None, output_tokens=50)]),
    Sample([Turn(queue_s=None, ttft_s=None, prefill_s=None, decode_s=None, output_tokens=7)]),  # no engine timing
    Sample([Turn(queue_s=0.125, ttft_s=0.2, decode_s=0.0, output_tokens=0)]),
]
EXPECTED = {  # per turn with engine timing (the fourth sample's turn has none: left out, tokens too)
    sc.ENGINE_QUEUE_S: [0.5, 0.0, 1.5, 0.125],
    sc.ENGINE_TTFT_S: [0.6, 0.002, 0.25, 0.2],
    sc.ENGINE_DECODE_S: [2.0, 1.0, 4.0, 0.0],
    sc.ENGINE_OUTPUT_TOKENS: [400, 100, 100, 50, 0],
    sc.ENGINE_DECODE_TPS: [200.0, 100.0, 25.0],  # 400/2, 100/1, 100/4; decode 0 and missing decode left out
}


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "sdk-path"])
def test_engine_metrics_are_exact_live_and_in_report(tmp_path, monkeypatch, fast_path) -> None:
    path = tmp_path / "t.jsonl"
    collected, _ = _run(path, {1: MIXED, 2: [plain(), plain()]}, monkeypatch, fast_path)
    metrics = collected[1]
    want: dict[str, float] = {}
    for stat, values in EXPECTED.items():
        a = np.array(values, dtype=np.float64)
        for q in (50, 90, 99):
            want[f"{P}/{stat}/p{q}"] = float(np.percentile(a, q))
        want[f"{P}/{stat}/max"] = float(a.max())
    assert {k: v for k, v in metrics.items() if k.startswith(P + "/")} == want
    # verl's keys are untouched by it: the step without engine timing has none of ours ...
    assert not [k for k in collected[2] if "/engine/" in k]
    # ... and report rebuilds the same numbers from the file through the same code
    records = list(read_jsonl(str(path)))
    stored = stored_summaries(records)[(1, False)]
    rebuilt = summary_of(records, 1)
    assert {k: v for k, v in rebuilt.metrics.items() if k.startswith(P)} == want
    assert dict(stored.metrics) == metrics
    assert stored.engine == rebuilt.engine and stored.engine[sc.ENGINE_DECODE_TPS].count == 3
    assert stored.engine[sc.ENGINE_QUEUE_S].sum == pytest.approx(2.125)
    assert not stored_summaries(records)[(2, False)].engine


def test_engine_metrics_merge_exactly_across_workers(tmp_path, monkeypatch) -> None:
    """Tables of the same step split by sample (as Ray workers hold them), pickled and concatenated: the same keys,
    bit for bit, as the whole step's."""
    path = tmp_path / "t.jsonl"
    _run(path, {1: MIXED}, monkeypatch)
    records = [r for r in read_jsonl(str(path)) if sc.step_key(r.attributes) == (1, False)]
    tables = []
    for part in ({0, 2, 4}, {1, 3}):
        proc = PhaseMetricsProcessor()
        proc.ingest_records(r for r in records if r.attributes.get(sc.RL_SAMPLE_INDEX) in part)
        tables.append(proc.take(1, False))
    whole = PhaseMetricsProcessor()
    whole.ingest_records(records)
    merged = compute_metrics(PhaseTable.concat(pickle.loads(pickle.dumps(tables))))
    assert {k: v for k, v in merged.items() if "/engine/" in k} == {
        k: v for k, v in compute_metrics(whole.take(1, False)).items() if "/engine/" in k
    }
    assert len([k for k in merged if "/engine/" in k]) == 20


def test_summary_v3_round_trips_and_versions_1_and_2_still_read(tmp_path, monkeypatch) -> None:
    path = tmp_path / "t.jsonl"
    slow = Sample([Turn(sleep_s=0.2, queue_s=0.15), Turn()])
    _run(path, {1: [normal(), normal(), normal(), slow]}, monkeypatch)
    summary = stored_summaries(list(read_jsonl(str(path))))[(1, False)]
    assert summary.slowest is not None and summary.slowest.cause == "waited 0.15 s in the engine queue"
    assert summary.causes == {(3, 0): "waited 0.15 s in the engine queue"}
    assert summary.top[0] == summary.slowest and len(summary.top) == 4 and summary.top_complete(5)
    assert StepSummary.from_json(summary.to_json()) == summary
    body = json.loads(summary.to_json())
    assert body["v"] == 3
    # what a version-2 writer wrote: no top, no failed list
    v2 = {k: v for k, v in body.items() if k not in ("top", "failed")}
    v2["v"] = 2
    older = StepSummary.from_json(json.dumps(v2))
    assert older == replace(summary, top=(), failed=(), version=2)
    assert not older.top_complete(1) and not older.failed_complete
    # what a version-1 writer wrote: no engine, no causes, a 7-item slowest
    v1 = {k: v for k, v in v2.items() if k not in ("engine", "causes")}
    v1["v"], v1["slowest"] = 1, body["slowest"][:7]
    old = StepSummary.from_json(json.dumps(v1))
    assert old == replace(
        summary, engine={}, causes={}, slowest=replace(summary.slowest, cause=""), top=(), failed=(), version=1
    )
    for broken in (
        {**body, "v": 4},
        {**body, "causes": [[1, 0]]},
        {**body, "slowest": body["slowest"] + [1, 2]},
        {**body, "top": [[1, 0]]},
        {**body, "failed": [[1]]},
        {**body, "top": {}},
    ):
        with pytest.raises(ValueError):
            StepSummary.from_json(json.dumps(broken))


STEP = StepEngine(median_tokens_per_s=100.0, tokens_p50=200.0, tokens_p90=900.0, tokens_p99=1900.0)


def _engine(queue_s: float = 0.0, tokens: int = 200, decode_s: float = 2.0) -> EngineSample:
    return EngineSample(turns=2, queue_s=queue_s, output_tokens=tokens, decode_s=decode_s, decoded_tokens=tokens)


def test_cause_in_words_for_constructed_samples() -> None:
    def gen(engine: EngineSample, generate_s: float = 10.0) -> str:
        tool_s, score_s = generate_s / 10, generate_s / 20
        return cause(generate_s=generate_s, tool_s=tool_s, score_s=score_s, tool="search", engine=engine, step=STEP)

    assert gen(_engine(queue_s=4.0)) == "waited 4.00 s in the engine queue"
    assert gen(_engine(queue_s=2.4)) != "waited 2.40 s in the engine queue"  # under 25% of its generation
    assert gen(_engine(queue_s=0.009), generate_s=0.02) == "generation 0.02 s"  # under 10 ms: not a cause
    assert (
        gen(_engine(tokens=200, decode_s=8.0)) == "decoded 4.0 times slower than the step's median (25 vs 100 tokens/s)"
    )
    assert gen(_engine(tokens=200, decode_s=3.0)) == "generation 10.00 s"  # 67 tokens/s: not twice slower
    assert gen(_engine(tokens=2000, decode_s=20.0)) == "generated 2000 tokens (p99 of the step) at normal speed"
    assert gen(_engine(tokens=1000, decode_s=10.0)) == "generated 1000 tokens (p90 of the step) at normal speed"
    assert gen(_engine(tokens=800, decode_s=8.0)) == "generation 10.00 s"  # under the step's p90
    # a queued sample that also decoded slowly: the queue is named first
    assert gen(_engine(queue_s=5.0, decode_s=8.0)) == "waited 5.00 s in the engine queue"
    # the phase that took most of the time comes first
    assert cause(generate_s=1.0, tool_s=3.0, score_s=0.2, tool="python", engine=_engine(queue_s=0.9), step=STEP) == (
        "tool python 3.00 s"
    )
    assert cause(generate_s=1.0, tool_s=3.0, score_s=0.2) == "tools 3.00 s"
    assert cause(generate_s=1.0, tool_s=0.5, score_s=4.0, engine=_engine(queue_s=0.9), step=STEP) == "reward 4.00 s"
    assert cause(generate_s=2.0, tool_s=0.0, score_s=0.0) == "generation 2.00 s"  # no engine timing


def _slowest_causes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[int, str]:
    """Five steps, each with one sample slow for another reason; the slowest sample's cause per step, live."""
    base = [normal() for _ in range(7)]
    steps = {
        1: [*base, Sample([Turn(sleep_s=0.2, queue_s=0.15), Turn()])],
        2: [*base, Sample([Turn(sleep_s=0.2, output_tokens=5000, decode_s=0.5), Turn()])],
        3: [*base, Sample([Turn(sleep_s=0.2, output_tokens=100, decode_s=0.4), Turn()])],
        4: [*base, Sample([Turn(), Turn()], tool_s=0.2)],
        5: [*base, Sample([Turn(), Turn()], reward_s=0.2)],
    }
    collected, _ = _run(tmp_path / "t.jsonl", steps, monkeypatch)
    assert all(m["agent_loop/slowest/sample_index"] == 7 for m in collected.values())
    summaries = stored_summaries(list(read_jsonl(str(tmp_path / "t.jsonl"))))
    return {step: summaries[(step, False)].slowest.cause for step in steps}  # type: ignore[union-attr]


def test_slowest_sample_cause_from_spans_written_through_the_public_api(tmp_path, monkeypatch) -> None:
    causes = _slowest_causes(tmp_path, monkeypatch)
    assert causes[1] == "waited 0.15 s in the engine queue"
    assert causes[2] == "generated 5100 tokens (p99 of the step) at normal speed"
    # its two turns: 200 tokens in 0.41 s of decode
    assert causes[3] == "decoded 20.5 times slower than the step's median (488 vs 10000 tokens/s)"
    assert re.fullmatch(r"tool search 0\.[2-9]\d s", causes[4]), causes[4]  # its 0.2 s call, the rest is noise
    assert re.fullmatch(r"reward 0\.[2-9]\d s", causes[5]), causes[5]


# -- the CLI, the pages, Perfetto: a file written through the public API -------------------------------------
QUEUED = Sample([Turn(sleep_s=0.2, queue_s=0.12, prefill_s=0.01, decode_s=0.05), Turn()])


@pytest.fixture(scope="module")
def engine_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Step 1: seven ordinary samples and one that queued in the engine (sample 7); step 2: the same samples with
    no engine attribute (today's spans)."""
    path = tmp_path_factory.mktemp("turns") / "t.jsonl"
    with pytest.MonkeyPatch.context() as monkeypatch:
        _run(path, {1: [*(normal() for _ in range(7)), QUEUED], 2: [plain() for _ in range(8)]}, monkeypatch)
    return path


@pytest.mark.e2e  # a subprocess
def test_report_shows_the_engine_table_the_cause_and_the_engine_inside_the_turn(engine_file, tmp_path) -> None:
    out = _cli(tmp_path, "report", "--file", str(engine_file), "--step", "1")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert re.search(r"^queue_s\s+0\.001\s+0\.001\s+0\.\d+\s+0\.120$", text, re.M), text
    assert re.search(r"^decode_tokens_per_s \(tokens/s\)\s+10000\s+10000\s+\d+\s+10000$", text, re.M), text
    slowest = next(line for line in text.splitlines() if line.startswith("7 / 0"))
    assert slowest.endswith("waited 0.12 s in the engine queue"), slowest
    # the waterfall of the slowest sample: its first turn's queue, prefill and decode drawn inside its bar, in order
    assert "inside a turn: ░ engine queue  ▒ prefill  ▓ decode" in text
    turn = next(line for line in text.splitlines() if "queue 0.120s prefill 0.010s decode 0.050s" in line)
    bar = turn.split("|")[1]
    assert re.fullmatch(r" *░{20,}▒*▓{3,}█+ *", bar), bar
    # --json: our keys and the cause, verl's keys as before
    data = json.loads(_cli(tmp_path, "report", "--file", str(engine_file), "--step", "1", "--json").stdout)
    assert data["metrics"][f"{P}/{sc.ENGINE_QUEUE_S}/max"] == 0.12
    assert data["slowest"][0]["cause"] == "waited 0.12 s in the engine queue"


@pytest.mark.e2e  # a subprocess
def test_report_of_spans_without_engine_attributes_is_unchanged(engine_file, tmp_path) -> None:
    out = _cli(tmp_path, "report", "--file", str(engine_file), "--step", "2")
    assert out.returncode == 0, out.stderr
    assert "engine" not in out.stdout and not re.search("[░▒▓]", out.stdout)
    data = json.loads(_cli(tmp_path, "report", "--file", str(engine_file), "--step", "2", "--json").stdout)
    assert not [k for k in data["metrics"] if "/engine/" in k]
    perfetto = tmp_path / "p.json"
    assert (
        _cli(tmp_path, "report", "--file", str(engine_file), "--step", "2", "--perfetto", str(perfetto)).returncode == 0
    )
    assert not [e for e in json.loads(perfetto.read_text())["traceEvents"] if e.get("cat") == "engine"]


@pytest.mark.e2e  # a subprocess
def test_compare_and_run_page_carry_the_cause(engine_file, tmp_path) -> None:
    out = _cli(tmp_path, "report", "--file", str(engine_file), "--compare", "1", "2")
    assert out.returncode == 0, out.stderr
    assert "slowest sample of step 1: 7 / 0: waited 0.12 s in the engine queue" in out.stdout
    assert re.search(r"^queue_s\s+1\s+0\.001\s+0\.001\s+0\.\d+\s+0\.120$", out.stdout, re.M), out.stdout
    assert re.search(r"^\s+2\s+-\s+-\s+-\s+-$", out.stdout, re.M)  # step 2 has no engine timing
    data = json.loads(_cli(tmp_path, "report", "--file", str(engine_file), "--compare", "1", "2", "--json").stdout)
    assert data["a"]["slowest"]["cause"] == "waited 0.12 s in the engine queue"
    assert data["a"]["engine"][sc.ENGINE_QUEUE_S]["max"] == 0.12 and "engine" not in data["b"]
    page = tmp_path / "run.html"
    out = _cli(tmp_path, "report", "--file", str(engine_file), "--run", "--html", str(page))
    assert out.returncode == 0, out.stderr
    blob = re.search(r'<script id="run-data" type="application/json">(.*?)</script>', page.read_text(), re.S)
    assert blob is not None
    run = json.loads(blob.group(1))
    cause_at = run["fields"].index("slowest_cause")
    causes = [row[cause_at] for row in run["steps"]]
    assert causes[:2] == ["waited 0.12 s in the engine queue", None]  # step 2: no engine timing, no cause


@pytest.mark.e2e  # a subprocess
def test_perfetto_nests_the_engine_inside_each_turn(engine_file, tmp_path) -> None:
    path = tmp_path / "step.json"
    out = _cli(tmp_path, "report", "--file", str(engine_file), "--step", "1", "--perfetto", str(path))
    assert out.returncode == 0, out.stderr
    model = parse(path.read_text())  # the strict Trace Event Format reader: every slice nests
    engine = [s for track in model.tracks.values() for s in track if s.event.get("cat") == "engine"]
    assert engine and all(
        s.parent is not None and s.parent.event["args"]["attributes"].get(sc.RL_PHASE) == sc.GENERATE for s in engine
    )
    by_turn: dict[str, tuple[float, list[str]]] = {}
    for s in engine:
        assert s.parent is not None and s.parent.ts <= s.ts and s.end <= s.parent.end
        queue = s.parent.event["args"]["attributes"][sc.RL_ENGINE_QUEUE_S]
        by_turn.setdefault(s.parent.event["args"]["span_id"], (queue, []))[1].append(s.event["name"])
    order = ["engine queue", "engine prefill", "engine decode"]
    assert len(by_turn) == 16  # every turn; a 1 ms turn's 10 ms decode is clipped at the turn's end
    assert all(names == order[: len(names)] for _, names in by_turn.values())
    assert [names for queue, names in by_turn.values() if queue == 0.12] == [order]
    roots = [s for track in model.tracks.values() for s in track if s.args.get("cause")]
    assert [(r.args["sample"], r.args["cause"]) for r in roots] == [("7/0", "waited 0.12 s in the engine queue")]


@pytest.mark.e2e  # a subprocess
def test_browser_draws_the_engine_inside_the_turn_bars(engine_file, browser, tmp_path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    page = tmp_path / "step.html"
    out = _cli(tmp_path, "report", "--file", str(engine_file), "--step", "1", "--html", str(page))
    assert out.returncode == 0, out.stderr
    open_page(browser, page)
    summary = browser.find_element(By.ID, "summary").text
    assert (
        "slowest: sample 7 / rollout 0 (0.2" in summary
        and "gen+tool+score; waited 0.12 s in the engine queue)" in summary
    )
    assert "engine decode" in browser.find_element(By.ID, "legend").text
    inside = """
      return Array.from(document.querySelectorAll(arguments[0])).map(function (e) {
        var p = e.parentElement.getBoundingClientRect(), r = e.getBoundingClientRect();
        return [e.getAttribute('data-engine'), e.parentElement.className, r.left >= p.left - 0.5,
                r.right <= p.right + 0.5, r.width];
      });"""
    row = browser.find_element(By.CSS_SELECTOR, '.row[data-sample="7/0"]')
    parts = browser.execute_script(inside, '.row[data-sample="7/0"] .eng')
    assert [p[0] for p in parts[:3]] == ["queue", "prefill", "decode"], parts
    assert all(p[1].startswith("bar p0") and p[2] and p[3] for p in parts), parts
    assert parts[0][4] > 10 * parts[1][4] > 0  # the queue (0.12 s) dominates the prefill (0.01 s)
    row.click()
    detail = browser.find_element(By.ID, "detail")
    WebDriverWait(browser, 5).until(lambda d: "cause: waited 0.12 s" in detail.text)
    assert "engine: queue 0.120s prefill 0.010s decode 0.050s, 100 tokens" in detail.text
    parts = browser.execute_script(inside, "#detail .waterfall .eng")
    # both turns: the second (1 ms) holds its queue and what fits of its prefill
    assert [p[0] for p in parts][:4] == ["queue", "prefill", "decode", "queue"], parts
    assert all(p[2] and p[3] for p in parts), parts
    assert not severe_console(browser)
    # a step without engine attributes draws as before: no engine part, no engine legend
    plain_page = tmp_path / "plain.html"
    assert (
        _cli(tmp_path, "report", "--file", str(engine_file), "--step", "2", "--html", str(plain_page)).returncode == 0
    )
    open_page(browser, plain_page)
    assert not browser.find_elements(By.CSS_SELECTOR, ".eng")
    assert "engine" not in browser.find_element(By.ID, "legend").text


def test_an_engines_own_span_under_a_turn_is_drawn_in_its_samples_waterfall(engine_file) -> None:
    """vLLM's ``llm_request`` span (no ``rl.*`` attribute, the turn its parent, exported by vLLM's provider: a
    resource with no run id) and its own child are the sample's, drawn under the turn (terminal and step page
    waterfalls); a span with no step
    outside every sample (another trace, or not under a sample) stays out; the metrics are as without them."""
    from otel_agentloop.analysis import build_report, build_step_view, render_text
    from otel_agentloop.analysis._reading._runs import one_run

    records = list(read_jsonl(engine_file))
    assert records[0].resource.get(sc.RL_RUN_ID)
    before = build_report(one_run(records, None, print), 1)
    key = before.metrics.slowest_sample
    assert key is not None
    turn = next(r for r in before.samples[key] if r.attributes.get(sc.RL_PHASE) == sc.GENERATE)
    vllm = {"service.name": "engine-report"}  # vLLM's provider: our service name, no run id
    engine = replace(turn, span_id=1 << 60, parent_id=turn.span_id, name="llm_request", attributes={}, resource=vllm)
    inner = replace(engine, span_id=(1 << 60) + 1, parent_id=engine.span_id, name="engine_step")
    stray = replace(engine, span_id=(1 << 60) + 2, parent_id=12345, name="elsewhere")
    other = replace(engine, trace_id=777, span_id=(1 << 60) + 3, parent_id=0, name="model_load")
    loaded = one_run([inner, stray, other, *records, engine], None, print)  # a child before its parent, too
    ids = {id(r) for r in loaded}
    assert id(other) not in ids and {id(engine), id(inner), id(stray)} <= ids
    after = build_report(loaded, 1)
    assert after.samples[key][: len(before.samples[key])] == before.samples[key]
    assert sorted(r.name for r in after.samples[key][len(before.samples[key]) :]) == ["engine_step", "llm_request"]
    assert sum(len(v) for v in after.samples.values()) == sum(len(v) for v in before.samples.values()) + 2
    assert after.metrics == before.metrics
    view = next(v for v in build_step_view(loaded, 1).samples if v.key == key)  # the step page's waterfall
    drawn = [(depth, r.name) for depth, r in view.waterfall]
    assert (2, "llm_request") in drawn and (3, "engine_step") in drawn and "elsewhere" not in str(drawn), drawn
    lines = render_text(after.samples[key], color=False).splitlines()
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("llm_request"))
    assert lines[at - 1].lstrip().startswith("text_completion"), lines
    assert lines[at + 1].lstrip().startswith("engine_step"), lines
