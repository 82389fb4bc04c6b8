"""``report --compare A B``: the rule that names a cause (unit), and real runs where one tool, or generation, gets
slower from step 3 on (``tests/_support/slow_tool_driver.py``, run as a script writing a trace file): ``--compare 2 5``
names it in the terminal, the JSON and the page (opened in real Chromium), with the numbers of ``report --step``
and of the live ``collect()``.

The picture in the docs comes from ``scripts/docs_pictures.py`` (a test writes only inside its tmp_path).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import read_jsonl
from otel_agentloop.analysis._reading._compare import NOISE_ABS_S, StepSide, TailMix, explain
from otel_agentloop.analysis._reading._comparison import compare, compare_steps
from otel_agentloop.analysis._reading._report import summary_of
from otel_agentloop.metrics import PhaseTable, SpanRecord
from tests._support import REPO_ROOT
from tests._support.browser import open_page, png_size, severe_console

DRIVER = REPO_ROOT / "tests" / "_support" / "slow_tool_driver.py"
GEN, TOOL, SCORE = sc.GENERATE, sc.TOOL_CALLS, sc.COMPUTE_SCORE


# -- the rule ---------------------------------------------------------------------------------------------
def _mix(gen: float, tool: float, score: float = 0.01, **tools: float) -> TailMix:
    return TailMix(2, {GEN: gen, TOOL: tool, SCORE: score}, tools, "slowest 10%: 2 of 16 samples")


def test_a_slower_tool_is_named_with_its_phase() -> None:
    cause = explain(0.30, 0.90, _mix(0.2, 0.08, search=0.05, python=0.04), _mix(0.17, 0.59, search=0.57, python=0.02))
    assert (cause.phase, cause.tool) == (TOOL, "search")
    assert cause.clear and cause.phase_share == 1.0 and cause.tool_share == 1.0
    assert cause.text.startswith("tool search (tool_calls): the step got 0.600 s slower")
    assert cause.tool_deltas["search"] == pytest.approx(0.52) and cause.phase_deltas[GEN] == pytest.approx(-0.03)


def test_slower_generation_is_named_without_a_tool() -> None:
    cause = explain(0.30, 0.90, _mix(0.2, 0.08, search=0.05), _mix(0.75, 0.1, search=0.07))
    assert (cause.phase, cause.tool) == (GEN, None)
    assert cause.phase_share == pytest.approx(0.55 / 0.57)
    assert cause.text.startswith("generate_sequences: the step got 0.600 s slower")


def test_a_faster_step_names_what_got_faster() -> None:
    cause = explain(0.90, 0.30, _mix(0.17, 0.59, search=0.57), _mix(0.2, 0.08, search=0.05))
    assert (cause.phase, cause.tool) == (TOOL, "search")
    assert "0.600 s faster" in cause.text and cause.step_delta_s == pytest.approx(-0.6)


def test_a_change_under_the_noise_threshold_has_no_cause() -> None:
    # 8% slower: under 10% of step A; the tail moved, but that is what noise looks like
    cause = explain(1.00, 1.08, _mix(0.5, 0.1), _mix(0.5, 0.18))
    assert cause.phase is None and cause.tool is None and not cause.clear
    assert cause.threshold_s == pytest.approx(0.1)
    assert cause.text.startswith("no clear cause: the step time changed by +0.080 s, under the noise threshold")
    # a tiny step: the absolute floor applies
    tiny = explain(0.10, 0.14, _mix(0.05, 0.01), _mix(0.05, 0.05))
    assert tiny.threshold_s == NOISE_ABS_S and tiny.phase is None
    # an unknown step time is never a cause
    assert explain(float("nan"), 1.0, _mix(0.1, 0.1), _mix(0.1, 0.9)).phase is None


def test_time_outside_the_tails_phases_has_no_cause() -> None:
    # 2 s slower, but the slowest samples' phases moved by 0.1 s: the time went to waiting, not to a phase
    cause = explain(1.0, 3.0, _mix(0.5, 0.2), _mix(0.6, 0.2))
    assert cause.phase is None
    assert cause.text.startswith("no clear cause: the step got 2.000 s slower, but its slowest samples' phase times")


def test_two_phases_sharing_the_change_is_no_single_cause() -> None:
    cause = explain(1.0, 2.0, _mix(0.5, 0.2), _mix(1.0, 0.65))
    assert cause.phase is None
    assert cause.text.startswith("no single cause: the step got 1.000 s slower")
    assert "generate_sequences +0.500 s" in cause.text and "tool_calls +0.450 s" in cause.text


def test_tool_calls_without_a_leading_tool_names_the_phase_only() -> None:
    cause = explain(1.0, 2.0, _mix(0.5, 0.2, a=0.1, b=0.1), _mix(0.5, 1.2, a=0.6, b=0.65))
    assert (cause.phase, cause.tool) == (TOOL, None)
    assert cause.text.startswith("tool_calls (no single tool)") and "b +0.550 s" in cause.text


def _table(totals: list[tuple[float, float, float]]) -> PhaseTable:
    n = len(totals)
    a = np.asarray(totals, dtype=np.float64)
    return PhaseTable(
        sample_index=np.arange(n, dtype=np.int64),
        rollout_n=np.zeros(n, np.int64),
        generate_sequences=a[:, 0],
        tool_calls=a[:, 1],
        compute_score=a[:, 2],
        num_preempted=np.zeros(n, np.int64),
        prompt_length=np.full(n, -1, np.int64),
        response_length=np.full(n, -1, np.int64),
        error=np.zeros(n, np.bool_),
        trace_id_hi=np.zeros(n, np.uint64),
        trace_id_lo=np.arange(1, n + 1, dtype=np.uint64),
    )


def test_the_tail_is_the_slowest_tenth_of_samples() -> None:
    from otel_agentloop.metrics import compute_metrics, summarize

    rows = [(0.1, 0.0, 0.01)] * 18 + [(0.2, 0.9, 0.01), (0.3, 0.5, 0.01)]  # 20 samples: the tail is 2
    table = _table(rows)
    side = StepSide(summarize(table, compute_metrics(table), 1), False, table, {(18, 0): {"search": 0.9}})
    tail = side.tail()
    assert (tail.samples, tail.basis) == (2, "slowest 10%: 2 of 20 samples")
    assert tail.phases[GEN] == pytest.approx(0.25) and tail.phases[TOOL] == pytest.approx(0.7)
    assert tail.tools == {"search": pytest.approx(0.45)}
    # summary only: the slowest sample stands for the tail
    only = StepSide(side.summary, True).tail()
    assert (only.samples, only.phases[TOOL]) == (1, pytest.approx(0.9))
    assert "summary only" in only.basis


# -- real runs ------------------------------------------------------------------------------------------------
def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


def _drive(cwd: Path, *args: str) -> list[dict[str, Any]]:
    """Run the driver script; returns the metrics ``collect()`` returned for each step."""
    out = subprocess.run(
        [sys.executable, str(DRIVER), "--file", "run.jsonl", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def _report(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "report", "--file", "run.jsonl", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture(scope="module")
def slow_search(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """Five steps of 16 samples; from step 3 on the tool ``search`` takes 10x longer."""
    cwd = tmp_path_factory.mktemp("slow-search")
    return cwd, _drive(cwd, "--slow", "search", "--factor", "10", "--from-step", "3")


@pytest.mark.e2e  # a subprocess
def test_compare_names_the_slowed_tool_in_terminal_and_json(slow_search) -> None:
    cwd, _ = slow_search
    out = _report(cwd, "--compare", "2", "5")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "== step 2 -> step 5: compared from run.jsonl" in text
    cause = next(line for line in text.splitlines() if line.startswith("cause: "))
    assert cause.startswith("cause: tool search (tool_calls): the step got ")
    moved = text.split("samples that moved most")[1].splitlines()[2:7]
    # the samples the slowed tool moved are among those that moved most (by how much each moved is load: a sample
    # whose generation load slowed in one step can move as far), and each line naming search has it slower
    searched = [line for line in moved if "(search " in line]
    assert len(moved) == 5 and searched and all("(search +" in line for line in searched), moved

    out = _report(cwd, "--compare", "2", "5", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)  # the whole of stdout is the JSON document
    assert (data["cause"]["phase"], data["cause"]["tool"]) == (TOOL, "search")
    assert data["cause"]["tool_share"] >= 2 / 3 and data["step_time"]["delta"] > 0.3
    stored = {
        r.attributes.get(sc.RL_STEP) for r in read_jsonl(str(cwd / "run.jsonl")) if r.name == sc.STEP_SUMMARY_SPAN
    }
    for side, step in (("a", 2), ("b", 5)):  # the live side's summary when it wrote one, else rebuilt
        assert data[side]["summary"] == ("stored" if step in stored else "rebuilt from spans")
    search = next(r for r in data["rows"] if (r["kind"], r["name"]) == ("tool", "search"))
    # 10x slower per call: each slowed call sleeps at least 0.2 s (10 x the least 0.02 s); and the tool's move dwarfs
    # the others' (ratios, side by side in one run: load moves every tool's p50 alike)
    assert search["b"]["p50"] >= 0.2, search
    others = [r for r in data["rows"] if r["kind"] == "tool" and r["name"] != "search"]
    assert {r["name"] for r in others} == {"calculator", "python"}
    assert all(abs(r["delta"]["p50"]) < search["delta"]["p50"] / 5 for r in others), (search, others)
    assert [m["delta"] for m in data["moved"]] == sorted((m["delta"] for m in data["moved"]), key=lambda d: -abs(d))
    assert max(m["tool_deltas"].get("search", 0) for m in data["moved"]) > 0.2  # the slowed tool, among them
    assert len(data["moved"]) == 5 and data["only_in_a"] == data["only_in_b"] == 0


@pytest.mark.e2e  # a subprocess
def test_compare_before_the_slowdown_names_nothing_of_search(slow_search) -> None:
    """Step 1 against step 2 (same latencies): whatever differs, it is not ``search``."""
    cwd, _ = slow_search
    data = json.loads(_report(cwd, "--compare", "1", "2", "--json").stdout)
    assert data["cause"]["tool"] != "search"
    assert abs(data["step_time"]["delta"]) < 0.3


@pytest.mark.e2e  # a subprocess
def test_compare_numbers_equal_report_step_and_collect(slow_search) -> None:
    cwd, collected = slow_search
    data = json.loads(_report(cwd, "--compare", "2", "5", "--json").stdout)
    for side, step in (("a", 2), ("b", 5)):
        out = _report(cwd, "--step", str(step), "--json")
        assert out.returncode == 0, out.stderr
        metrics = json.loads(out.stdout)["metrics"]
        live = collected[step - 1]
        assert live["step"] == step
        for row in (r for r in data["rows"] if r["kind"] == "phase"):
            for stat in ("p50", "p90", "p99", "max"):
                key = f"{sc.METRIC_PREFIX}/{row['name']}/{stat}"
                assert row[side][stat] == metrics[key] == live["metrics"][key], (step, key)
            assert row[side]["count"] == metrics[f"{sc.METRIC_PREFIX}/num_samples"] == 16
        slowest = data[side]["slowest"]
        assert slowest["sample_index"] == metrics[f"{sc.METRIC_PREFIX}/slowest/sample_index"]
        assert (
            slowest[TOOL]
            == metrics[f"{sc.METRIC_PREFIX}/slowest/{TOOL}"]
            == live["metrics"][f"{sc.METRIC_PREFIX}/slowest/{TOOL}"]
        )


@pytest.mark.e2e  # a subprocess
def test_compare_names_generation_when_generation_slowed(tmp_path) -> None:
    _drive(tmp_path, "--slow", "generate", "--factor", "4", "--from-step", "3")
    data = json.loads(_report(tmp_path, "--compare", "2", "5", "--json").stdout)
    assert (data["cause"]["phase"], data["cause"]["tool"]) == (GEN, None)
    assert data["cause"]["text"].startswith("generate_sequences: the step got ")


def _summary_span(records: list[SpanRecord], step: int) -> SpanRecord:
    """What the live side writes per collected step: one ``rl.step.summary`` span holding the summary's JSON."""
    summary = summary_of(records, step)
    return SpanRecord(
        trace_id=step,
        span_id=step,
        parent_id=0,
        name=sc.STEP_SUMMARY_SPAN,
        start_ns=1,
        end_ns=2,
        attributes={sc.RL_STEP: step, sc.RL_VALIDATE: False, sc.RL_STEP_SUMMARY: summary.to_json()},
    )


