"""The step timeline page (``report --html``), opened from disk in a real headless browser.

Debian's ``chromium`` driven by selenium through Debian's ``chromium-driver`` (``make browser``, a step of
``make test``, installs both with ``scripts/install_chromium.sh``; no test installs anything). Without them the
browser tests skip, except under ``CI=true``, where they fail. The input is real spans: the simulated main job
(``simulate --workers 0``) writing a trace file, and a step run in-process with the library where one sample
really hangs and one is slow, each snapshotted while still open the way the watchdog does (``rl.snapshot``).

The README's pictures come from the commands it names (``scripts/docs_pictures.py``), not from here.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry import trace

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop import testing
from otel_agentloop.analysis import build_step_view, read_jsonl
from otel_agentloop.analysis._rendering._html import jaeger_ui_base
from otel_agentloop.analysis._rendering._timeline_html import render_html
from otel_agentloop.core._context import SampleHandle
from otel_agentloop.demo._agent import SimConfig, generate, run_sample
from otel_agentloop.metrics import SpanRecord
from otel_agentloop.metrics._summary import FAILED, HUNG, SLOW
from tests._support import REPO_ROOT
from tests._support.browser import open_page, png_size, severe_console, step_rows

ROOT = REPO_ROOT
JAEGER_UI = "http://127.0.0.1:16686"


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-m", "otel_agentloop", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )


# -- inputs: real spans ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The main job, in-process workers, writing a trace file; returns its directory."""
    cwd = tmp_path_factory.mktemp("sim")
    out = _cli(
        cwd,
        "simulate",
        "--workers",
        "0",
        "--steps",
        "2",
        "--prompts",
        "6",
        "--rollout-n",
        "4",
        "--time-scale",
        "0.05",
        "--val-every",
        "0",
        "--quiet",
        "--json",
        "--file",
        "run.jsonl",
    )
    assert out.returncode == 0, out.stderr
    return cwd


def _snapshot(tracer: trace.Tracer, handle: SampleHandle, phase: str) -> None:
    """What the watchdog exports for a still-open sample (the hung-sample contract)."""
    root = handle.span
    attrs = dict(handle.phase_attributes)
    attrs[sc.RL_PHASE] = phase
    attrs[sc.RL_SNAPSHOT] = True
    span = tracer.start_span(
        sc.SAMPLE_SPAN + sc.SNAPSHOT_SUFFIX,
        context=trace.set_span_in_context(root),
        attributes=attrs,
        start_time=root.start_time,
    )  # type: ignore[union-attr]
    span.end()


@oal.trace_tool("search")
async def _stuck_search(release: asyncio.Event) -> str:
    await release.wait()  # a tool backend that never answers
    return "never"


@oal.trace_tool("python")
async def _slow_python(delay_s: float) -> str:
    await asyncio.sleep(delay_s)
    return "late"


