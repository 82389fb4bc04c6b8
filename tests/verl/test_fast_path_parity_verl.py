"""The recording fast path through real verl 0.9.1 code gives the same spans and metrics as the SDK path
(issue 20): the legacy agent loop in this process (every destination compared, see
``tests/_support/fast_path_parity.py``) and the V1 path (``AgentLoopManagerTQ`` dispatching to a real
``AgentLoopWorkerTQ`` Ray actor; its spans over OTLP/gRPC), each run with ``OTEL_AGENTLOOP_FAST_PATH`` true, then
false."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import harness as h
import pytest
import ray_scenarios as rs

from otel_agentloop import semconv as sc
from otel_agentloop.integrations import ray as oal_ray
from otel_agentloop.integrations import verl as oal_verl
from otel_agentloop.metrics import compute_metrics
from tests._support.fast_path_parity import (
    FAST_PATH_ENV,
    MODES,
    assert_same,
    check_processor_starts,
    check_slowest,
    compare_runs,
    end_order,
    from_proto,
    mask_metrics,
    normalise,
    per_launch,
    run_both,
    slowest_by_spans,
)

N, STEP = 6, 3
_RUNTIME_ENV = oal_ray.runtime_env  # the library's, whatever a test has put in its place


def gen_delay(sample: int, turn: int) -> float:
    return 0.12 if (sample, turn) == (2, 0) else 0.01 + 0.01 * (sample % 3)  # sample 2: clearly the slowest


def tool_delay(name: str, x: int) -> float:
    return 0.02 if name == "add" else 0.03


def _legacy(handle: Any) -> Any:
    assert oal_verl.instrument()
    try:
        tok = h.build_tokenizer()
        server = h.FakeServer(tok, gen_delay, lambda i, k: (i % 3) if k == 0 else None)
        tools = h.make_tools(tool_delay)
        reward = h.FakeRewardWorker(lambda i: 0.005)

        async def main() -> Any:
            worker = h.make_worker(tok, server, tools, reward)
            return await worker.generate_sequences(h.make_batch(N, STEP))

        output = asyncio.run(main())
    finally:
        oal_verl.uninstrument()
    rows = output.meta_info["metrics"]
    table, collected = compute_metrics(rows[0][oal_verl.TABLE_KEY]), handle.metrics.collect(STEP)
    return {
        "table": mask_metrics(table),
        "collected": mask_metrics(collected),
        "turns": [int(x) for x in output.non_tensor_batch["__num_turns__"]],
        "which": table["agent_loop/slowest/sample_index"],  # a measurement: checked per run
    }


def test_legacy_agent_loop_in_process(tmp_path, monkeypatch) -> None:
    runs = run_both(_legacy, tmp_path, monkeypatch)
    spans = compare_runs(runs)
    check_processor_starts(runs)
    assert end_order(runs["fast"], per_trace=True) == end_order(runs["sdk"], per_trace=True)
    # which sample was the slowest is a measurement (sample 2, dataset index 2 // 2, unless load makes another
    # one slower in one run): compared masked, and within each run the worker's table names the sample whose
    # spans took longest (the driver's collect after it is empty: the table took the step's samples)
    for mode, run in runs.items():
        table_says = run.result.pop("which")
        assert table_says == slowest_by_spans(run.canonical("exporter"), STEP)[0], mode
    fast, sdk = runs["fast"].result, runs["sdk"].result
    assert fast == sdk
    assert fast["table"]["agent_loop/num_samples"] == N
    samples = [s for s in spans["exporter"] if s["name"] == sc.SAMPLE_SPAN]
    assert len(samples) == N
    assert any(s["name"].startswith(sc.TOOL_SPAN_PREFIX) for s in spans["exporter"])


# -- V1: a real AgentLoopWorkerTQ actor on a local Ray cluster -----------------------------------------------------


def _actor_mode(self: Any) -> tuple[str | None, bool]:
    """Inside the actor: the variable it got, and whether its spans were recorded on the fast path; after
    a flush of what it still holds."""
    import otel_agentloop as oal
    from otel_agentloop.core import _tracer

    handle = oal.current_handle()
    assert handle is not None and handle.force_flush(10)
    return os.environ.get(FAST_PATH_ENV), _tracer.current_recorder() is not None


def _v1_run(mode: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], dict[str, Any]]:
    """One local cluster with the fast path on or off in every process, one V1 step; the OTLP requests received
    and what the actor reports of itself."""
    from otel_agentloop.integrations.verl import _identity, _v1

    _v1._dispatched.clear()  # each run is step 3's first dispatch (as _fresh_arrival_order does per test)
    _identity._arrivals.clear()
    _identity._released_before.clear()
    value = "true" if mode == "fast" else "false"
    monkeypatch.setenv(FAST_PATH_ENV, value)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")

    def with_mode(handle: Any, **kwargs: Any) -> dict[str, Any]:
        # until the setting is declared, the workers drop an OTEL_* variable the driver's handle does not hand over
        handle.worker_env[FAST_PATH_ENV] = value
        return _RUNTIME_ENV(handle, **kwargs)

    monkeypatch.setattr(oal_ray, "runtime_env", with_mode)
    with rs.cluster(setup_hook=None) as (handle, receiver):
        assert oal_verl.instrument()
        try:
            import ray

            actor = rs.v1_actor()
            uids, keys = rs.run_v1(actor, STEP)
            tags = _our_tags(uids, keys)
            assert handle.force_flush(5)
            assert rs.wait_for(lambda: sum(1 for r in receiver.records if r.name == sc.SAMPLE_SPAN) >= len(keys))
            seen = ray.get(actor.__ray_call__.remote(_actor_mode), timeout=60)
            count = len(receiver.records)
            rs.wait_for(lambda: len(receiver.records) > count, timeout=1.0)  # anything late
            requests = list(receiver.requests)
        finally:
            oal_verl.uninstrument()
    return requests, {
        "env": seen[0],
        "recorder": seen[1],
        "trajectories": len(keys),
        "prompts": len(uids),
        "tags": tags,
    }


def _our_tags(uids: list[str], keys: list[str]) -> list[dict[str, Any]]:
    """Our TransferQueue tags of each trajectory (in dispatch order), what verl's trainer turns into its
    ``agent_loop/*`` metrics: durations as whether they are > 0, counts and identity as they are."""
    import transfer_queue as tq

    from otel_agentloop.integrations.verl._rows import TAG

    listed = tq.kv_list(partition_id="train")["train"]
    order = {u: f"uid{i}" for i, u in enumerate(uids)}
    out = []
    for key in keys:
        tags = {}
        for name, value in sorted(listed[key].items()):
            if not name.startswith(TAG):
                continue
            field = name[len(TAG) :]
            if field in ("generate_sequences", "tool_calls", "compute_score"):
                value = "> 0" if value > 0 else value
            elif field in ("trace_id", "span_id", "start_ns", "end_ns"):
                value = type(value).__name__
            elif field == "uid":
                value = order.get(value, value)
            elif field == "tools":  # tool name -> call seconds: the number of calls
                value = {name: len(calls) for name, calls in json.loads(value).items()}
            tags[field] = value
        out.append(tags)
    return out


def _uids_by_order(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The prompts' uids (new in every dispatch) replaced by their order of appearance (by start)."""
    uids: dict[Any, str] = {}
    out = []
    for s in sorted(spans, key=lambda s: s["start"]):
        attrs = [
            (k, (v[0], uids.setdefault(v[1], f"uid{len(uids)}")) if k == sc.RL_SAMPLE_UID else v)
            for k, v in s["attributes"]
        ]
        out.append({**s, "attributes": attrs})
    return out


@pytest.fixture
def raw_receiver(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ray_scenarios.cluster`` with a receiver that keeps whole requests (status, events, kind, scope)."""
    from tests._support import fast_path_parity

    monkeypatch.setattr(rs, "Receiver", fast_path_parity.RawReceiver)


def test_v1_agent_loop_on_a_ray_actor(monkeypatch, raw_receiver) -> None:
    runs = {mode: _v1_run(mode, monkeypatch) for mode in MODES}
    ran = {"trajectories": rs.N_PROMPTS * rs.N_SESSIONS, "prompts": rs.N_PROMPTS}
    for mode in MODES:
        used = {k: v for k, v in runs[mode][1].items() if k != "tags"}
        assert used == {"env": "true" if mode == "fast" else "false", "recorder": mode == "fast", **ran}
    # the per-trajectory rows verl's trainer reads (our TransferQueue tags), then the spans: the same in both modes
    fast_tags, sdk_tags = runs["fast"][1]["tags"], runs["sdk"][1]["tags"]
    assert all(t["generate_sequences"] == "> 0" and t["compute_score"] == "> 0" for t in sdk_tags), sdk_tags
    failures = [
        f"TransferQueue row of trajectory {i}, {k}: fast {f.get(k)!r} != sdk {d.get(k)!r}"
        for i, (f, d) in enumerate(zip(fast_tags, sdk_tags, strict=True))
        for k in sorted(set(f) | set(d))
        if f.get(k) != d.get(k)
    ]
    per_mode = {}
    for mode, (requests, _) in runs.items():
        spans = _uids_by_order([s for r in requests for s in from_proto(r)])
        check_slowest(spans, f"verl V1 {mode}")  # which sample was slowest: compared masked below
        # a prompt's sessions do the same work at once: which ends first is a race (starts are ordered)
        per_mode[mode] = [
            {k: v for k, v in s.items() if k not in ("random_trace_id", "end")} for s in normalise(per_launch(spans))
        ]
    try:
        assert_same(per_mode["fast"], per_mode["sdk"], "verl V1 grpc: fast vs sdk")
    except AssertionError as exc:
        failures.append(str(exc))
    assert not failures, "\n".join(failures)
    names = [s["name"] for s in per_mode["fast"]]
    assert names.count(sc.SAMPLE_SPAN) == rs.N_PROMPTS * rs.N_SESSIONS
    assert names.count(sc.GROUP_SPAN) == rs.N_PROMPTS
