"""verl 0.9.1's real server path carries the generation turn's context into ``engine.generate`` (issue 28).

verl's real ``LLMServerClient`` (here, the agent-loop side), its real ``GlobalRequestLoadBalancer`` actor and a
real ``ray.remote(vLLMHttpServer)`` actor (verl's ``generate`` and ``launch_server`` code, its real
``RolloutConfig``). Most tests replace only the engine, at ``engine.generate``, by a stand-in that records the
keywords it gets and answers with a real vLLM ``RequestOutput``; the last one starts the real engine (vLLM's CPU
build, a tiny local model) through verl's own ``vLLMHttpServer``. Workers are set up by verl's setup-hook switch
(``worker_process_setup_hook=otel_agentloop.integrations.verl.setup_worker``); spans come back over real
OTLP/gRPC to a receiver here (the engine's own ``llm_request`` too).

Needs vLLM importable next to verl (``vLLMHttpServer``'s module imports it): run in the engine venv with verl
0.9.1 added (docs/engines-verl.md); skipped where vLLM is absent (the verl venv). The SGLang test also needs
SGLang's classes (skipped without them).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm.outputs", reason="vLLMHttpServer needs vLLM: run in the engine venv with verl added")

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop import testing
from otel_agentloop.integrations import ray as oal_ray
from otel_agentloop.integrations.verl import _engine_path
from otel_agentloop.setup import current_handle
from tests._support.otlp_receiver import Receiver, start_grpc, wait_for

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [5, 6, 7, 8]
ANSWER = [11, 12, 13]
QUEUED, SCHEDULED, FIRST, LAST = 100.0, 100.25, 100.75, 101.5
ABORTED_AT = 2
ENGINE_ENV = {  # vLLM's CPU build on these machines (see tests/engine), for the server actors
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_USE_V2_MODEL_RUNNER": "0",  # the V2 runner launches Triton kernels, which have no CPU driver here
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def _vllm_metadata_shim(tmp: Path) -> str | None:
    """verl asks ``importlib.metadata.version("vllm")``; the CPU build is distributed as ``vllm-cpu``: a
    metadata-only ``vllm`` distribution (a path entry in tmp) answers it with the version vLLM itself reports
    for that build (``<version>+cpu``: vLLM reads it back to detect its CPU platform)."""
    try:
        importlib.metadata.version("vllm")
        return None
    except importlib.metadata.PackageNotFoundError:
        version = importlib.metadata.version("vllm-cpu") + "+cpu"
    info = tmp / f"vllm-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    sys.path.insert(0, str(tmp))
    return str(tmp)


class RecordingEngine:
    """The engine at ``engine.generate`` only: records each call's keywords, answers as ``AsyncLLM`` does (an
    async generator of ``RequestOutput``, the last one finished, with the engine's per-request stats)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.aborts = 0  # the next requests answered as aborted after ABORTED_AT tokens (a weight sync's abort)
        self.server: Any = None  # set with aborts: each resumed request runs under the next global_steps

    def generate(self, prompt: Any, sampling_params: Any, request_id: str, **kwargs: Any) -> AsyncIterator[Any]:
        self.calls.append({"request_id": request_id, **{k: v for k, v in kwargs.items() if k != "lora_request"}})
        abort = self.aborts > 0
        if abort:
            self.aborts -= 1
        elif self.server is not None and self.calls[:-1] and self.calls[-2].get("aborted"):
            self.server.global_steps += 1  # the weight sync that aborted the previous request is done
        self.calls[-1]["aborted"] = abort
        return self._outputs(list(prompt["prompt_token_ids"]), request_id, ABORTED_AT if abort else None)

    async def _outputs(self, prompt_ids: list[int], request_id: str, abort_at: int | None) -> AsyncIterator[Any]:
        from vllm.outputs import CompletionOutput, RequestOutput
        from vllm.v1.metrics.stats import RequestStateStats

        stats = RequestStateStats(num_generation_tokens=len(ANSWER), num_preemptions=1, arrival_time=1.0)
        stats.queued_ts, stats.scheduled_ts, stats.first_token_ts, stats.last_token_ts = QUEUED, SCHEDULED, FIRST, LAST
        stats.first_token_latency = FIRST - QUEUED
        for n in range(1, (abort_at or len(ANSWER)) + 1):
            await asyncio.sleep(0)
            done = n == (abort_at or len(ANSWER))
            completion = CompletionOutput(
                index=0,
                text="",
                token_ids=ANSWER[:n],
                cumulative_logprob=None,
                logprobs=None,
                finish_reason=("abort" if abort_at else "stop") if done else None,
            )
            yield RequestOutput(request_id, None, prompt_ids, None, [completion], done, metrics=stats)


