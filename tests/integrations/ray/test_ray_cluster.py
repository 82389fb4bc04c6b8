"""Ray, for real: a local cluster, actors in other processes, spans over OTLP to a receiver on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop import testing
from otel_agentloop.analysis import read_traces
from tests._support import REPO_ROOT
from tests._support.otlp_receiver import Receiver, start_grpc, wait_for
from tests._support.spans import span_metrics
from tests.integrations.ray.ray_actors import Item, SampleFailedError, synthetic_samples

ray = pytest.importorskip("ray") if not os.environ.get("CI") else __import__("ray")
from otel_agentloop.integrations import ray as oal_ray  # noqa: E402 - after the Ray check

pytestmark = pytest.mark.e2e  # a local Ray cluster

ROOT = str(REPO_ROOT)


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster whose workers export to a real OTLP/gRPC receiver, like the driver."""
    receiver = Receiver()
    server, endpoint = start_grpc(receiver)
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("OTEL_")}
    handle = oal.configure("ray-test", endpoint=endpoint, protocol="grpc", trace_per="step", schedule_delay_s=0.05)
    env = oal_ray.runtime_env(handle, base={"env_vars": {"PYTHONPATH": ROOT}})
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env=env,
        configure_logging=False,
    )
    from tests.integrations.ray.ray_actors import Worker

    actor = ray.remote(num_cpus=0)(Worker)
    workers = [actor.remote(), actor.remote()]
    try:
        yield handle, receiver, workers
    finally:
        ray.shutdown()
        handle.shutdown(5)
        server.stop(0)
        os.environ.update(saved)
        testing.reset()


