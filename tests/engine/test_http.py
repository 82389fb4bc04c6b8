"""vLLM's OpenAI-compatible server (a real ``vllm.entrypoints.openai.api_server`` with ``--otlp-traces-endpoint``)
called inside generation turns, read back from a real Jaeger: the server's ``llm_request`` is the turn span's
child when the request carries ``trace_headers()`` (any client), and the child of the client's span (itself
the turn's child) with opentelemetry-instrumentation-requests; the response's usage is on the turn span."""

from __future__ import annotations

from typing import Any

import requests
from opentelemetry.trace import SpanKind

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.analysis import JaegerClient
from otel_agentloop.integrations.vllm import record_openai_response, trace_headers

from .conftest import Server, as_list, trace_spans

MAX_TOKENS = 8


def _complete(server: Server, prompt: list[int], headers: dict[str, str]) -> dict[str, Any]:
    body = {"model": server.model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}
    resp = requests.post(server.url + "/v1/completions", json=body, headers=headers, timeout=120)
    resp.raise_for_status()
    return resp.json()  # type: ignore[no-any-return]


def test_openai_server_spans_nest_under_the_turn_with_either_client(server: Server, stack: Any) -> None:
    from opentelemetry.instrumentation.requests import RequestsInstrumentor

    handle = oal.configure("rl-http", endpoint=stack.otlp_grpc_endpoint, protocol="grpc", set_global=False)
    samples: list[tuple[str, str, list[dict[str, Any]]]] = []
    try:
        with oal.step(0):
            for index, client in enumerate(("trace_headers", "trace_headers", "instrumented", "instrumented")):
                if client == "instrumented":
                    RequestsInstrumentor().instrument(tracer_provider=handle.provider)
                try:
                    bodies = []
                    with oal.sample(index) as sample:
                        prompt = [11 + index + k for k in range(6 + index)]
                        for _ in range(2):
                            with oal.span("generate_sequences"):
                                body = _complete(server, prompt, trace_headers() if client == "trace_headers" else {})
                                record_openai_response(body)
                            bodies.append(body)
                            prompt = [*prompt, 5, 6, 7]
                    assert sample.trace_id is not None
                    samples.append((client, sample.trace_id, bodies))
                finally:
                    if client == "instrumented":
                        RequestsInstrumentor().uninstrument()
        assert handle.metrics.collect(0)["agent_loop/num_samples"] == 4
    finally:
        handle.shutdown()

    jaeger = JaegerClient(stack.jaeger_url)
    for client, trace_id, bodies in samples:
        extra = 2 if client == "instrumented" else 0  # the client's own HTTP spans
        spans = trace_spans(jaeger, trace_id, expect=1 + 4 + extra)
        turns = sorted((s for s in spans if s.attributes.get(sc.RL_PHASE) == sc.GENERATE), key=lambda s: s.start_ns)
        engine = [s for s in spans if s.name == "llm_request"]
        assert len(turns) == 2 and len(engine) == 2, [(s.name, s.resource.get("service.name")) for s in spans]
        for turn, body in zip(turns, bodies, strict=True):
            if client == "instrumented":  # turn -> the client's HTTP span -> the server's llm_request
                (http,) = [s for s in spans if s.parent_id == turn.span_id and s.kind == SpanKind.CLIENT.value]
                (child,) = [s for s in engine if s.parent_id == http.span_id]
            else:
                (child,) = [s for s in engine if s.parent_id == turn.span_id]
            assert child.resource.get("service.name") == "rl-http-engine"
            a = turn.attributes
            assert a[sc.GEN_AI_USAGE_INPUT_TOKENS] == body["usage"]["prompt_tokens"]
            assert a[sc.GEN_AI_USAGE_INPUT_TOKENS] == child.attributes["gen_ai.usage.prompt_tokens"]
            assert a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == body["usage"]["completion_tokens"] == MAX_TOKENS
            assert a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == child.attributes["gen_ai.usage.completion_tokens"]
            assert a[sc.GEN_AI_RESPONSE_ID] == body["id"]
            assert as_list(a[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ["length"]
