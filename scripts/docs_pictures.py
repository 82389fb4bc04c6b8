"""Re-take the pictures of the README and docs from commands the README names, on one run of
``make run ARGS="--misbehave"`` (3 steps; from step 3 one sample hangs in a tool call and one is slow).

    .venv/bin/python scripts/docs_pictures.py

Runs ``otel-agentloop simulate --workers 2 --misbehave`` (what ``make run ARGS="--misbehave"`` runs) in a fresh
folder, so its trace file holds this one run, then the README's ``report`` commands on that file
(``R="otel-agentloop report --file otel-agentloop-traces"``), and writes:

- ``docs/timeline.png``: ``$R --step 3 --html step3.html`` in headless Chromium, the hung sample's row clicked;
- ``docs/timeline-matplotlib.png``: ``--timeline-png``; ``docs/waterfall.png``: ``--png``, the slowest sample;
- ``docs/run-page.png``: ``$R --run --html run.html``;
- ``docs/compare.png``: ``$R --compare 1 3 --html compare.html``.

Prints what each picture shows (for the captions). Needs the ``ray`` and ``plot`` extras, selenium, and Debian's
chromium + chromium-driver (``make browser``).

    .venv/bin/python scripts/docs_pictures.py --engine

instead takes ``docs/engine-waterfall.png`` from a real vLLM run that preempts: the tiny model made locally and the
engine-load driver (``tests/engine/load_driver.py``: 10 concurrent 2-turn samples and an aborted-then-resumed turn
on an ``AsyncLLM`` with max_num_seqs=8, a KV cache of 16 blocks of 32 tokens, prefix caching on and a shared system
prompt, the user's own stat logger) in the engine venv (``scripts/engine_env.sh``), against a Jaeger + Collector on
free ports (``scripts/stack.py``); then ``report --jaeger URL --service rl-inproc --step 0 --html step0.html`` in
headless Chromium, the slowest sample's row clicked: its waterfall, each turn with the engine's queue/prefill/decode
drawn inside and vLLM's ``llm_request`` span as its child. Prints ``report --step 0`` (the terminal waterfall).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
REPORT = [sys.executable, "-m", "otel_agentloop", "report", "--file", "otel-agentloop-traces"]
SIMULATE = [sys.executable, "-m", "otel_agentloop", "simulate", "--workers", "2", "--misbehave"]
COMPARE = ("1", "3")
ENGINE_SERVICE = "rl-inproc"


def main() -> int:
    if sys.argv[1:] == ["--engine"]:
        return engine_main()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}  # traces to the default file
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        subprocess.run(SIMULATE, cwd=cwd, env=env, check=True)

        def report(*args: str) -> str:
            out = subprocess.run([*REPORT, *args], cwd=cwd, env=env, check=True, capture_output=True, text=True)
            if "--json" not in args:
                print(f"report {' '.join(args)}: {[ln for ln in out.stdout.splitlines() if 'written to' in ln]}")
            return out.stdout

        step = json.loads(report("--step", "3", "--json"))
        report("--step", "3", "--html", "step3.html", "--timeline-png", str(DOCS / "timeline-matplotlib.png"))
        report("--step", "3", "--png", str(DOCS / "waterfall.png"))  # report ignores --png next to --json
        run = json.loads(report("--run", "--json"))
        report("--run", "--html", "run.html")
        compare = json.loads(report("--compare", *COMPARE, "--json"))
        report("--compare", *COMPARE, "--html", "compare.html")
        with _Browser() as driver:
            _timeline(driver, cwd / "step3.html", DOCS / "timeline.png")
            _page(driver, cwd / "run.html", DOCS / "run-page.png", height=1250, ready="document.body.dataset.ready")
            _page(driver, cwd / "compare.html", DOCS / "compare.png", height=1250)
    _describe(step, run, compare)
    return 0


def _describe(step: dict[str, Any], run: dict[str, Any], compare: dict[str, Any]) -> None:
    counts = step["verdicts"]["counts"]
    hung = ", ".join(
        f"{h['sample_index']}/{h['rollout_n']} in {h['phase']} {h['tool']}" for h in step["verdicts"]["hung"]
    )
    print(f"timeline.png: step 3: {sum(counts.values())} samples: {counts}; hung: {hung}")
    print(f"waterfall.png: the slowest sample: {step['slowest'][0]}")
    for s in run["steps"]:
        kind = "validation" if s["validate"] else "step"
        print(f"run-page.png: {kind} {s['step']}: {s['n']} finished, {s['counts']}")
    print(f"compare.png: step {COMPARE[0]} -> step {COMPARE[1]}: {compare['cause']['text']}")


def engine_main() -> int:
    """``docs/engine-waterfall.png`` and the terminal waterfall from a real vLLM run (see the module docstring)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    sys.path.insert(0, str(ROOT))
    import stack_lib as stack_mod

    from tests.engine.conftest import engine_env

    engine_py = subprocess.run(
        ["bash", str(ROOT / "scripts" / "engine_env.sh")], check=True, capture_output=True, text=True
    ).stdout.splitlines()[-1]
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        env = engine_env(cwd)
        model = cwd / "tiny-qwen2"
        subprocess.run([engine_py, str(ROOT / "tests/engine/tiny_model.py"), str(model)], cwd=cwd, env=env, check=True)
        running = stack_mod.start(log_dir=cwd / "stack-logs")
        try:
            driver = [engine_py, str(ROOT / "tests/engine/load_driver.py"), str(model)]
            with (cwd / "driver.log").open("wb") as log:
                done = subprocess.run(
                    [*driver, running.otlp_grpc_endpoint, ENGINE_SERVICE, str(cwd / "out.json")],
                    cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=900,
                )  # fmt: skip
            if done.returncode:
                print((cwd / "driver.log").read_text(errors="replace")[-4000:])
                return 1
            time.sleep(5)  # the Collector's batch and Jaeger's write
            report = [sys.executable, "-m", "otel_agentloop", "report", "--jaeger", running.jaeger_url]
            report += ["--service", ENGINE_SERVICE, "--step", "0"]
            text = subprocess.run(report, cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout
            subprocess.run([*report, "--html", "step0.html"], cwd=cwd, env=env, check=True, capture_output=True)
            with _Browser() as browser:
                _slowest(browser, cwd / "step0.html", DOCS / "engine-waterfall.png")
        finally:
            running.stop()
    print(text)
    return 0


def _slowest(driver: Any, page: Path, out: Path) -> None:
    """The step page with its slowest sample's row clicked: that sample's waterfall at the right."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.set_window_size(1500, 760)
    driver.get(page.resolve().as_uri())
    WebDriverWait(driver, 10).until(lambda d: d.execute_script("return document.readyState") == "complete")
    row = driver.find_element(By.CSS_SELECTOR, '#rows .row[data-slowest="true"]')
    driver.execute_script("arguments[0].click()", row)
    driver.execute_script("document.getElementById('scroller').scrollTop = 0")
    driver.save_screenshot(str(out))


class _Browser:
    """Headless Debian Chromium through selenium, at the tests' window width."""

    def __enter__(self) -> Any:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"):
            options.add_argument(arg)
        options.add_argument("--force-device-scale-factor=1")
        self.driver = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)
        return self.driver

    def __exit__(self, *exc: object) -> None:
        self.driver.quit()


def _page(driver: Any, page: Path, out: Path, height: int, ready: str = "'true'") -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.set_window_size(1500, height)
    driver.get(page.resolve().as_uri())
    WebDriverWait(driver, 10).until(lambda d: d.execute_script("return document.readyState") == "complete")
    WebDriverWait(driver, 10).until(lambda d: d.execute_script(f"return {ready}") == "true")
    driver.save_screenshot(str(out))


def _timeline(driver: Any, page: Path, out: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.set_window_size(1500, 760)
    driver.get(page.resolve().as_uri())
    WebDriverWait(driver, 10).until(lambda d: d.execute_script("return document.readyState") == "complete")
    hung = driver.find_elements(By.CSS_SELECTOR, '#rows .row[data-state="hung"]')
    row = (hung or driver.find_elements(By.CSS_SELECTOR, "#rows .row"))[0]
    driver.execute_script("arguments[0].click()", row)  # its waterfall at the right; no mouse, no tooltip
    driver.execute_script("document.getElementById('scroller').scrollTop = 0")
    driver.save_screenshot(str(out))


if __name__ == "__main__":
    sys.exit(main())