def setup_server(server: Any) -> None:
    """Run inside the server actor (its ``__init__`` skipped): what verl's ``__init__`` sets that ``generate``
    and ``launch_server`` read, with verl's real ``RolloutConfig``; the engine is the stand-in."""
    from types import SimpleNamespace

    from verl.workers.config import RolloutConfig

    server.config = RolloutConfig(
        name="vllm",
        prompt_length=16,
        response_length=8,
        max_model_len=64,
        engine_kwargs={"vllm": {"max_num_seqs": 2}},
    )
    server.model_config = SimpleNamespace(
        processor=None,
        lora_rank=0,
        lora={},
        local_path="/nonexistent-model",
        trust_remote_code=False,
        hf_config=SimpleNamespace(),
    )
    server._disaggregation_role = "null"
    server._pd_decode_peers = []
    server.replica_rank, server.node_rank, server.nnodes = 0, 0, 1
    server.global_steps = 3
    server._warned_missing_spec_decode_stats = False
    server._submission_paused, server._admitting, server._rejecting = False, 0, False
    server.profiler_controller = SimpleNamespace(check_enable=lambda: False)
    server.engine = RecordingEngine()


def engine_calls(server: Any) -> list[dict[str, Any]]:
    return list(server.engine.calls)


def abort_next(server: Any) -> int:
    """The stand-in engine answers the next request as aborted (a weight sync), the resumed one under the next
    ``global_steps``; returns the current one."""
    server.engine.aborts, server.engine.server = 1, server
    return int(server.global_steps)


def launch_args(server: Any, user_endpoint: str | None) -> dict[str, Any]:
    """verl's real ``launch_server`` down to vLLM's parsed CLI arguments (``run_server`` only records them), with
    the user's ``engine_kwargs.vllm.otlp_traces_endpoint`` when given and no ``OTEL_SERVICE_NAME`` before it;
    on a loop of its own (``__ray_call__`` is synchronous)."""
    from concurrent.futures import ThreadPoolExecutor

    seen: dict[str, Any] = {}

    async def run_server(args: Any) -> None:
        seen["otlp_traces_endpoint"] = args.otlp_traces_endpoint
        seen["max_num_seqs"] = args.max_num_seqs
        seen["disable_log_stats"] = args.disable_log_stats

    server.run_server = run_server
    server.config.engine_kwargs["vllm"]["otlp_traces_endpoint"] = user_endpoint
    os.environ.pop("OTEL_SERVICE_NAME", None)
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, server.launch_server()).result()
    seen["service"] = os.environ.get("OTEL_SERVICE_NAME")
    return seen


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Receiver, str, Any]]:
    """Ray (2 CPUs) with verl's setup-hook switch; the server and load balancer actors made by this process."""
    import ray

    shim = _vllm_metadata_shim(tmp_path_factory.mktemp("shim"))
    from verl.workers.rollout.router import GlobalRequestLoadBalancer
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    receiver = Receiver()
    grpc_server, endpoint = start_grpc(receiver)
    for key in [k for k in os.environ if k.startswith("OTEL_")]:
        os.environ.pop(key)
    handle = oal.configure("verl-engine-test", endpoint=endpoint, protocol="grpc", schedule_delay_s=0.05)
    from otel_agentloop.integrations import verl as oal_verl

    assert oal_verl.instrument()
    paths = [p for p in (shim, str(ROOT / "tests" / "verl"), str(ROOT), os.environ.get("PYTHONPATH")) if p]
    caches = tmp_path_factory.mktemp("caches")  # vLLM, HF, Triton and torch write caches: in the temp dir (not
    # HOME: Ray's workers read their cluster token from it)
    cache_vars = ("VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "HF_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME")
    env_vars = {"PYTHONPATH": os.pathsep.join(paths), **ENGINE_ENV, **{v: str(caches / v) for v in cache_vars}}
    env_vars["TRITON_CACHE_DIR"] = env_vars["TORCHINDUCTOR_CACHE_DIR"] = str(caches / "compile")
    env = oal_ray.runtime_env(handle, base={"env_vars": env_vars})
    env["worker_process_setup_hook"] = "otel_agentloop.integrations.verl.setup_worker"
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env=env)
    try:
        server_cls = ray.remote(vLLMHttpServer)  # as verl's vLLMReplica does, in an instrumented process
        modified = server_cls.__ray_metadata__.modified_class
        saved = modified.__dict__["__init__"]
        modified.__init__ = lambda self, *a, **k: None
        try:
            # (config, model_config, rollout_mode, workers, replica_rank, node_rank, gpus_per_node, nnodes, devices)
            server = server_cls.options(num_cpus=0).remote(None, None, None, [], 0, 0, 0, 1, "")
        finally:
            modified.__init__ = saved
        ray.get(server.__ray_call__.remote(setup_server), timeout=600)  # a loaded machine: minutes
        balancer = ray.remote(GlobalRequestLoadBalancer).options(num_cpus=0).remote(servers={"s0": server})
        yield handle, receiver, endpoint, (server, balancer)
    finally:
        ray.shutdown()
        oal_verl.uninstrument()
        last = current_handle()
        for each in {id(h): h for h in (handle, last) if h is not None}.values():
            each.shutdown(5)
        grpc_server.stop(0)
        testing.reset()