async def _hung_step(handle: oal.Handle, step: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """One step of 16 real simulated samples (one failing), plus one that hangs in a tool call and one whose tool
    call is slow; each gets a snapshot while still open. The step is collected with the hung one still running."""
    tracer = handle.provider.get_tracer("otel_agentloop.test.watchdog")  # type: ignore[union-attr]
    cfg = SimConfig(prompts=4, rollout_n=4, time_scale=0.3, seed=3, fail_samples=frozenset({2}))
    hung_key, slow_key = (4, 0), (4, 1)
    release = asyncio.Event()

    open_samples: dict[str, SampleHandle] = {}

    async def hung() -> None:
        async with oal.sample(*hung_key) as h:
            open_samples["hung"] = h
            await generate(random.Random(1), cfg, 100)
            await _stuck_search(release)

    async def slow() -> None:
        async with oal.sample(*slow_key) as h:
            await generate(random.Random(2), cfg, 100)
            tool = asyncio.ensure_future(_slow_python(0.35))
            await asyncio.sleep(0.12)
            _snapshot(tracer, h, sc.TOOL_CALLS)
            await tool

    with oal.step(step):
        hung_task = asyncio.ensure_future(hung())
        await asyncio.gather(slow(), *(run_sample(cfg, step, i, n) for i, n in cfg.work()), return_exceptions=True)
        await asyncio.sleep(0.1)
        _snapshot(tracer, open_samples["hung"], sc.TOOL_CALLS)  # the watchdog's view of the one still open
    # the step is collected while the hung sample still runs: its spans so far are exported, its root never is
    assert handle.force_flush(10)
    handle.shutdown(10)
    hung_task.cancel()
    await asyncio.gather(hung_task, return_exceptions=True)
    return hung_key, slow_key


@pytest.fixture(scope="module")
def hung_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[int, int], tuple[int, int]]:
    cwd = tmp_path_factory.mktemp("hung")
    with pytest.MonkeyPatch.context() as mp:  # module scope: set up before the per-test isolation
        for key in [k for k in os.environ if k.startswith("OTEL_")]:
            mp.delenv(key)
        handle = oal.configure("hung-job", file=str(cwd / "hung.jsonl"), set_global=False, schedule_delay_s=0.05)
        try:
            hung_key, slow_key = asyncio.run(_hung_step(handle, 7))
        finally:
            handle.shutdown(5)
            testing.reset()
    return cwd, hung_key, slow_key


def test_hung_job_spans_are_real_and_the_view_classifies_them(hung_job) -> None:
    cwd, hung_key, slow_key = hung_job
    records = list(read_jsonl(str(cwd / "hung.jsonl")))
    view = build_step_view(records, 7)
    by_key = {s.key: s for s in view.samples}
    assert len(view.samples) == 18 and view.counts[HUNG] == 1 and view.counts[SLOW] == 1
    hung, slow = by_key[hung_key], by_key[slow_key]
    assert hung.state == HUNG and slow.state == SLOW
    assert view.samples[0] is hung  # the tail first: hung samples on top, drawn to the snapshot time
    assert hung.end_ns == hung.snapshot.end_ns and hung.current_phase == sc.TOOL_CALLS
    gen = next(
        r
        for r in records
        if r.attributes.get(sc.RL_SAMPLE_INDEX) == 4
        and r.attributes.get(sc.RL_ROLLOUT_N) == 0
        and r.attributes.get(sc.RL_PHASE) == sc.GENERATE
    )
    open_bar = hung.bars[-1]
    assert open_bar.open and open_bar.phase == sc.TOOL_CALLS and open_bar.start_ns == gen.end_ns
    assert hung.trace_id == gen.trace_id_hex  # the sample's own trace, for the Jaeger link
    # a slow sample's snapshot is not phase time: its tool time is the finished tool span's
    tool = next(r for r in records if r.name == "execute_tool python" and r.attributes[sc.RL_SAMPLE_INDEX] == 4)
    assert slow.phase_s[sc.TOOL_CALLS] == pytest.approx(tool.duration_s, abs=1e-9)
    assert by_key[(2, 0)].state == FAILED
    # the rest by end time, last-ending first
    ends = [s.end_ns for s in view.samples[1:]]
    assert ends == sorted(ends, reverse=True)