@pytest.mark.e2e  # a subprocess
def test_compare_from_stored_summaries_alone_names_the_tool_and_says_what_needs_spans(slow_search) -> None:
    cwd, _ = slow_search
    spans = list(read_jsonl(str(cwd / "run.jsonl")))
    summaries = [_summary_span(spans, 2), _summary_span(spans, 5)]
    found = compare_steps(summaries, 2, 5)
    assert not isinstance(found, str)
    assert found.a.stored and found.b.stored and found.moved == ()
    assert (found.cause.phase, found.cause.tool) == (TOOL, "search")
    assert found.tail_b.basis.startswith("the slowest sample (summary only")
    # the live side stores each step's wall times in its summary: step time is the rollout's wall time
    assert found.a.summary.wall_s > 0 and found.step_time_basis.startswith("rollout wall time")
    assert found.notes == (
        "step 2 and step 5: summary only, no sample spans (sampled away or expired): each step's tail is its "
        "slowest sample, tools are compared over all samples, and the samples that moved need the spans",
    )
    # one step with spans, one without: both tails from the summaries, so that they compare
    mixed = compare_steps([*[r for r in spans if r.attributes.get(sc.RL_STEP) == 2], summaries[1]], 2, 5)
    assert not isinstance(mixed, str) and mixed.a.has_samples and not mixed.b.has_samples
    assert mixed.tail_a.samples == mixed.tail_b.samples == 1 and mixed.notes[0].startswith("step 5: summary only")
    assert (mixed.cause.phase, mixed.cause.tool) == (TOOL, "search")
    # with the spans as well, the stored summary is the one read, and the spans give the sample rows
    both = compare_steps([*spans, *summaries], 2, 5)
    assert not isinstance(both, str)
    assert both.a.stored and both.a.has_samples and len(both.moved) == 5 and both.notes == ()
    rows = {(r.kind, r.name): r for r in both.rows}
    assert rows[("phase", GEN)].a == found.a.summary.phases[GEN]