def _client(balancer: Any) -> Any:
    from omegaconf import OmegaConf
    from verl.workers.rollout.llm_server import LLMServerClient

    rollout = {"name": "vllm", "full_determinism": False}
    config = OmegaConf.create({"actor_rollout_ref": {"model": {"path": "/models/tiny"}, "rollout": rollout}})
    return LLMServerClient(config, load_balancer_handle=balancer)


def _fully_async_client(balancer: Any) -> Any:
    from omegaconf import OmegaConf
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

    rollout = {"name": "vllm", "full_determinism": False, "response_length": 8}
    config = OmegaConf.create(
        {
            "actor_rollout_ref": {"model": {"path": "/models/tiny"}, "rollout": rollout},
            "async_training": {"partial_rollout": True},
        }
    )
    return FullyAsyncLLMServerClient(config, load_balancer_handle=balancer)


async def _turn(balancer: Any, index: int, *, fully_async: bool = False, max_tokens: int | None = None) -> Any:
    """One sample with one generation turn through verl's real client (the turn span is our patch's)."""
    client = _fully_async_client(balancer) if fully_async else _client(balancer)
    if max_tokens is not None:
        async with oal.sample(index, 0):
            params = {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True}
            return await client.generate(f"req-{index}", prompt_ids=list(PROMPT), sampling_params=params)
    async with oal.sample(index, 0):
        return await client.generate(f"req-{index}", prompt_ids=list(PROMPT), sampling_params={"temperature": 1.0})


def test_the_turn_context_reaches_engine_generate(cluster: Any) -> None:
    import ray

    handle, receiver, _, (server, balancer) = cluster
    with oal.step(1):
        output = asyncio.run(_turn(balancer, 0))
    calls = ray.get(server.__ray_call__.remote(engine_calls), timeout=60)
    assert len(calls) == 1
    headers = calls[0]["trace_headers"]
    version, trace_id, span_id, flags = headers["traceparent"].split("-")
    assert (version, flags) == ("00", "01")

    def turn() -> Any:
        spans = [r for r in receiver.records if r.attributes.get(sc.RL_PHASE) == sc.GENERATE]
        return spans[0] if spans else None

    handle.force_flush(10)
    assert wait_for(lambda: turn() is not None, 30), [r.name for r in receiver.records]
    span = turn()
    assert (int(trace_id, 16), int(span_id, 16)) == (span.trace_id, span.span_id)  # the turn span, named
    # the engine's numbers came back to the turn span; verl's result does not carry them
    attrs = span.attributes
    assert attrs[sc.GEN_AI_RESPONSE_ID] == calls[0]["request_id"]
    assert attrs[sc.RL_ENGINE_NAME] == "vllm"
    assert attrs[sc.RL_ENGINE_QUEUE_S] == pytest.approx(SCHEDULED - QUEUED)
    assert attrs[sc.RL_ENGINE_PREFILL_S] == pytest.approx(FIRST - SCHEDULED)
    assert attrs[sc.RL_ENGINE_DECODE_S] == pytest.approx(LAST - FIRST)
    assert attrs[sc.RL_ENGINE_TTFT_S] == pytest.approx(FIRST - QUEUED)
    assert attrs[sc.RL_ENGINE_PREEMPTIONS] == 1
    assert attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == len(PROMPT)
    assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == len(ANSWER)
    assert _engine_path.ENGINE_KEY not in output.extra_fields
    assert output.token_ids == ANSWER


def test_verls_result_is_unchanged(cluster: Any) -> None:
    """The same turn with the client uninstrumented (verl's own call, no carrier): the same ``TokenOutput``."""
    import ray

    from otel_agentloop.integrations import verl as oal_verl

    _, _, _, (server, balancer) = cluster
    with oal.step(2):
        carried = asyncio.run(_turn(balancer, 1))
    oal_verl.uninstrument()
    try:
        plain = asyncio.run(_turn(balancer, 2))
    finally:
        assert oal_verl.instrument()
    calls = ray.get(server.__ray_call__.remote(engine_calls), timeout=60)
    assert "trace_headers" in calls[-2] and "trace_headers" not in calls[-1]
    assert carried.model_dump() == plain.model_dump()
    steps = {"global_steps": 3, "min_global_steps": 3, "max_global_steps": 3}
    assert carried.extra_fields == {**steps, "num_cached_tokens": None}


