"""Re-take the README's pictures from the demo it names: ``make run ARGS="--misbehave"``, step 3.

    .venv/bin/python scripts/docs_pictures.py

Runs ``otel-agentloop simulate --workers 2 --misbehave`` (what ``make run ARGS="--misbehave"`` runs) in a fresh
folder, so its trace file holds this one run, then ``report --step 3`` on that file, and writes:

- ``docs/timeline.png``: the step page (``--html``) in headless Chromium, the hung sample's row clicked;
- ``docs/timeline-matplotlib.png``: ``--timeline-png``;
- ``docs/waterfall.png``: ``--png``, the slowest sample's waterfall.

Prints the step's verdict counts (for the caption). Needs the ``ray`` and ``plot`` extras, selenium, and Debian's
chromium + chromium-driver (``scripts/install_chromium.sh``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CLI = [sys.executable, "-m", "otel_agentloop"]


def main() -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}  # traces to the default file
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        subprocess.run([*CLI, "simulate", "--workers", "2", "--misbehave"], cwd=cwd, env=env, check=True)
        page = cwd / "step3.html"
        report = subprocess.run(
            [
                *CLI,
                "report",
                "--file",
                "otel-agentloop-traces.jsonl",
                "--step",
                "3",
                "--json",
                "--html",
                str(page),
                "--timeline-png",
                str(DOCS / "timeline-matplotlib.png"),
                "--png",
                str(DOCS / "waterfall.png"),
            ],
            cwd=cwd,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        data = json.loads(report.stdout)
        _screenshot(page, DOCS / "timeline.png")
    counts = data["verdicts"]["counts"]
    hung = ", ".join(
        f"{h['sample_index']}/{h['rollout_n']} in {h['phase']} {h['tool']}" for h in data["verdicts"]["hung"]
    )
    print(f"step 3: {sum(counts.values())} samples: {counts}; hung: {hung}; slowest: {data['slowest'][0]}")
    return 0


def _screenshot(page: Path, out: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)
    try:
        driver.set_window_size(1500, 760)
        driver.get(page.resolve().as_uri())
        WebDriverWait(driver, 10).until(lambda d: d.execute_script("return document.readyState") == "complete")
        hung = driver.find_elements(By.CSS_SELECTOR, '#rows .row[data-state="hung"]')
        row = (hung or driver.find_elements(By.CSS_SELECTOR, "#rows .row"))[0]
        driver.execute_script("arguments[0].click()", row)  # its waterfall at the right; no mouse, no tooltip
        driver.execute_script("document.getElementById('scroller').scrollTop = 0")
        driver.save_screenshot(str(out))
    finally:
        driver.quit()


if __name__ == "__main__":
    sys.exit(main())