def _items(n: int, first: int = 0) -> list[Item]:
    out = []
    for i in range(first, first + n):
        phases = [
            ("generate_sequences", 0.0, 0.1 + i * 0.011),
            ("tool_calls", 0.2, 0.05 + (i % 3) * 0.02),
            ("tool_calls", 0.21, 0.03),
            ("generate_sequences", 0.3, 0.02 * (i % 5)),
            ("compute_score", 0.4, 0.01 + (i % 7) * 0.003),
        ]
        out.append((i // 2, i % 2, phases, False))
    return out


def test_one_trace_per_step_connects_driver_workers_samples_and_phases(cluster) -> None:
    handle, receiver, (a, b) = cluster
    with oal.step(1):
        carrier = oal_ray.carrier()
        ray.get(
            [
                a.run_async.remote([(0, 0, [], False), (1, 0, [], False)], otel_carrier=carrier),
                b.run_sync.remote(_items(2, first=10), otel_carrier=carrier),
            ],
            timeout=60,
        )
    assert handle.force_flush(5)
    step_records = lambda: [r for r in receiver.records if r.attributes.get(sc.RL_STEP) == 1]  # noqa: E731
    assert wait_for(lambda: sum(r.name == sc.SAMPLE_SPAN for r in step_records()) == 4, 20)
    records = step_records()
    by_id = {r.span_id: r for r in records}
    (step_span,) = [r for r in records if r.name == sc.STEP_SPAN]
    workers = [r for r in records if r.name == sc.WORKER_SPAN]
    assert len(workers) == 2
    assert {r.trace_id for r in records} == {step_span.trace_id}  # one connected trace
    pids = {step_span.resource["process.pid"]}
    for w in workers:
        assert w.parent_id == step_span.span_id
        pids.add(w.resource["process.pid"])
    assert len(pids) == 3  # the driver and two worker processes
    for root in (r for r in records if r.name == sc.SAMPLE_SPAN):
        assert by_id[root.parent_id].name == sc.WORKER_SPAN
        assert root.attributes[sc.RL_STEP] == 1 and root.attributes[sc.RL_VALIDATE] is False
    phases = [r for r in records if sc.RL_PHASE in r.attributes]
    assert {r.attributes[sc.RL_PHASE] for r in phases} == set(sc.PHASES)
    for r in phases:
        assert by_id[r.parent_id].name == sc.SAMPLE_SPAN and r.attributes[sc.RL_STEP] == 1
    for w in (a, b):
        ray.get(w.table.remote(1))  # release the workers' state of this step


def test_per_sample_traces_link_to_the_driver_step(cluster) -> None:
    _, receiver, (a, _) = cluster
    with oal.step(2, trace_per="sample") as step:
        ray.get(a.run_async.remote([(0, 0, [], False), (1, 1, [], False)], otel_carrier=oal_ray.carrier()))
    step_ctx = step.span.get_span_context()
    assert wait_for(
        lambda: sum(r.name == sc.SAMPLE_SPAN and r.attributes.get(sc.RL_STEP) == 2 for r in receiver.records) == 2, 20
    )
    roots = [r for r in receiver.records if r.name == sc.SAMPLE_SPAN and r.attributes.get(sc.RL_STEP) == 2]
    assert len({r.trace_id for r in roots}) == 2
    for r in roots:
        assert r.parent_id == 0 and r.links == ((step_ctx.trace_id, step_ctx.span_id),)
    ray.get(a.table.remote(2))


@pytest.mark.parametrize("ways", [1, 2, 4])
def test_merged_metrics_equal_one_process_and_any_split(cluster, ways) -> None:
    handle, _, workers = cluster
    items = _items(16)
    step = 10 + ways
    with oal.step(step):
        carrier = oal_ray.carrier()
        chunks = [items[i::ways] for i in range(ways)]
        ray.get([workers[i % 2].run_sync.remote(chunk, otel_carrier=carrier) for i, chunk in enumerate(chunks)])
    merged = oal_ray.merge_metrics(ray.get([w.table.remote(step) for w in workers]))
    with oal.step(100 + ways):  # the same per-sample timings, in this process
        synthetic_samples(items)
    local = handle.metrics.collect(100 + ways)
    local_spans, merged_spans = span_metrics(local), span_metrics(merged)
    assert merged_spans.keys() == local_spans.keys()
    for key, value in local_spans.items():
        if key.endswith("/num_samples"):
            assert merged_spans[key] == value == 16
        else:
            assert merged_spans[key] == pytest.approx(value, abs=0.001), key
    test_merged_metrics_equal_one_process_and_any_split.seen.append(merged_spans)  # type: ignore[attr-defined]
    assert all(m == merged_spans for m in test_merged_metrics_equal_one_process_and_any_split.seen)  # type: ignore[attr-defined]


test_merged_metrics_equal_one_process_and_any_split.seen = []  # type: ignore[attr-defined]


def test_a_failing_worker_keeps_finished_samples_and_tells_the_driver(cluster) -> None:
    _, receiver, (a, b) = cluster
    with oal.step(20):
        carrier = oal_ray.carrier()
        bad = a.run_async.remote([(0, 0, [], False), (1, 0, [], False), (2, 0, [], True)], otel_carrier=carrier)
        good = b.run_async.remote([(3, 0, [], False)], otel_carrier=carrier)
        with pytest.raises(SampleFailedError, match="reward exploded"):
            ray.get(bad, timeout=60)
        assert ray.get(good, timeout=60) == 1
    metrics = oal_ray.merge_metrics(ray.get([w.table.remote(20) for w in (a, b)]))
    assert metrics["agent_loop/num_samples"] == 4  # finished samples counted, and the failed one
    assert metrics["agent_loop/compute_score/max"] >= 0.05
    assert wait_for(
        lambda: sum(r.name == sc.SAMPLE_SPAN and r.attributes.get(sc.RL_STEP) == 20 for r in receiver.records) == 4, 20
    )
    roots = {
        r.attributes[sc.RL_SAMPLE_INDEX]: r
        for r in receiver.records
        if r.name == sc.SAMPLE_SPAN and r.attributes.get(sc.RL_STEP) == 20
    }
    assert roots[2].error and not roots[0].error and not roots[1].error
    worker = [
        r for r in receiver.records if r.name == sc.WORKER_SPAN and r.attributes.get(sc.RL_STEP) == 20 and r.error
    ]
    assert len(worker) == 1 and worker[0].attributes[sc.ERROR_TYPE].endswith("SampleFailedError")
    for index in (0, 1, 3):  # every span of the finished samples arrived: root, gen, 2 tools, reward
        assert (
            sum(
                r.attributes.get(sc.RL_SAMPLE_INDEX) == index and r.attributes.get(sc.RL_STEP) == 20
                for r in receiver.records
            )
            == 5
        )


def test_no_span_is_lost_when_actors_finish_normally(cluster) -> None:
    handle, receiver, workers = cluster
    assert handle.force_flush(5)
    infos = ray.get([w.info.remote() for w in workers])
    created = handle.stats["queued"] + sum(i["stats"]["queued"] for i in infos)
    assert all(i["stats"]["dropped"] == 0 and i["stats"]["failed"] == 0 for i in infos)
    assert wait_for(lambda: len(receiver.records) == created, 20)
    assert len(receiver.records) == created
    # the workers were configured from the driver's settings
    env = infos[0]["env"]
    assert env["OTEL_SERVICE_NAME"] == "ray-test" and env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc"
    assert all(r.resource["service.name"] == "ray-test" for r in receiver.records)


@pytest.mark.parametrize("split", [1, 3])
def test_validation_capture_across_workers_draws_from_every_batch(cluster, split) -> None:
    from otel_agentloop.health import ValidationCapture

    _, _, workers = cluster
    batches = [[(f"q{b}-{i}", f"a{b}-{i}", (b * 40 + i) / 200, b * 40 + i) for i in range(40)] for b in range(5)]
    # each worker gets several batches (round robin over `split` groups per worker), as in fully-async mode
    groups = [batches[g :: 2 * split] for g in range(2 * split)]
    results = ray.get([workers[g % 2].validation_state.remote(group, 10, 42) for g, group in enumerate(groups)])
    assert len({pid for _, pid in results}) == 2
    merged = ValidationCapture(10, 42)
    for state, _ in results:
        assert len(state) <= 10  # bounded on every worker
        merged.merge(state)
    local = ValidationCapture(10, 42)
    for batch in batches:
        for inp, out, score, index in batch:
            local.offer(inp, out, score, sample_index=index, rollout_n=0, step=5)
    assert merged.result() == local.result()
    assert len({inp.split("-")[0] for inp, _, _ in merged.result()}) >= 3  # not only the last batch


def test_carrier_keyword_is_declared_for_ray() -> None:
    import inspect

    def method(self, items: list, *, flag: bool = False, **extra) -> int:
        return len(items)

    async def amethod(self, items: list) -> int:
        return len(items)

    for fn in (oal_ray.traced_remote(method), oal_ray.traced_remote(flush_timeout_s=1)(amethod)):
        sig = inspect.signature(inspect.unwrap(fn))  # what Ray checks calls against
        assert sig.parameters["otel_carrier"].kind is inspect.Parameter.KEYWORD_ONLY
        assert list(sig.parameters)[-1] in ("extra", "otel_carrier")
        sig.bind(None, [1], otel_carrier={})
    assert oal_ray.traced_remote(method)(None, [1, 2], otel_carrier=None) == 2
    with pytest.raises(TypeError, match="already has a parameter"):
        oal_ray.traced_remote(lambda self, otel_carrier: 1)


def test_ray_stays_optional() -> None:
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "ray" or name.startswith("ray."):
                    raise ImportError("no ray here")
        sys.meta_path.insert(0, Block())
        import otel_agentloop
        from otel_agentloop.integrations import ray as oal_ray
        assert "ray" not in sys.modules
        try:
            oal_ray.runtime_env()
        except ImportError as exc:
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "pip install 'otel-agentloop[ray]'" in out.stdout


def test_main_job_on_ray(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_agentloop",
            "simulate",
            "--workers",
            "2",
            "--steps",
            "2",
            "--prompts",
            "4",
            "--rollout-n",
            "2",
            "--time-scale",
            "0.05",
            "--quiet",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    assert "== step 1: agent_loop metrics over 2 workers" in out and "== step 2:" in out
    assert "slowest sample" in out and "rl.sample" in out
    assert "dropped: 0, failed: 0" in out
    records = list(read_traces(str(tmp_path / "otel-agentloop-traces")))
    roots = [r for r in records if r.name == sc.SAMPLE_SPAN]
    assert sum(not r.attributes[sc.RL_VALIDATE] for r in roots) == 16  # 2 steps x 8 samples
    assert sum(r.attributes[sc.RL_VALIDATE] for r in roots) == 8  # the validation pass of step 2
    assert "validation generations (4 kept of 8 offered" in out
    pids = {r.resource["process.pid"] for r in records}
    assert len(pids) == 3  # the driver and two workers share the directory
    # ... and its step files: one run folder, each step's file indexed by every process that wrote into it
    index = [json.loads(line) for line in (tmp_path / "otel-agentloop-traces" / "index.jsonl").read_text().splitlines()]
    assert {e["pid"] for e in index} == pids and len({e["segment"].split("/")[0] for e in index}) == 1
    steps = {e["segment"].split("/")[1] for e in index if e["step"] is not None}
    assert steps == {"step-00000001.jsonl", "step-00000002.jsonl", "val-00000002.jsonl"}
    for name in steps:
        writers = {e["pid"] for e in index if e["segment"].endswith("/" + name)}
        assert len(writers) == 3, (name, writers)


def test_setup_worker_without_a_ray_connection_never_starts_ray(tmp_path) -> None:
    """In a process that imported Ray but never connected (a driver before verl's ``ray.init``), setting up
    tracing must not start a local Ray instance: ``ray.init`` later would be skipped, losing its runtime_env."""
    code = textwrap.dedent("""
        import ray
        from otel_agentloop.integrations import ray as oal_ray
        handle = oal_ray.setup_worker()
        print("initialized:", ray.is_initialized(), "worker:", handle.settings is not None)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RAY_ADDRESS"))}
    env["OTEL_TRACES_EXPORTER"] = "none"
    env["PYTHONPATH"] = ROOT  # this checkout, whatever the venv installed
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    assert "initialized: False worker: True" in out.stdout, out.stderr[-2000:]


def test_runtime_env_hands_over_the_drivers_settings_and_keeps_the_callers() -> None:
    handle = oal.configure("handoff", endpoint="http://127.0.0.1:9", protocol="grpc", max_content_chars=77)
    try:
        env = oal_ray.runtime_env(
            handle,
            base={"env_vars": {"OTEL_SERVICE_NAME": "callers", "PLAIN": "1"}, "worker_process_setup_hook": "my.hook"},
        )
        assert env["worker_process_setup_hook"] == "my.hook"  # the caller's own hook is kept
        env_vars = env["env_vars"]
        assert env_vars["OTEL_SERVICE_NAME"] == "callers" and env_vars["PLAIN"] == "1"
        assert env_vars["OTEL_AGENTLOOP_MAX_CONTENT_CHARS"] == "77"
        driver = json.loads(env_vars[oal_ray.DRIVER_VARIABLE])
        assert driver["pid"] == os.getpid()
        # every OTEL_* variable handed over is named: a worker drops its node's others
        assert driver["env"] == sorted(k for k in env_vars if k.startswith("OTEL_") and k != oal_ray.DRIVER_VARIABLE)
        assert "OTEL_SERVICE_NAME" in driver["env"] and "OTEL_EXPORTER_OTLP_ENDPOINT" in driver["env"]
        assert (
            oal_ray.runtime_env(handle)["worker_process_setup_hook"] == "otel_agentloop.integrations.ray.setup_worker"
        )
    finally:
        handle.shutdown(1)
        testing.reset()


def test_ray_instrumentor_wraps_ray_init_once_and_puts_it_back() -> None:
    from otel_agentloop.integrations.ray import RayInstrumentor

    original = ray.init
    try:
        assert oal_ray.instrument() and oal_ray.instrument()
        wrapped = ray.init
        assert wrapped is not original and wrapped.__wrapped__ is original and oal_ray.is_instrumented()
        RayInstrumentor().instrument()  # the entry point's class: the same switch
        assert ray.init is wrapped
        handle = oal.configure("instrumented-driver", endpoint="http://127.0.0.1:9", protocol="grpc")
        try:
            env = oal_ray.traced_runtime_env({"env_vars": {"X": "1"}, "working_dir": None})
            assert env["env_vars"]["X"] == "1" and env["working_dir"] is None
            assert env["env_vars"]["OTEL_SERVICE_NAME"] == "instrumented-driver"
            assert env["worker_process_setup_hook"] == "otel_agentloop.integrations.ray.setup_worker"
        finally:
            handle.shutdown(1)
        RayInstrumentor().uninstrument()
        assert ray.init is original and not oal_ray.is_instrumented()
        oal_ray.uninstrument()  # idempotent
        assert ray.init is original
    finally:
        oal_ray.uninstrument()
        ray.init = original
        testing.reset()