@pytest.mark.e2e  # a subprocess
def test_report_ignores_snapshots_and_names_hung_samples(hung_job) -> None:
    cwd, hung_key, slow_key = hung_job
    out = _cli(cwd, "report", "--file", "hung.jsonl", "--json", "--top", "50")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["step"] == 7
    rows = {(r["sample_index"], r["rollout_n"]): r for r in data["slowest"]}
    records = list(read_jsonl(str(cwd / "hung.jsonl")))

    def spans_of(key: tuple[int, int], name: str) -> list[SpanRecord]:
        return [
            r
            for r in records
            if r.name == name
            and r.attributes.get(sc.RL_SAMPLE_INDEX) == key[0]
            and r.attributes.get(sc.RL_ROLLOUT_N) == key[1]
        ]

    # the hung sample was still running at collect: left out of the metrics (as collect() left it out), named
    assert hung_key not in rows and data["metrics"]["agent_loop/num_samples"] == 17
    assert [(h["sample_index"], h["rollout_n"]) for h in data["verdicts"]["hung"]] == [hung_key]
    assert data["verdicts"]["counts"] == {"ok": 12, "failed": 4, "slow": 1, "hung": 1}
    assert rows[slow_key]["verdict"] == SLOW and rows[(2, 0)]["verdict"] == FAILED
    # snapshots add no phase time: the slow one has its real tool time
    (tool,) = spans_of(slow_key, "execute_tool python")
    assert rows[slow_key][sc.TOOL_CALLS] == pytest.approx(tool.duration_s, abs=1e-6)
    text = _cli(cwd, "report", "--file", "hung.jsonl", "--html", "p.html")
    assert text.returncode == 0, text.stderr
    assert (
        f"hung samples (still running when the step was collected; not in its metrics): {hung_key[0]}/{hung_key[1]}"
        " (tool_calls, trace" in text.stdout
    )
    assert "timeline page written to p.html" in text.stdout


@pytest.mark.e2e  # a subprocess
def test_browser_shows_one_row_per_sample_and_the_slowest_waterfall(simulated, browser, tmp_path) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    page = tmp_path / "step2.html"
    out = _cli(
        simulated,
        "report",
        "--file",
        "run.jsonl",
        "--step",
        "2",
        "--json",
        "--html",
        str(page),
        "--jaeger-ui",
        JAEGER_UI + "/",
    )
    assert out.returncode == 0, out.stderr
    slowest_tid = json.loads(out.stdout)["slowest_trace_id"]
    records = list(read_jsonl(str(simulated / "run.jsonl")))
    roots = {r.trace_id_hex: r for r in records if r.name == sc.SAMPLE_SPAN and r.attributes[sc.RL_STEP] == 2}
    assert len(roots) == 24

    open_page(browser, page)
    rows = step_rows(browser)
    assert len(rows) == 24  # one row per sample ...
    assert {r.get_attribute("data-trace-id") for r in rows} == set(roots)  # ... each a real sample
    ends = [roots[r.get_attribute("data-trace-id")].end_ns for r in rows]
    assert ends == sorted(ends, reverse=True)  # the tail first: last-ending on top
    assert [r.get_attribute("data-sample") for r in rows if r.get_attribute("data-slowest")] == [
        "{}/{}".format(*(lambda a: (a[sc.RL_SAMPLE_INDEX], a[sc.RL_ROLLOUT_N]))(roots[slowest_tid].attributes))
    ]
    # parallel tool calls are drawn as overlapping bars in separate lanes somewhere in the step
    lanes = browser.execute_script("return Array.from(document.querySelectorAll('.bar.p1')).map(b => b.style.top)")
    assert len(set(lanes)) >= 2

    # hover: the sample's identity and phase times
    slow_row = next(r for r in rows if r.get_attribute("data-trace-id") == slowest_tid)
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", slow_row)
    ActionChains(browser).move_to_element(slow_row.find_element(By.CSS_SELECTOR, ".label")).perform()
    tip = browser.find_element(By.ID, "tip")
    WebDriverWait(browser, 5).until(lambda d: tip.is_displayed())
    attrs = roots[slowest_tid].attributes
    assert f"sample {attrs[sc.RL_SAMPLE_INDEX]} / rollout {attrs[sc.RL_ROLLOUT_N]} · step 2" in tip.text
    assert f"trace {slowest_tid}" in tip.text and "generation" in tip.text and "reward" in tip.text

    # click the slowest: its waterfall, span by span, and the link to its trace in Jaeger
    slow_row.click()
    detail = browser.find_element(By.ID, "detail")
    WebDriverWait(browser, 5).until(lambda d: detail.get_attribute("data-sample") is not None)
    assert detail.find_element(By.CSS_SELECTOR, ".trace-id").text == slowest_tid
    names = [e.get_attribute("textContent") for e in detail.find_elements(By.CSS_SELECTOR, ".wf-row .wf-name")][1:]
    trace_spans = [r for r in records if r.trace_id_hex == slowest_tid]
    assert sorted(names) == sorted(r.name for r in trace_spans)
    assert names[0] == sc.SAMPLE_SPAN and "text_completion sim-7b" in names and "rl.reward" in names
    durations = [e.text for e in detail.find_elements(By.CSS_SELECTOR, ".wf-row .wf-dur")]
    assert durations[0] == f"{roots[slowest_tid].duration_s:.3f} s"
    link = detail.find_element(By.CSS_SELECTOR, "a.jaeger-link")
    assert link.get_attribute("href") == f"{JAEGER_UI}/trace/{slowest_tid}"
    assert "selected" in slow_row.get_attribute("class")

    # per-phase histograms: every finished sample counted once in each
    hists = browser.find_elements(By.CSS_SELECTOR, "#hists .hist")
    assert [h.get_attribute("data-phase") for h in hists] == [*sc.PHASES, "total"]
    for h in hists:
        titles = [b.get_attribute("title") for b in h.find_elements(By.CSS_SELECTOR, ".plot b")]
        assert sum(int(t.split()[0]) for t in titles) == 24

    # self-contained: nothing was fetched, nothing failed
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    assert severe_console(browser) == []
    shot = tmp_path / "step2.png"
    assert browser.save_screenshot(str(shot))
    assert png_size(shot)[0] >= 1000


