"""Issue 36: the engine's load over a step read back from the real Jaeger (api_v3) through the real Collector.

A configured handle exports two steps over OTLP to the Collector (which forwards to Jaeger): samples whose turns
carry the engine's state, and per step two engines' ``rl.engine.load`` spans: one with ``rl.step``, one without
(as a verl server actor writes) whose window began 45 s before the step, past the step window's slack, so only the
search by span name over the step's window reaching back finds it. ``report --jaeger --step 1`` then draws both
engines (step page, Perfetto counter tracks), and its causes name the preemption and the partial rollout's
policy versions (Jaeger returns array attributes as their JSON text).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import JaegerClient, decode_resource_spans
from otel_agentloop.analysis._reading._source import EPOCH, JaegerSource
from tests._support.engine_steps import LOADED, run_steps
from tests._support.trace_event_format import parse


def _cli(cwd: Any, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [sys.executable, "-m", "otel_agentloop", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )


def test_step_engine_load_from_jaeger(stack: Any, tmp_path) -> None:
    service = f"engine-load-{uuid.uuid4().hex[:6]}"
    with pytest.MonkeyPatch.context() as monkeypatch:
        run_steps(None, LOADED, monkeypatch, loads=True, service=service, endpoint=stack.otlp_grpc_endpoint)
    client = JaegerClient(stack.jaeger_url)
    end = datetime.now(timezone.utc) + timedelta(minutes=1)
    client.wait_for(
        lambda: client.find_traces(service, EPOCH, end, operation=sc.ENGINE_LOAD_SPAN),
        lambda rs: sum(r.name == sc.ENGINE_LOAD_SPAN for r in decode_resource_spans(rs)) == 5,
        60,
    )
    client.wait_for(
        lambda: client.find_traces(service, EPOCH, end, operation=sc.STEP_SUMMARY_SPAN),
        lambda rs: len(list(decode_resource_spans(rs))) == 2,
        60,
    )
    # the step's search: the step window's traces and its engines' load spans, the early one included
    source = JaegerSource(client, [service], "--service", None, 500)
    found = source.search(lambda line: None, step=1)
    engines = sorted(str(r.attributes[sc.RL_ENGINE_ID]) for r in found if r.name == sc.ENGINE_LOAD_SPAN)
    assert "host:2:0" in engines and "host:1:0" in engines, engines

    page, perfetto = tmp_path / "step.html", tmp_path / "step.json"
    args = ("report", "--jaeger", stack.jaeger_url, "--service", service, "--step", "1")
    out = _cli(tmp_path, *args, "--html", str(page), "--perfetto", str(perfetto), "--json")
    assert out.returncode == 0, out.stderr
    causes = {row["sample_index"]: row["cause"] for row in json.loads(out.stdout)["slowest"]}
    assert causes[1] == "preempted 2 times at 97 % KV cache"
    assert causes[3] == "aborted by 2 weight syncs, resumed under policy 14 and 15"  # versions as Jaeger's JSON text
    data = json.loads(page.read_text().split('type="application/json">')[1].split("</script>")[0])
    assert [(g["engine"], g["running"]) for g in data["engines"]] == [("host:1:0", [4, 8, 6]), ("host:2:0", [2, 3])]
    trace = parse(perfetto.read_text())
    counters = {trace.process_names[e["pid"]] for e in trace.events if e["ph"] == "C"}
    assert counters == {"engine host:1:0", "engine host:2:0"}