def test_an_unsampled_turn_sends_flag_00(cluster: Any) -> None:
    """Our sampler decides: a sample it rejects sends ``traceparent`` with flags 00 (the engine records nothing)."""
    import ray
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    _, _, endpoint, (server, balancer) = cluster
    handle = oal.configure("verl-engine-test", endpoint=endpoint, protocol="grpc", sampler=ALWAYS_OFF)
    try:
        with oal.step(3):
            asyncio.run(_turn(balancer, 3))
        metrics = handle.metrics.collect(3)
    finally:
        handle.shutdown(5)
        oal.configure("verl-engine-test", endpoint=endpoint, protocol="grpc", schedule_delay_s=0.05)  # as before
    calls = ray.get(server.__ray_call__.remote(engine_calls), timeout=60)
    assert calls[-1]["trace_headers"]["traceparent"].endswith("-00")
    assert metrics["agent_loop/num_samples"] == 1  # still recorded: metrics stay exact


def _segmented(receiver: Receiver, step: int) -> tuple[Any, list[Any], Any]:
    """The step's turn span, its ``rl.engine.segment`` children (by index) and its sample span."""
    traces = {r.trace_id for r in receiver.records if r.attributes.get(sc.RL_STEP) == step}
    mine = [r for r in receiver.records if r.trace_id in traces]
    turns = [r for r in mine if r.attributes.get(sc.RL_PHASE) == sc.GENERATE]
    turn = turns[0] if len(turns) == 1 else None
    segments = sorted(
        (r for r in mine if r.name == sc.ENGINE_SEGMENT_SPAN and turn is not None and r.parent_id == turn.span_id),
        key=lambda r: r.attributes[sc.RL_ENGINE_SEGMENT_INDEX],
    )
    sample = next((r for r in mine if r.name == sc.SAMPLE_SPAN), None)
    return turn, segments, sample


def test_a_turn_aborted_by_a_weight_sync_shows_its_segments(cluster: Any) -> None:
    """verl's real ``FullyAsyncLLMServerClient`` resume loop over verl's real server (the engine a stand-in
    answering the first request as aborted after 2 tokens, the resumed one under the next ``global_steps``):
    one turn, two ``rl.engine.segment`` children, each with its policy version, how it ended and its engine
    numbers; the resumed request's ``traceparent`` is its segment's; the turn's tokens are the segments' sum;
    the sample shows its staleness. verl's result is unchanged."""
    import ray

    handle, receiver, _, (server, balancer) = cluster
    version = ray.get(server.__ray_call__.remote(abort_next), timeout=60)
    with oal.step(7):
        output = asyncio.run(_turn(balancer, 7, fully_async=True))
    calls = ray.get(server.__ray_call__.remote(engine_calls), timeout=60)[-2:]
    assert [c["aborted"] for c in calls] == [True, False]
    assert output.token_ids == ANSWER[:ABORTED_AT] + ANSWER
    assert output.extra_fields["min_global_steps"] == version and output.extra_fields["global_steps"] == version + 1
    assert _engine_path.ENGINE_KEY not in output.extra_fields
    handle.force_flush(10)
    assert wait_for(lambda: len(_segmented(receiver, 7)[1]) == 2 and _segmented(receiver, 7)[2] is not None, 30)
    turn, segments, sample = _segmented(receiver, 7)
    first, second = (s.attributes for s in segments)
    assert (first[sc.RL_ENGINE_SEGMENT_INDEX], second[sc.RL_ENGINE_SEGMENT_INDEX]) == (0, 1)
    assert (first[sc.RL_ENGINE_POLICY_VERSION], second[sc.RL_ENGINE_POLICY_VERSION]) == (version, version + 1)
    assert (first[sc.RL_ENGINE_FINISH], second[sc.RL_ENGINE_FINISH]) == (sc.ENGINE_ABORTED, sc.ENGINE_FINISHED)
    assert (first[sc.GEN_AI_RESPONSE_ID], second[sc.GEN_AI_RESPONSE_ID]) == tuple(c["request_id"] for c in calls)
    assert (first[sc.GEN_AI_USAGE_OUTPUT_TOKENS], second[sc.GEN_AI_USAGE_OUTPUT_TOKENS]) == (ABORTED_AT, len(ANSWER))
    assert second[sc.GEN_AI_USAGE_INPUT_TOKENS] == len(PROMPT) + ABORTED_AT  # the resume sends the tokens so far
    assert first[sc.RL_ENGINE_QUEUE_S] == pytest.approx(SCHEDULED - QUEUED)
    # attempt 0 was sent under the turn (its abort was not known yet); the resumed one under its segment
    parents = [int(c["trace_headers"]["traceparent"].split("-")[2], 16) for c in calls]
    assert parents == [turn.span_id, segments[1].span_id]
    assert segments[0].end_ns <= segments[1].start_ns and turn.start_ns <= segments[0].start_ns
    attrs = turn.attributes
    assert attrs[sc.RL_ENGINE_SEGMENTS] == 2
    assert tuple(attrs[sc.RL_ENGINE_POLICY_VERSIONS]) == (version, version + 1)
    assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == sum(s.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] for s in segments)
    assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == len(output.token_ids)
    assert attrs[sc.RL_ENGINE_QUEUE_S] == pytest.approx(2 * (SCHEDULED - QUEUED))  # both attempts queued
    assert attrs[sc.RL_ENGINE_TTFT_S] == pytest.approx(FIRST - QUEUED)  # the first attempt's
    assert attrs[sc.RL_ENGINE_PREEMPTIONS] == 2
    assert attrs[sc.RL_ENGINE_FINISH] == sc.ENGINE_FINISHED
    assert attrs[sc.GEN_AI_RESPONSE_ID] == calls[1]["request_id"]
    assert sample.attributes[sc.RL_SAMPLE_STALENESS] == 1


