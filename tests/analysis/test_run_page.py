"""The run page (``report --run --html``), opened from disk in the real headless browser (as the step page's test).

Input: real spans, two runs of the simulated main job appended to one file (the page must show the latest run's
steps only, with its own numbers); the misbehaving one makes tool calls slower and fails samples from step 3.
Checked: every step is a row, the slowest sample's trace id of each step is on the page, a click on a step opens
that step's timeline page (and the slowest sample is a row there), a click on the wall-time chart does too.

The README's picture comes from ``scripts/docs_pictures.py`` (a test writes only inside its tmp_path).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._support.browser import open_page, severe_console
from tests._support.runs import cli

pytestmark = pytest.mark.e2e  # the CLI or Python in subprocesses

JAEGER_UI = "http://127.0.0.1:16686"


@pytest.fixture(scope="module")
def run_page(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    cwd = tmp_path_factory.mktemp("run-page")
    common = ["simulate", "--workers", "0", "--prompts", "6", "--rollout-n", "4", "--quiet", "--file", "run.jsonl"]
    first = cli(cwd, *common, "--steps", "2", "--time-scale", "0.05", run="earlier")
    assert first.returncode == 0, first.stderr
    demo = cli(cwd, *common, "--steps", "6", "--time-scale", "0.1", "--misbehave", "--val-every", "2", run="demo")
    assert demo.returncode == 0, demo.stderr
    out = cli(cwd, "report", "--file", "run.jsonl", "--run", "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    page = cli(cwd, "report", "--file", "run.jsonl", "--run", "--html", "run.html", "--jaeger-ui", JAEGER_UI)
    assert page.returncode == 0, page.stderr
    assert "run page written to run.html (9 steps, 9 timeline pages)" in page.stdout
    return cwd, summary


def test_run_page_shows_every_step_and_opens_its_timeline(run_page, browser) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    cwd, summary = run_page
    assert summary["run"] == "demo"  # the latest run; the earlier one is not merged in
    train = [s for s in summary["steps"] if not s["validate"]]
    val = [s for s in summary["steps"] if s["validate"]]
    assert [s["step"] for s in train] == [1, 2, 3, 4, 5, 6] and len(val) == 3
    assert all(s["n"] + s["counts"]["hung"] == 24 for s in summary["steps"])  # a hung sample is not finished
    open_page(browser, cwd / "run.html")
    WebDriverWait(browser, 10).until(lambda d: d.execute_script("return document.body.dataset.ready") == "true")
    rows = browser.find_elements(By.CSS_SELECTOR, "#steps tr.step-row")
    assert [r.get_attribute("data-step") for r in rows] == ["1", "2", "3", "4", "5", "6"]
    assert len(browser.find_elements(By.CSS_SELECTOR, "#val-steps tr.step-row")) == 3
    assert "Run demo: 6 training steps (1 to 6) and 3 validation passes" in browser.find_element(By.ID, "title").text
    for row, s in zip(rows, train, strict=True):
        trace_id = s["slowest"][2]
        assert row.find_element(By.CSS_SELECTOR, ".trace-id").text == trace_id
        href = row.find_element(By.CSS_SELECTOR, "a.jaeger-link").get_attribute("href")
        assert href == f"{JAEGER_UI}/trace/{trace_id}"
    assert browser.find_element(By.ID, "wall").get_attribute("data-points") == "6"
    assert severe_console(browser) == []

    # a click on step 2 opens its timeline page, where the same slowest sample is the one marked slowest
    link = rows[1].find_element(By.CSS_SELECTOR, "a.step-link")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", link)
    link.click()
    WebDriverWait(browser, 10).until(lambda d: d.current_url.endswith("/run.steps/step-2.html"))
    WebDriverWait(browser, 10).until(lambda d: d.execute_script("return document.readyState") == "complete")
    slowest = browser.find_element(By.CSS_SELECTOR, '.row[data-slowest="true"]')
    assert slowest.get_attribute("data-trace-id") == train[1]["slowest"][2]
    assert len(browser.find_elements(By.CSS_SELECTOR, ".row")) == 24
    # every step's page holds the run page's slowest sample (a finished sample of that step) as a row
    for s in train:
        browser.get((cwd / "run.steps" / f"step-{s['step']}.html").resolve().as_uri())
        assert browser.find_elements(By.CSS_SELECTOR, f'.row[data-trace-id="{s["slowest"][2]}"]')

    # a click on the wall-time chart opens the step under the pointer (the last bar: step 6)
    open_page(browser, cwd / "run.html")
    canvas = browser.find_element(By.CSS_SELECTOR, "#wall canvas")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", canvas)
    width = canvas.size["width"]
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(browser).move_to_element_with_offset(canvas, width // 2 - 20, 0).click().perform()
    WebDriverWait(browser, 10).until(lambda d: d.current_url.endswith("/run.steps/step-6.html"))


def test_run_page_numbers_are_the_runs_own(run_page) -> None:
    """The tail of step 3 on (the misbehaving tool) is on the page's data, and the earlier run's steps are not."""
    cwd, summary = run_page
    text = (cwd / "run.html").read_text()
    data = json.loads(text.split('<script id="run-data" type="application/json">')[1].split("</script>")[0])
    rows = [dict(zip(data["fields"], r, strict=True)) for r in data["steps"]]
    assert [(r["step"], r["validate"]) for r in rows] == [(s["step"], int(s["validate"])) for s in summary["steps"]]
    steps = {s["step"]: s for s in summary["steps"] if not s["validate"]}
    for r in rows:
        if not r["validate"]:
            s = steps[r["step"]]
            assert r["samples"] == s["n"] and r["slowest_trace"] == s["slowest"][2]
            assert r["hung"] == s["counts"]["hung"] and r["failed"] == s["counts"]["failed"]
            assert r["wall_s"] == pytest.approx(r["median_s"] + r["tail_s"], abs=2e-4)
    tails = {r["step"]: r["tail_s"] for r in rows if not r["validate"]}
    assert min(tails[s] for s in (3, 4, 5, 6)) > 2 * max(tails[1], tails[2])  # the slower tool from step 3 on