@pytest.mark.e2e  # a subprocess
def test_browser_marks_hung_slow_and_failed_samples(hung_job, browser, tmp_path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    cwd, hung_key, slow_key = hung_job
    page = tmp_path / "hung.html"
    out = _cli(cwd, "report", "--file", "hung.jsonl", "--html", str(page), "--jaeger-ui", JAEGER_UI)
    assert out.returncode == 0, out.stderr
    open_page(browser, page)
    rows = step_rows(browser)
    assert len(rows) == 18
    states = {r.get_attribute("data-sample"): r.get_attribute("data-state") for r in rows}
    assert states["{}/{}".format(*hung_key)] == "hung" and states["{}/{}".format(*slow_key)] == "slow"
    assert states["2/0"] == "failed"
    hung = rows[0]  # the tail first
    assert hung.get_attribute("data-state") == "hung"
    assert hung.find_element(By.CSS_SELECTOR, ".tag.hung").text == "HUNG"
    assert hung.find_element(By.CSS_SELECTOR, ".end-mark").text == "still open"
    assert hung.find_elements(By.CSS_SELECTOR, ".bar.open.p1")  # the tool call it is stuck in
    # the hung sample's line reaches the right edge: it is drawn to the snapshot, the last moment seen
    right = browser.execute_script(
        "const t = arguments[0].querySelector('.track'), l = arguments[0].querySelector('.life');"
        "const s = arguments[0].querySelector('.snap');"
        "return [t.getBoundingClientRect().right, l.getBoundingClientRect().right, s.getBoundingClientRect().left]",
        hung,
    )
    assert abs(right[0] - right[1]) < 2 and abs(right[1] - right[2]) < 2
    slow = next(r for r in rows if r.get_attribute("data-state") == "slow")
    assert slow.find_element(By.CSS_SELECTOR, ".tag.slow").text == "slow" and slow.find_elements(
        By.CSS_SELECTOR, ".snap"
    )
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", hung)
    hung.click()
    detail = browser.find_element(By.ID, "detail")
    WebDriverWait(browser, 5).until(lambda d: detail.get_attribute("data-sample") == "{}/{}".format(*hung_key))
    assert "HUNG in tool" in detail.text
    names = [e.get_attribute("textContent") for e in detail.find_elements(By.CSS_SELECTOR, ".wf-name")][1:]
    assert names == [sc.SAMPLE_SPAN + sc.SNAPSHOT_SUFFIX, "text_completion sim-7b"]
    assert severe_console(browser) == []


HOSTILE = '</script><img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


def _hostile_records() -> list[SpanRecord]:
    t = 1_700_000_000_000_000_000
    ident = {sc.RL_STEP: 1, sc.RL_VALIDATE: False, sc.RL_SAMPLE_INDEX: 0, sc.RL_ROLLOUT_N: 0}
    root = SpanRecord(0xAB, 1, 0, sc.SAMPLE_SPAN, t, t + 10**9, dict(ident))
    tool = SpanRecord(
        0xAB,
        2,
        1,
        "execute_tool " + HOSTILE,
        t + 10**8,
        t + 5 * 10**8,
        {**ident, sc.RL_PHASE: sc.TOOL_CALLS, sc.ERROR_TYPE: HOSTILE},
        error=True,
        status_message="<b>bold</b> & 'quoted'",
    )
    return [root, tool]


def test_user_strings_are_text_never_markup(browser, tmp_path) -> None:
    from selenium.webdriver.common.by import By

    view = build_step_view(_hostile_records(), 1)
    page_text = render_html(view, source=HOSTILE, jaeger_ui="javascript:alert(1)")
    assert HOSTILE not in page_text and "<img" not in page_text and "<b>bold" not in page_text
    page = tmp_path / "hostile.html"
    page.write_text(page_text, encoding="utf-8")
    open_page(browser, page)
    rows = step_rows(browser)
    assert len(rows) == 1
    rows[0].click()
    assert browser.execute_script("return window.__pwned === undefined && document.querySelectorAll('img').length") == 0
    names = [e.get_attribute("textContent") for e in browser.find_elements(By.CSS_SELECTOR, ".wf-name")]
    assert "execute_tool " + HOSTILE in names  # shown as the literal text it is
    info = browser.find_element(By.CSS_SELECTOR, ".wf-info").get_attribute("textContent")
    assert HOSTILE in info and "<b>bold</b> & 'quoted'" in info
    assert HOSTILE in browser.find_element(By.ID, "summary").text
    assert browser.find_elements(By.CSS_SELECTOR, "a.jaeger-link") == []  # not an http(s) base: no link
    assert severe_console(browser) == []


@pytest.mark.e2e  # a subprocess
def test_page_is_self_contained_and_jaeger_base_is_checked(simulated, tmp_path) -> None:
    page = tmp_path / "p.html"
    out = _cli(simulated, "report", "--file", "run.jsonl", "--html", str(page), "--jaeger-ui", "ftp://x")
    assert out.returncode == 0 and "not an http(s) URL" in out.stderr
    text = page.read_text(encoding="utf-8")
    assert not re.search(r"""\s(src|href)=|<link|@import|url\(|https?://""", text, re.I)
    data = json.loads(
        re.search(r'<script id="timeline-data" type="application/json">(.*?)</script>', text, re.S).group(1)
    )
    assert data["jaeger"] is None and data["step"] == 2 and len(data["samples"]) == 24
    assert jaeger_ui_base("http://h:16686/jaeger/") == "http://h:16686/jaeger"
    assert jaeger_ui_base("javascript:alert(1)") is None and jaeger_ui_base("") is None


@pytest.mark.e2e  # a subprocess
def test_timeline_png_and_the_waterfall_png_stay_apart(simulated) -> None:
    out = _cli(simulated, "report", "--file", "run.jsonl", "--png", "w.png", "--timeline-png", "t.png")
    assert out.returncode == 0, out.stderr
    assert "waterfall written to w.png" in out.stdout and "timeline PNG written to t.png" in out.stdout
    w, t = png_size(simulated / "w.png"), png_size(simulated / "t.png")
    assert t != w and t[0] > w[0]  # the timeline has the histograms at its side
    assert (simulated / "t.png").stat().st_size > 20_000