def test_a_fully_async_turn_not_aborted_has_no_segment(cluster: Any) -> None:
    """The common case: one attempt, finished: the engine numbers on the turn, as before, and no segment."""
    handle, receiver, _, (_, balancer) = cluster
    with oal.step(8):
        output = asyncio.run(_turn(balancer, 8, fully_async=True))
    handle.force_flush(10)
    assert wait_for(lambda: all(x is not None for x in _segmented(receiver, 8)[::2]), 30)
    turn, segments, sample = _segmented(receiver, 8)
    assert segments == [] and sc.RL_ENGINE_SEGMENTS not in turn.attributes
    assert turn.attributes[sc.RL_ENGINE_QUEUE_S] == pytest.approx(SCHEDULED - QUEUED)
    assert turn.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == len(output.token_ids) == len(ANSWER)
    assert sample.attributes[sc.RL_SAMPLE_STALENESS] == 0


def test_the_endpoint_reaches_the_engine_args(cluster: Any) -> None:
    """verl's real ``launch_server`` on the server actor: our gRPC endpoint becomes vLLM's parsed
    ``otlp_traces_endpoint`` (the user's other ``engine_kwargs.vllm`` still applied), the engine's processes get
    our service name, and the engine keeps its request stats (verl's default turns them off; vLLM's tracing and
    the turn's engine timing need them); an endpoint the user set is kept."""
    import ray

    _, _, endpoint, (server, _) = cluster
    seen = ray.get(server.__ray_call__.remote(launch_args, None), timeout=180)
    expect = {"max_num_seqs": 2, "disable_log_stats": False}
    assert seen == {**expect, "otlp_traces_endpoint": endpoint, "service": "verl-engine-test"}
    seen = ray.get(server.__ray_call__.remote(launch_args, "127.0.0.1:4317"), timeout=180)
    assert seen == {**expect, "otlp_traces_endpoint": "127.0.0.1:4317", "service": None}