@pytest.mark.e2e  # a subprocess
def test_compare_of_a_missing_step_says_which(slow_search) -> None:
    cwd, _ = slow_search
    out = _report(cwd, "--compare", "2", "9")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip() == (
        "report: no summary or sample spans for step 9 (steps with a summary or sample spans: 1, 2, 3, 4, 5)"
    )
    out = _report(cwd, "--compare", "2")
    assert out.returncode == 2 and "--compare: expected 2 arguments" in out.stderr
    out = _report(cwd, "--compare", "2", "5", "--json", "--html", str(cwd / "no-such-folder" / "c.html"))
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip().endswith("c.html: No such file or directory")


@pytest.mark.e2e  # a subprocess
def test_compare_page_in_the_browser_names_the_tool(slow_search, browser, tmp_path) -> None:
    from selenium.webdriver.common.by import By

    cwd, _ = slow_search
    page = tmp_path / "compare.html"
    out = _report(cwd, "--compare", "2", "5", "--html", str(page), "--jaeger-ui", "http://127.0.0.1:16686/")
    assert out.returncode == 0, out.stderr
    assert f"comparison page written to {page}" in out.stdout
    data = json.loads(_report(cwd, "--compare", "2", "5", "--json").stdout)
    html = page.read_text()
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|https?://(?!127\.0\.0\.1)", html)  # self-contained

    open_page(browser, page)
    cause = browser.find_element(By.ID, "cause")
    assert cause.get_attribute("class") == "clear"
    assert cause.text == f"Cause: {data['cause']['text']}" and "tool search (tool_calls)" in cause.text
    rows = browser.find_elements(By.CSS_SELECTOR, "#stats tbody tr")
    assert [r.get_attribute("data-name") for r in rows] == [GEN, TOOL, SCORE, "calculator", "python", "search"]
    assert [r.get_attribute("data-name") for r in rows if "cause" in r.get_attribute("class").split()] == ["search"]
    search = rows[-1].find_elements(By.TAG_NAME, "td")
    assert search[0].text == "tool search"
    assert float(search[5].text) == round(data["rows"][-1]["b"]["p50"], 3)  # p50 of step 5
    assert "up" in search[6].get_attribute("class").split()  # its delta is marked slower
    moved = browser.find_elements(By.CSS_SELECTOR, "#moved tbody tr")
    assert len(moved) == 5
    first = moved[0].find_elements(By.TAG_NAME, "td")
    assert first[0].text == f"{data['moved'][0]['sample_index']} / {data['moved'][0]['rollout_n']}"
    link = first[6].find_element(By.TAG_NAME, "a")
    assert link.get_attribute("href") == f"http://127.0.0.1:16686/trace/{data['moved'][0]['trace_id_b']}"
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    assert severe_console(browser) == []
    shot = tmp_path / "compare.png"
    assert browser.save_screenshot(str(shot)) and png_size(shot)[0] >= 1000


