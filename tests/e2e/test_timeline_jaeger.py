"""The step timeline page built from the real Jaeger (api_v3), opened in the real browser; its links lead to
traces that Jaeger has."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import JaegerClient, decode_resource_spans
from tests._support.browser import open_page, step_rows


def test_page_from_jaeger_links_to_its_traces(stack, browser, tmp_path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    service = f"timeline-{uuid.uuid4().hex[:6]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    start = datetime.now(timezone.utc) - timedelta(seconds=5)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_agentloop",
            "simulate",
            "--workers",
            "0",
            "--steps",
            "1",
            "--prompts",
            "3",
            "--rollout-n",
            "3",
            "--time-scale",
            "0.05",
            "--val-every",
            "0",
            "--quiet",
            "--json",
            "--endpoint",
            stack.otlp_grpc_endpoint,
            "--service-name",
            service,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    client = JaegerClient(stack.jaeger_url)
    end = datetime.now(timezone.utc) + timedelta(minutes=1)
    client.wait_for(
        lambda: client.find_traces(service, start, end),
        lambda rs: sum(r.name == sc.SAMPLE_SPAN for r in decode_resource_spans(rs)) == 9,
        60,
    )

    page = tmp_path / "jaeger.html"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_agentloop",
            "report",
            "--jaeger",
            stack.jaeger_url,
            "--service",
            service,
            "--step",
            "1",
            "--json",
            "--html",
            str(page),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    slowest = json.loads(out.stdout)["slowest_trace_id"]
    open_page(browser, page)
    assert len(step_rows(browser)) == 9
    row = browser.find_element(By.CSS_SELECTOR, f'.row[data-trace-id="{slowest}"]')
    assert row.get_attribute("data-slowest") == "true"
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", row)
    row.click()
    detail = browser.find_element(By.ID, "detail")
    WebDriverWait(browser, 5).until(lambda d: detail.get_attribute("data-sample") is not None)
    # no --jaeger-ui: no link to the query URL (a natively built Jaeger serves no UI there), a link to this waterfall
    assert detail.find_elements(By.CSS_SELECTOR, "a.jaeger-link") == []
    href = str(detail.find_element(By.CSS_SELECTOR, "a.trace-link").get_attribute("href"))
    assert f"#trace={slowest}&sample=" in href
    names = [e.get_attribute("textContent") for e in detail.find_elements(By.CSS_SELECTOR, ".wf-row .wf-name")][1:]
    in_jaeger = [r.name for r in decode_resource_spans(client.get_trace(slowest))]
    assert sorted(names) == sorted(in_jaeger) and sc.SAMPLE_SPAN in names  # the waterfall is that trace