class RecordingTokenizerManager:
    """SGLang's engine entry at ``tokenizer_manager.generate_request`` only: records the real
    ``GenerateReqInput`` verl builds, answers with SGLang's output dict."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    def generate_request(self, obj: Any, request: Any = None) -> AsyncIterator[dict[str, Any]]:
        self.requests.append(obj)
        return self._outputs(obj)

    async def _outputs(self, obj: Any) -> AsyncIterator[dict[str, Any]]:
        meta = {  # the keys SGLang's TokenizerManager always writes (timing only with enable_metrics)
            "id": obj.rid,
            "prompt_tokens": len(obj.input_ids),
            "completion_tokens": len(ANSWER),
            "cached_tokens": 2,
            "num_retractions": 0,
        }
        yield {"output_ids": list(ANSWER), "meta_info": {**meta, "finish_reason": {"type": "stop"}}}


def test_sglang_gets_the_context_in_external_trace_header() -> None:
    """verl's real ``SGLangHttpServer.generate`` (called as the Ray call delivers it, with the carrier keyword):
    the ``GenerateReqInput`` it builds carries the headers in ``external_trace_header``; SGLang's numbers come
    back in the result for the client (which takes them out); without the keyword nothing changes."""
    pytest.importorskip("sglang.srt.managers.io_struct", reason="SGLang's classes do not import here")
    from types import SimpleNamespace

    from otel_agentloop.integrations import verl as oal_verl

    already = oal_verl.is_instrumented()  # by the cluster fixture when it ran first
    assert oal_verl.instrument()
    try:
        module = importlib.import_module("verl.workers.rollout.sglang_rollout.async_sglang_server")
        from verl.workers.config import RolloutConfig

        server = module.SGLangHttpServer.__new__(module.SGLangHttpServer)
        server.config = RolloutConfig(name="sglang", prompt_length=16, response_length=8, max_model_len=64)
        server.model_config = SimpleNamespace(lora_rank=0, lora={})
        server._disaggregation_role, server._pd_decode_peers = "null", []
        server.global_steps, server.replica_rank = 3, 0
        server.tokenizer_manager = manager = RecordingTokenizerManager()
        headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}

        async def both() -> tuple[Any, Any]:
            key = _engine_path.ENGINE_KEY
            carried = await server.generate(list(PROMPT), {}, "rid-1", **{key: headers})
            plain = await server.generate(list(PROMPT), {}, "rid-2")
            return carried, plain

        carried, plain = asyncio.run(both())
    finally:
        if not already:
            oal_verl.uninstrument()
    assert type(manager.requests[0]).__name__ == "GenerateReqInput"
    assert manager.requests[0].external_trace_header == headers
    assert manager.requests[1].external_trace_header is None
    numbers = carried.extra_fields.pop(_engine_path.ENGINE_KEY)
    assert numbers == {
        sc.RL_ENGINE_NAME: "sglang",
        sc.GEN_AI_RESPONSE_ID: "rid-1",
        sc.GEN_AI_USAGE_INPUT_TOKENS: len(PROMPT),
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: len(ANSWER),
        sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 2,
        sc.RL_ENGINE_PREEMPTIONS: 0,
        sc.RL_NUM_PREEMPTED: 0,
        sc.GEN_AI_RESPONSE_FINISH_REASONS: ("stop",),
        sc.RL_ENGINE_FINISH: sc.ENGINE_FINISHED,
    }
    assert carried.model_dump() == plain.model_dump()


def test_sglang_reader_takes_sglangs_own_timing() -> None:
    """``integrations.sglang``'s reader on a ``meta_info`` whose timing SGLang's own time-stats classes wrote
    (``SchedulerReqTimeStats`` and ``APIServerReqTimeStats``, as its TokenizerManager merges them with
    ``enable_metrics``): queue, time to first token, prefill and decode seconds, cached tokens, retractions as
    preemptions; an aborted request says so."""
    stats = pytest.importorskip("sglang.srt.observability.req_time_stats", reason="SGLang's classes do not import")
    from otel_agentloop.integrations import sglang as oal_sglang

    created = 1000.0
    scheduler = stats.SchedulerReqTimeStats(
        queue_duration_s=0.25, forward_entry_time=created + 0.3, prefill_finished_time=created + 0.8
    )
    api = stats.APIServerReqTimeStats(created_time=created, first_token_time=created + 0.9, finished_time=created + 2)
    meta = {"id": "rid-9", "prompt_tokens": 40, "completion_tokens": 7, "cached_tokens": 32, "num_retractions": 2}
    meta.update(scheduler.convert_to_output_meta_info())
    meta.update(api.convert_to_output_meta_info(None, 7))
    meta["finish_reason"] = {"type": "abort", "message": "weight sync"}
    attrs = oal_sglang.output_attributes({"output_ids": [1] * 7, "meta_info": meta})
    assert attrs[sc.RL_ENGINE_QUEUE_S] == pytest.approx(0.25)
    assert attrs[sc.RL_ENGINE_TTFT_S] == pytest.approx(0.9)
    assert attrs[sc.RL_ENGINE_PREFILL_S] == pytest.approx(0.5)
    assert attrs[sc.RL_ENGINE_DECODE_S] == pytest.approx(1.2)
    assert attrs[sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 32
    assert (attrs[sc.RL_ENGINE_PREEMPTIONS], attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS]) == (2, 7)
    assert (attrs[sc.RL_ENGINE_FINISH], attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == (sc.ENGINE_ABORTED, ("abort",))
    bad = oal_sglang.output_attributes({"meta_info": {**meta, "queue_time": "soon", "cached_tokens": -1}})
    assert sc.RL_ENGINE_QUEUE_S not in bad and sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS not in bad
    assert bad[sc.RL_ENGINE_PREFILL_S] == pytest.approx(0.5)  # one bad field costs one attribute


@pytest.fixture(scope="module")
def real_engine(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """verl's ``vLLMHttpServer`` (its own ``__init__`` and ``launch_server``, real ``RolloutConfig`` and
    ``HFModelConfig``) starting vLLM's CPU build on a tiny local model, behind verl's load balancer."""
    import ray
    from verl.workers.config import HFModelConfig, RolloutConfig
    from verl.workers.rollout.replica import RolloutMode
    from verl.workers.rollout.router import GlobalRequestLoadBalancer
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer

    from tests.engine.tiny_model import make

    model = make(tmp_path_factory.mktemp("tiny-qwen2"))
    rollout = RolloutConfig(
        name="vllm",
        prompt_length=32,
        response_length=8,
        max_model_len=512,  # room for a long generation to abort mid-way
        tensor_model_parallel_size=1,
        enforce_eager=True,
        dtype="bfloat16",
        max_num_seqs=2,
        enable_sleep_mode=False,
    )
    args = (rollout, HFModelConfig(path=str(model)), RolloutMode.STANDALONE, [], 0, 0, 1, 1, "")
    server = ray.remote(vLLMHttpServer).options(num_cpus=0).remote(*args)
    ray.get(server.launch_server.remote(), timeout=400)
    balancer = ray.remote(GlobalRequestLoadBalancer).options(num_cpus=0).remote(servers={"real": server})
    return server, balancer


def test_a_real_vllm_engine_under_verls_server_parents_its_span_under_the_turn(cluster: Any, real_engine: Any) -> None:
    """The real engine: verl's ``vLLMHttpServer`` (its own ``__init__`` and ``launch_server``, real
    ``RolloutConfig`` and ``HFModelConfig``) starts vLLM's CPU build on a tiny local model; a turn through verl's
    client: vLLM's ``llm_request`` span arrives as the turn span's child in the sample's trace, exported by the
    engine to our endpoint under our service name, and the turn span carries the engine's numbers."""
    _, receiver, _, _ = cluster
    _, balancer = real_engine
    with oal.step(5):
        output = asyncio.run(_turn(balancer, 5))
    handle = current_handle()  # this module's configuration (an earlier test configured it again)
    assert handle is not None
    handle.force_flush(10)

    def spans() -> tuple[Any, Any]:
        steps = {r.trace_id for r in receiver.records if r.attributes.get(sc.RL_STEP) == 5}
        turns = [r for r in receiver.records if r.attributes.get(sc.RL_PHASE) == sc.GENERATE and r.trace_id in steps]
        engine = [r for r in receiver.records if r.name == "llm_request"]
        return (turns[0] if turns else None), next(
            (r for r in engine if turns and r.trace_id == turns[0].trace_id), None
        )

    def seen() -> list[Any]:
        return [(r.name, r.trace_id_hex, r.parent_id) for r in receiver.records if r.name == "llm_request"]

    assert wait_for(lambda: all(spans()), 60), (spans()[0], seen())
    turn, engine = spans()
    assert engine.parent_id == turn.span_id
    assert engine.resource.get("service.name") == "verl-engine-test"
    attrs = turn.attributes
    assert attrs[sc.RL_ENGINE_NAME] == "vllm"
    assert attrs[sc.GEN_AI_RESPONSE_ID] == engine.attributes["gen_ai.request.id"]
    assert (
        attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS]
        == len(output.token_ids)
        == engine.attributes["gen_ai.usage.completion_tokens"]
    )
    for key in (sc.RL_ENGINE_QUEUE_S, sc.RL_ENGINE_TTFT_S, sc.RL_ENGINE_PREFILL_S, sc.RL_ENGINE_DECODE_S):
        assert attrs[key] >= 0.0, key
    assert _engine_path.ENGINE_KEY not in output.extra_fields