def test_user_strings_on_the_page_are_text(tmp_path) -> None:
    """A tool name with markup reaches the page as data, never as markup."""
    from otel_agentloop.analysis._rendering._compare_html import render_compare_html
    from otel_agentloop.metrics import compute_metrics, summarize

    table = _table([(0.1, 0.2, 0.01)] * 4)
    evil = "</script><img src=x onerror=alert(1)>"
    side = StepSide(summarize(table, compute_metrics(table), 1, tools={evil: [0.2] * 4}), False, table)
    page = render_compare_html(compare(side, side).to_json())
    assert "</script><img" not in page and "<img" not in page
    assert page.count("</script>") == 2


@pytest.mark.e2e  # a subprocess
def test_compare_validation_passes_of_the_demo(tmp_path) -> None:
    """``--validate`` compares the two steps' validation passes (the simulated main job's, every 2 steps), with the
    numbers of ``report --step N --validate``; the training passes are not mixed in."""
    sim = subprocess.run(
        [
            *(sys.executable, "-m", "otel_agentloop", "simulate", "--steps", "4", "--prompts", "3", "--rollout-n", "2"),
            *("--time-scale", "0.05", "--val-every", "2", "--quiet", "--json", "--file", "run.jsonl"),
        ],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert sim.returncode == 0, sim.stderr
    out = _report(tmp_path, "--compare", "2", "4", "--validate", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["a"]["validate"] is data["b"]["validate"] is True
    for side, step in (("a", 2), ("b", 4)):
        metrics = json.loads(_report(tmp_path, "--step", str(step), "--validate", "--json").stdout)["metrics"]
        training = json.loads(_report(tmp_path, "--step", str(step), "--json").stdout)["metrics"]
        for row in (r for r in data["rows"] if r["kind"] == "phase"):
            key = f"{sc.METRIC_PREFIX}/{row['name']}/max"
            assert row[side]["max"] == metrics[key]
        gen_max = f"{sc.METRIC_PREFIX}/{GEN}/max"
        assert metrics[gen_max] != training[gen_max]  # the validation pass is its own data
    assert "(validation)" in _report(tmp_path, "--compare", "2", "4", "--validate").stdout.splitlines()[0]
    missing = _report(tmp_path, "--compare", "1", "2", "--validate")
    assert missing.returncode == 1 and missing.stderr.strip() == (
        "report: no validation summary or sample spans for step 1 (steps with a summary or sample spans: 1, 2, 3, 4; "
        "validation: 2, 4)"
    )
