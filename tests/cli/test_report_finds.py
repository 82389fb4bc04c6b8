"""``report`` for a newcomer (issue 27), on trace files: ``--help`` shows every default; each "nothing found" line
says what was searched and what exists (steps listed once, validation passes marked); an unreachable Jaeger is a
short line with a hint; the pages' trace links open a trace view that works (the sample's waterfall on the step's
own timeline page, Jaeger only at a ``--jaeger-ui`` the user names); a run page offers step pages only when it has
them; counts are worded in the singular for 1.

Real spans: the simulated main job (``simulate --workers 0``) writing a file through the library, and small
drivers writing through the public API. The CLI runs as a subprocess; pages open in the real headless browser.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_agentloop.cli import build_parser
from tests._support.browser import open_page, severe_console
from tests._support.otlp_lines import run_cli
from tests._support.runs import cli

pytestmark = pytest.mark.e2e  # the CLI or Python in subprocesses

RUN = "finds"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three steps of 3 x 2 samples, a validation pass at step 2 (steps 1, 2, 2 validation, 3)."""
    cwd = tmp_path_factory.mktemp("finds")
    sim = cli(
        cwd,
        *("simulate", "--workers", "0", "--steps", "3", "--prompts", "3", "--rollout-n", "2", "--val-every", "2"),
        *("--time-scale", "0.03", "--quiet", "--file", "run.jsonl"),
        run=RUN,
    )
    assert sim.returncode == 0, sim.stderr
    return cwd


def _report(cwd: Path, *args: str) -> tuple[int, str, str]:
    out = cli(cwd, "report", "--file", "run.jsonl", *args)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, out.stdout, out.stderr


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


# -- --help -----------------------------------------------------------------------------------------------------
def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


IMPLICIT = {
    "report": {
        "--service",
        "--since",
        "--since-minutes",
        "--step",
        "--sample",
        "--jaeger-ui",
        "--run-id",
        "--step-pages",
    },
    "simulate": {"--endpoint", "--protocol", "--file", "--trace-per"},
}
"""Options without a value of their own whose absence still means something: their help says what."""