def generated_tokens(server: Any) -> int:
    """Run inside the server actor: the most tokens an in-flight request of its engine has generated (-1: none
    in flight)."""
    states = server.engine.output_processor.request_states.values()
    return max((int(getattr(getattr(s, "stats", None), "num_generation_tokens", 0) or 0) for s in states), default=-1)


def bridge_pause_generation(server: Any) -> None:
    """Run inside the server actor. verl 0.9.1's ``abort_all_requests`` calls
    ``engine.pause_generation(wait_for_inflight_requests=False, clear_cache=...)``; vLLM 0.32 renamed that
    keyword (``mode="abort"``) and refuses the old one (``TypeError``). This instance attribute takes verl's
    keyword and passes vLLM's, nothing else: verl's abort, gate and resume code and vLLM's pause run as they are."""
    engine = server.engine
    pause = engine.pause_generation

    async def pause_generation(*, wait_for_inflight_requests: bool = False, clear_cache: bool = True) -> None:
        await pause(mode="wait" if wait_for_inflight_requests else "abort", clear_cache=clear_cache)

    engine.pause_generation = pause_generation


def test_a_real_engine_request_aborted_by_verls_weight_sync_resumes_as_two_segments(
    cluster: Any, real_engine: Any
) -> None:
    """The real engine under verl's real ``FullyAsyncLLMServerClient``: a long generation is aborted mid-way by
    verl's own weight-sync calls on the server (``abort_all_requests``, ``set_global_steps``,
    ``resume_generation``), and verl's client resumes it. One turn, two ``rl.engine.segment`` children, each with
    its policy version and how it ended, each naming the engine's own ``llm_request`` (the resumed one's is its
    segment's child; the aborted one vLLM exports without its parent, see below); the turn's output tokens
    are the sum of its segments' and of verl's merged output. Not run: the weight transfer itself (verl's
    checkpoint engine needs its trainer workers); verl's ``abort_all_requests`` needs a one-keyword bridge to vLLM
    0.32 (:func:`bridge_pause_generation`), shown refused without it."""
    import contextvars
    from concurrent.futures import ThreadPoolExecutor

    import ray

    handle, receiver, _, _ = cluster
    server, balancer = real_engine
    with pytest.raises(ray.exceptions.RayTaskError, match="wait_for_inflight_requests"):
        ray.get(server.abort_all_requests.remote(), timeout=60)  # verl 0.9.1 against vLLM 0.32, unbridged
    ray.get(server.resume_generation.remote(), timeout=60)  # verl's gate, closed by that attempt, opens again
    ray.get(server.__ray_call__.remote(bridge_pause_generation), timeout=60)
    ray.get(server.set_global_steps.remote(11), timeout=60)
    with oal.step(9), ThreadPoolExecutor(1) as pool:
        turn = _turn(balancer, 9, fully_async=True, max_tokens=480)
        running = pool.submit(contextvars.copy_context().run, asyncio.run, turn)
        assert wait_for(lambda: ray.get(server.__ray_call__.remote(generated_tokens), timeout=30) >= 8, 120)
        aborted = ray.get(server.abort_all_requests.remote(), timeout=60)  # verl's weight sync: abort ...
        ray.get(server.set_global_steps.remote(12), timeout=60)  # ... new weights' version ...
        ray.get(server.resume_generation.remote(), timeout=60)  # ... resume
        output = running.result(timeout=300)
    assert aborted["aborted_count"] == 1
    assert output.extra_fields["min_global_steps"] == 11 and output.extra_fields["global_steps"] == 12
    assert len(output.token_ids) == 480  # verl's merged output: the partial attempt's tokens + the resumed one's
    handle = current_handle()
    assert handle is not None
    handle.force_flush(10)

    def engines() -> list[Any]:
        return [r for r in receiver.records if r.name == "llm_request"]

    assert wait_for(lambda: len(_segmented(receiver, 9)[1]) == 2 and _segmented(receiver, 9)[2] is not None, 60)
    turn_span, segments, sample = _segmented(receiver, 9)
    first, second = (s.attributes for s in segments)
    assert (first[sc.RL_ENGINE_POLICY_VERSION], second[sc.RL_ENGINE_POLICY_VERSION]) == (11, 12)
    assert (first[sc.RL_ENGINE_FINISH], second[sc.RL_ENGINE_FINISH]) == (sc.ENGINE_ABORTED, sc.ENGINE_FINISHED)
    assert 8 <= first[sc.GEN_AI_USAGE_OUTPUT_TOKENS] < 480
    assert first[sc.GEN_AI_USAGE_OUTPUT_TOKENS] + second[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 480
    assert second[sc.GEN_AI_USAGE_INPUT_TOKENS] == len(PROMPT) + first[sc.GEN_AI_USAGE_OUTPUT_TOKENS]
    attrs = turn_span.attributes
    assert attrs[sc.RL_ENGINE_SEGMENTS] == 2 and tuple(attrs[sc.RL_ENGINE_POLICY_VERSIONS]) == (11, 12)
    assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == sum(s.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] for s in segments)
    assert sample.attributes[sc.RL_SAMPLE_STALENESS] == 1
    for key in (sc.RL_ENGINE_QUEUE_S, sc.RL_ENGINE_DECODE_S):  # the engine's own numbers, per attempt
        assert second[key] >= 0.0 and attrs[key] >= second[key]
    ids = (first[sc.GEN_AI_RESPONSE_ID], second[sc.GEN_AI_RESPONSE_ID])
    assert ids[0] != ids[1]
    assert wait_for(lambda: {r.attributes.get("gen_ai.request.id") for r in engines()} >= set(ids), 60), ids
    by_id = {r.attributes.get("gen_ai.request.id"): r for r in engines()}
    assert by_id[ids[1]].parent_id == segments[1].span_id and by_id[ids[1]].trace_id == turn_span.trace_id
    # the aborted request's llm_request: vLLM 0.32 takes the parent from the engine core's output
    # (``do_tracing(engine_core_output.trace_headers)``), which the core's abort does not carry: it arrives as a
    # root of a trace of its own (observed here); the segment names it (gen_ai.response.id)
    assert by_id[ids[0]].parent_id in (0, turn_span.span_id)
    assert by_id[ids[1]].attributes["gen_ai.usage.completion_tokens"] == second[sc.GEN_AI_USAGE_OUTPUT_TOKENS]