@pytest.mark.parametrize("command", ["report", "simulate"])
def test_help_shows_every_default(tmp_path: Path, command: str) -> None:
    """``--help`` shows each option's default: ``(default: VALUE)`` for every option with one, and in words what
    happens without the options that have none but mean something (``--service``: OTEL_SERVICE_NAME, else every
    service with agent-loop spans)."""
    out = cli(tmp_path, command, "--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    sub = _subparsers(build_parser())[command]
    with_value = [a for a in sub._actions if a.option_strings and a.nargs != 0 and a.default is not None]
    assert len(with_value) >= 4
    for action in with_value:
        assert f"(default: {action.default})" in text, action.option_strings
    named = {o for a in sub._actions for o in a.option_strings if a.default is None}
    assert named >= IMPLICIT[command]
    for action in sub._actions:
        if IMPLICIT[command] & set(action.option_strings):
            assert action.help and "default" in action.help and " ".join(action.help.split())[:30] in text
    if command == "report":
        assert "(default: OTEL_SERVICE_NAME when set, else every service with agent-loop spans" in text
        assert "(default: all that Jaeger stores)" in text and "(default: 500)" in text
    else:
        assert "--steps STEPS training steps (default: 3)" in text
        assert "the traces' service.name (default: otel-agentloop-sim)" in text


# -- "nothing found" says what exists -----------------------------------------------------------------------------
def test_found_steps_lists_each_step_once_and_marks_validation(demo: Path) -> None:
    rc, _, err = _report(demo, "--step", "7")
    assert rc == 1
    assert _one_line(err) == "report: no samples for step 7 in run.jsonl (found steps: 1, 2, 3; validation: 2)"


def test_compare_with_a_missing_step_lists_the_steps_there_are(demo: Path) -> None:
    rc, out, err = _report(demo, "--compare", "2", "5")
    assert rc == 1 and out == ""
    assert _one_line(err) == (
        "report: no summary or sample spans for step 5 (steps with a summary or sample spans: 1, 2, 3; validation: 2)"
    )


NO_SAMPLES = """
import sys
from opentelemetry import trace
import otel_agentloop as oal
from otel_agentloop import semconv as sc

handle = oal.configure("no-samples-svc", file=sys.argv[1], resource_attributes={sc.RL_RUN_ID: "quiet-run"})
trace.get_tracer("user").start_span("user work", attributes={sc.RL_STEP: 4}).end()
handle.shutdown()
"""


def test_no_sample_spans_names_the_file_and_the_runs_it_holds(tmp_path: Path) -> None:
    (tmp_path / "driver.py").write_text(NO_SAMPLES)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    made = subprocess.run(
        [sys.executable, "driver.py", "spans.jsonl"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert made.returncode == 0, made.stderr
    out = run_cli(["report", "--file", "spans.jsonl"], tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert _one_line(out.stderr) == (
        "report: no sample spans found in spans.jsonl; runs: quiet-run (service no-samples-svc; steps none)"
    )
    (tmp_path / "empty.jsonl").write_text("")
    out = run_cli(["report", "--file", "empty.jsonl", "--step", "2"], tmp_path)
    assert _one_line(out.stderr) == "report: no sample spans for step 2 found in empty.jsonl; it holds no spans"
    out = run_cli(["report", "--file", "empty.jsonl", "--run"], tmp_path)
    assert _one_line(out.stderr) == "report: no steps found in empty.jsonl; it holds no spans"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_jaeger_is_a_short_line_with_a_hint(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    for mode in ([], ["--runs"], ["--run"], ["--service", "svc", "--step", "1"]):
        out = cli(tmp_path, "report", "--jaeger", url, "--timeout", "5", *mode)
        assert out.returncode == 1 and "Traceback" not in out.stderr
        line = _one_line(out.stderr)
        assert line.startswith(f"report: cannot query Jaeger at {url}: ") and "refused" in line.lower(), line
        assert "is it running? (`make up` starts one" in line and "/api/v3" not in line, line
        assert len(line) < 250, line


@pytest.fixture
def foreign_jaeger() -> Iterator[str]:
    """An HTTP server answering api_v3 as a Jaeger that holds only other programs' traces."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body: object = {"services": ["billing", "frontend"]}
            if self.path.startswith("/api/v3/operations"):
                body = {"operations": [{"name": "GET /cart"}, {"name": "SELECT"}]}
            elif not self.path.startswith("/api/v3/services"):
                self.send_error(404)
                return
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_jaeger_without_agent_loop_services_says_which_services_it_has(tmp_path: Path, foreign_jaeger: str) -> None:
    for mode in ([], ["--runs"], ["--run"]):
        out = cli(tmp_path, "report", "--jaeger", foreign_jaeger, *mode)
        assert out.returncode == 1 and "Traceback" not in out.stderr
        assert _one_line(out.stderr) == (
            f"report: no sample spans found in Jaeger {foreign_jaeger}: no service has agent-loop spans (rl.* span "
            "names); services: billing, frontend"
        )


# -- pages link to a trace view that works ------------------------------------------------------------------------
def test_run_page_links_each_slowest_trace_to_its_waterfall(demo: Path, browser) -> None:
    """No ``--jaeger-ui``: no Jaeger link; each step's slowest trace links to that sample's waterfall on the step's
    timeline page, which opens with it shown. The title counts 1 validation pass in the singular."""
    from selenium.webdriver.common.by import By

    rc, out, err = _report(demo, "--run", "--html", "run.html")
    assert rc == 0, err
    assert "run page written to run.html (4 steps, 4 timeline pages)" in out
    open_page(browser, demo / "run.html")
    assert browser.find_element(By.ID, "title").text == f"Run {RUN}: 3 training steps (1 to 3) and 1 validation pass"
    assert browser.find_element(By.ID, "steps-hint").text == "Click a step to open its timeline page."
    assert browser.find_elements(By.CSS_SELECTOR, "a.jaeger-link") == []
    links = browser.find_elements(By.CSS_SELECTOR, "a.trace-link")
    assert len(links) == 4
    summary = json.loads(_report(demo, "--run", "--json")[1])
    by_step = {  # the stored summary's slowest sample: [index, rollout, trace id, ...]
        (s["step"], s["validate"]): dict(zip(("index", "rollout", "trace_id"), s["slowest"], strict=False))
        for s in summary["steps"]
    }
    hrefs = [str(a.get_attribute("href")) for a in links]
    for (step, validate), slow in by_step.items():
        page = f"run.steps/step-{step}{'-validation' if validate else ''}.html"
        want = f"{page}#trace={slow['trace_id']}&sample={slow['index']}/{slow['rollout']}"
        assert (demo / page).is_file()
        assert any(h.endswith(want) for h in hrefs), (want, hrefs)
    step3 = next(h for h in hrefs if "/step-3.html#" in h)
    browser.get(step3)
    detail = browser.find_element(By.ID, "detail")
    slow = by_step[(3, False)]
    assert detail.get_attribute("data-sample") == f"{slow['index']}/{slow['rollout']}"
    assert detail.find_element(By.CSS_SELECTOR, ".trace-id").text == slow["trace_id"]
    assert detail.find_elements(By.CSS_SELECTOR, ".wf-row")  # the waterfall is drawn
    assert detail.find_elements(By.CSS_SELECTOR, "a.jaeger-link") == []
    own = detail.find_element(By.CSS_SELECTOR, "a.trace-link").get_attribute("href")
    assert str(own).endswith(f"#trace={slow['trace_id']}&sample={slow['index']}/{slow['rollout']}")
    assert severe_console(browser) == []


def test_run_page_without_step_pages_does_not_offer_them(demo: Path, browser) -> None:
    from selenium.webdriver.common.by import By

    rc, out, err = _report(demo, "--run", "--html", "bare.html", "--step-pages", "0")
    assert rc == 0, err
    assert "(4 steps, 0 timeline pages)" in out and not (demo / "bare.steps").exists()
    open_page(browser, demo / "bare.html")
    hint = browser.find_element(By.ID, "steps-hint").text
    assert hint.startswith("No step timeline pages were written with this page"), hint
    assert "Click a step to open" not in browser.find_element(By.TAG_NAME, "body").text
    assert browser.find_elements(By.CSS_SELECTOR, "a.trace-link, a.step-link") == []


def test_compare_page_links_moved_samples_to_their_waterfalls(demo: Path, browser) -> None:
    from selenium.webdriver.common.by import By

    rc, _, err = _report(demo, "--compare", "1", "3", "--html", "cmp.html")
    assert rc == 0, err
    assert (demo / "cmp.steps" / "step-1.html").is_file() and (demo / "cmp.steps" / "step-3.html").is_file()
    open_page(browser, demo / "cmp.html")
    assert browser.find_elements(By.CSS_SELECTOR, "a.jaeger-link") == []
    links = browser.find_elements(By.CSS_SELECTOR, "#moved a.trace-link")
    data = json.loads(_report(demo, "--compare", "1", "3", "--json")[1])
    assert len(links) == 2 * len(data["moved"]) > 0
    first = data["moved"][0]
    who = f"{first['sample_index']}/{first['rollout_n']}"
    href = str(links[1].get_attribute("href"))
    assert href.endswith(f"cmp.steps/step-3.html#trace={first['trace_id_b']}&sample={who}"), href
    browser.get(href)
    detail = browser.find_element(By.ID, "detail")
    assert detail.get_attribute("data-sample") == who
    assert detail.find_element(By.CSS_SELECTOR, ".trace-id").text == first["trace_id_b"]


def test_jaeger_links_only_at_the_ui_the_user_names(demo: Path) -> None:
    """``--jaeger-ui URL``: the pages' data carry that base (the browser tests of the step, run and compare pages
    check the links it makes); without it, none."""
    ui = "http://jaeger.example.test:16686/ui"
    for args, page in (
        (["--step", "3", "--html", "s.html"], "s.html"),
        (["--run", "--html", "r.html", "--step-pages", "0"], "r.html"),
        (["--compare", "1", "3", "--html", "c.html"], "c.html"),
    ):
        for extra, want in (([], None), (["--jaeger-ui", ui + "/"], ui)):
            rc, _, err = _report(demo, *args, *extra)
            assert rc == 0, err
            text = (demo / page).read_text()
            raw = text.split('type="application/json">', 1)[1].split("</script>", 1)[0]
            assert json.loads(raw)["jaeger"] == want, (args, extra)


# -- wording ------------------------------------------------------------------------------------------------------
def test_simulate_banner_counts_in_the_singular(tmp_path: Path) -> None:
    out = cli(
        tmp_path,
        *("simulate", "--workers", "0", "--steps", "1", "--prompts", "1", "--rollout-n", "1", "--val-every", "0"),
        *("--time-scale", "0.01", "--quiet", "--file", "one.jsonl"),
    )
    assert out.returncode == 0, out.stderr
    assert "otel-agentloop simulate: 1 step x 1 sample; traces -> " in out.stdout, out.stdout
