"""The cluster trace store for real: 3 OpenSearch 2.19.1 nodes (one JVM each, from the jars of `make stack-build`)
behind the real Jaeger, the gateway and an agent Collector, on free ports on 127.0.0.1.

Without the jars the module skips with the reason, except under ``CI=true``, where it fails (CI fetches them in
its stack-build stage)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import JaegerClient, decode_resource_spans
from otel_agentloop.analysis._reading._jaeger import TraceQuery
from otel_agentloop.analysis._reading._jaeger_grpc import GrpcQuery
from otel_agentloop.analysis._reading._jaeger_step import StepReader
from otel_agentloop.analysis._reading._opensearch import IndexQuery

from .conftest import stack_mod, stack_procs, stack_store
from .stack_cli import SCRIPT, Cli

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def jars() -> None:
    """OpenSearch's jars from `make stack-build` (never fetched inside a test)."""
    if stack_store.missing():
        reason = f"OpenSearch's jars are not fetched ({stack_store.LIB}): run `make stack-build`"
        if os.environ.get("CI") == "true":
            pytest.fail(reason + " (CI must run the cluster store test)", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="module")
def cluster(jars: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack_store.OpenSearchCluster]:
    try:
        running = stack_store.start_opensearch(tmp_path_factory.mktemp("opensearch"), nodes=3, heap="512m")
    except stack_mod.StackError as exc:
        pytest.fail(f"cannot start the 3-node OpenSearch: {exc}", pytrace=False)
    try:
        yield running
    finally:
        running.stop()


def _put(url: str) -> None:
    req = urllib.request.Request(url, data=b"{}", method="PUT", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


def test_retention_deletes_only_day_indices_older_than_the_retention(
    cluster: stack_store.OpenSearchCluster,
) -> None:
    """`up`'s retention job on the real cluster: with 7 days kept on 2026-03-10, the day indices of 2026-03-03
    and before go, those of 2026-03-04 on, another prefix's and non-day indices stay."""
    prefix = "ret-test"
    old = [f"{prefix}-jaeger-span-2026-03-03", f"{prefix}-jaeger-service-2026-02-01"]
    kept = [f"{prefix}-jaeger-span-2026-03-04", f"{prefix}-jaeger-span-2026-03-10", f"{prefix}-jaeger-span-archive",
            "other-jaeger-span-2020-01-01"]  # fmt: skip
    for name in old + kept:
        _put(f"{cluster.url()}/{name}")
    deleted = stack_store.clean_indices(cluster.url(), prefix, days=7, today=date(2026, 3, 10))
    assert deleted == sorted(old)
    remaining = set(cluster.indices("*jaeger-*"))
    assert not remaining & set(old)
    assert set(kept) <= remaining


def test_a_killed_node_rejoins_with_its_data(cluster: stack_store.OpenSearchCluster) -> None:
    """SIGKILL one node: the other two keep answering (yellow: its replicas are missing), every document is
    still counted; restarted on its data, it rejoins and the cluster is green again."""
    index = "smoke-jaeger-span-2026-01-01"
    req = urllib.request.Request(
        f"{cluster.url()}/{index}",
        data=b'{"settings": {"number_of_shards": 3, "number_of_replicas": 1}}',
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=30).close()
    body = b"".join(b'{"index": {}}\n{"n": %d}\n' % i for i in range(500))
    req = urllib.request.Request(
        f"{cluster.url()}/{index}/_bulk?refresh=true", data=body, method="POST",
        headers={"Content-Type": "application/x-ndjson"},
    )  # fmt: skip
    urllib.request.urlopen(req, timeout=60).close()
    cluster.wait_health("green", nodes=3, timeout=120)
    pids = cluster.pids()
    assert len(pids) == 3
    cluster.kill(1)
    assert cluster.names[1] not in cluster.pids()
    cluster.wait_health("yellow", nodes=2, timeout=120)
    assert cluster.doc_count(index) == 500
    cluster.restart(1)
    assert cluster.health()["status"] == "green"
    assert cluster.health()["number_of_nodes"] == 3
    assert cluster.pids()[cluster.names[1]] != pids[cluster.names[1]]
    assert cluster.doc_count(index) == 500
    assert cluster.disk_bytes() > 0


# The job: 6 steps of 16 samples (1-3 generation turns with a tool call between, then a reward; every 5th sample
# fails with an exception before its reward), spans through the public API over OTLP to the agent. It prints each
# step's spans per sample, waits on stdin before step 5 (the test restarts the node there) and prints handle.stats
# after shutdown.
DRIVER = """
import asyncio, json, random, sys
import otel_agentloop as oal

endpoint, service, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
handle = oal.configure(service, endpoint=endpoint)

@oal.trace_generate(model="store-7b")
async def generate(rng):
    await asyncio.sleep(rng.uniform(0.005, 0.03))

@oal.trace_tool("search")
async def search(rng):
    await asyncio.sleep(rng.uniform(0.005, 0.02))
    return "ok"

@oal.trace_reward
async def reward(rng):
    await asyncio.sleep(0.005)
    return rng.random()

async def one(step, index):
    rng = random.Random(step * 1000 + index)
    turns, spans = rng.randint(1, 3), 1
    try:
        async with oal.sample(index, rollout_n=0):
            for turn in range(turns):
                await generate(rng)
                spans += 1
                if turn < turns - 1:
                    await search(rng)
                    spans += 1
            if index % 5 == 3:
                raise RuntimeError("the sandbox crashed")
            await reward(rng)
            spans += 1
    except RuntimeError:
        pass
    return spans

async def run_step(step):
    return await asyncio.gather(*(one(step, i) for i in range(16)))

for step in range(1, steps + 1):
    if step in (3, 5):
        print(json.dumps({"waiting": step}), flush=True)
        sys.stdin.readline()
    with oal.step(step):
        spans = asyncio.run(run_step(step))
    handle.metrics.collect(step)
    print(json.dumps({"step": step, "spans": spans}), flush=True)
handle.force_flush(60)
handle.shutdown()
print(json.dumps({"stats": handle.stats}), flush=True)
"""
STEPS, SAMPLES = 6, 16


@pytest.fixture(scope="module")
def store(
    cluster: stack_store.OpenSearchCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[stack_mod.Stack]:
    """Jaeger on the cluster with the gateway and an agent in front (the cluster topology)."""
    try:
        running = stack_store.start_stack(cluster, log_dir=tmp_path_factory.mktemp("store-logs"))
    except stack_mod.StackError as exc:
        pytest.fail(f"cannot start Jaeger on OpenSearch: {exc}", pytrace=False)
    try:
        yield running
    finally:
        running.stop()


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


def _report(store: stack_mod.Stack, cwd: Path, service: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "otel_agentloop", "report", "--jaeger", store.jaeger_url, "--service", service, *args],
        cwd=cwd, env=_env(), capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def _line(job: subprocess.Popen[str]) -> dict[str, Any]:
    assert job.stdout is not None
    line = job.stdout.readline()
    assert line, f"the job ended early: {job.stderr.read() if job.stderr else ''}"
    data: dict[str, Any] = json.loads(line)
    return data


def _stored(client: JaegerClient, service: str) -> list[Any]:
    """Every span Jaeger has of ``service`` (all traces, paged)."""
    now = datetime.now(timezone.utc)
    found = client.find_all_traces(service, now - timedelta(hours=1), now + timedelta(minutes=5), search_depth=200)
    assert not found.full
    return list(decode_resource_spans(found.resource_spans))


@pytest.fixture(scope="module")
def written(
    cluster: stack_store.OpenSearchCluster, store: stack_mod.Stack, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The job's run with node os2 SIGKILLed after step 2 (once the cluster is green; the job then writes on) and
    restarted after step 4 (queries made while it is down); returns the service, each sample's span count, the
    library's stats and the outage's query results."""
    service = f"store-{uuid.uuid4().hex[:6]}"
    cwd = tmp_path_factory.mktemp("job")
    (cwd / "driver.py").write_text(DRIVER)
    job = subprocess.Popen(
        [sys.executable, "driver.py", store.otlp_grpc_endpoint, service, str(STEPS)],
        cwd=cwd, env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert job.stdin is not None
    spans: dict[tuple[int, int], int] = {}
    outage: dict[str, Any] = {}
    try:
        while True:
            got = _line(job)
            if "stats" in got:
                break
            if "step" in got:
                spans.update({(got["step"], i): n for i, n in enumerate(got["spans"])})
                continue
            if got["waiting"] == 3:
                # mid-run, once every shard has its replica (a just-created index may not have one yet on a
                # loaded machine, and a node dying then takes primaries with it): one node dies, and the job
                # writes steps 3 and 4 without it
                cluster.wait_health("green", nodes=3, timeout=300)
                cluster.kill(1)
            else:  # steps 3 and 4 were written with the node down: queries answer meanwhile; then it restarts
                cluster.wait_health("yellow", nodes=2, timeout=120)
                outage = _outage_queries(store, cwd, service, cluster.urls[1])
                cluster.restart(1)
            job.stdin.write("go\n")
            job.stdin.flush()
        assert job.wait(60) == 0, job.stderr.read() if job.stderr else ""
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    return {"service": service, "spans": spans, "stats": got["stats"], "outage": outage, "cwd": cwd}


def _outage_queries(store: stack_mod.Stack, cwd: Path, service: str, dead: str) -> dict[str, Any]:
    """With node ``dead`` (its URL) down: ``report --step 1`` (until all of step 1 is stored) and an api_v3
    search answer. Jaeger's OpenSearch client does not retry a read: the first request it sends to the dead node
    fails (and marks the node dead, so the next go to the others); only such failures are allowed, at most 2."""
    deadline = time.monotonic() + 90
    failures: list[str] = []
    while True:
        out = _report(store, cwd, service, "--step", "1", "--json")
        not_yet = ("no sample spans for step 1 found", "no samples for step 1 ")  # no trace of it; only some steps
        if out.returncode != 0 and any(line in out.stderr for line in not_yet):  # not stored (or searchable) yet
            assert time.monotonic() < deadline, out.stderr
            time.sleep(2)
            continue
        if out.returncode != 0:
            assert dead.removeprefix("http://") in out.stderr and len(failures) < 2, out.stderr
            failures.append(out.stderr)
            continue
        metrics = json.loads(out.stdout)["metrics"]
        if metrics["agent_loop/num_samples"] == SAMPLES:
            break
        assert time.monotonic() < deadline, f"step 1 incomplete while a node is down: {metrics}"
        time.sleep(2)
    client = JaegerClient(store.jaeger_url)
    now = datetime.now(timezone.utc)
    page = client.find_traces(service, now - timedelta(hours=1), now + timedelta(minutes=1), search_depth=20)
    spans = len(list(decode_resource_spans(page)))
    return {"report_step_1": metrics, "search_spans": spans, "failed_queries": len(failures)}


def test_every_exported_span_is_stored_through_a_node_death(
    cluster: stack_store.OpenSearchCluster, store: stack_mod.Stack, written: dict[str, Any]
) -> None:
    """library exported == Jaeger's stored spans == OpenSearch's documents, each sample's trace complete by id,
    and queries answered while the node was down."""
    stats = written["stats"]
    assert stats["exported"] > STEPS * SAMPLES * 2
    assert stats["failed"] == stats["dropped"] == stats["pending"] == 0, stats
    assert written["outage"]["report_step_1"]["agent_loop/num_samples"] == SAMPLES
    assert written["outage"]["search_spans"] > 0
    client = JaegerClient(store.jaeger_url)
    deadline = time.monotonic() + 120
    while True:  # the Collectors' queues and Jaeger's bulk writes drain
        stored = _stored(client, written["service"])
        docs = cluster.doc_count()
        if len(stored) == docs == stats["exported"]:
            break
        assert time.monotonic() < deadline, (len(stored), docs, stats)
        time.sleep(2)
    assert len({(r.trace_id, r.span_id) for r in stored}) == len(stored)
    samples = [r for r in stored if r.name == sc.SAMPLE_SPAN]
    assert len(samples) == STEPS * SAMPLES
    assert sum(r.error for r in samples) == STEPS * 3  # indices 3, 8 and 13 of each step fail
    for r in samples:
        trace = list(decode_resource_spans(client.get_trace(r.trace_id_hex)))
        key = (int(r.attributes[sc.RL_STEP]), int(r.attributes[sc.RL_SAMPLE_INDEX]))
        assert len(trace) == written["spans"][key], key
    per_step = Counter(int(r.attributes[sc.RL_STEP]) for r in samples)
    assert per_step == dict.fromkeys(range(1, STEPS + 1), SAMPLES)
    assert cluster.health()["status"] == "green"
    span_bytes = sum(cluster.indices(f"{stack_store.INDEX_PREFIX}-jaeger-span-*").values())
    print(f"\nOpenSearch: {docs} spans, {span_bytes} bytes in the span indices with 1 replica "
          f"({span_bytes / docs:.0f} bytes/span), {cluster.disk_bytes()} bytes on the nodes' disks")  # fmt: skip


def test_report_reads_the_cluster_store(store: stack_mod.Stack, written: dict[str, Any]) -> None:
    """`report --jaeger` on Jaeger over OpenSearch: the step (and its page), the run page, --compare,
    --perfetto and --runs, as subprocesses."""
    service, cwd = written["service"], written["cwd"]
    step = _report(store, cwd, service, "--step", "3", "--json")
    assert step.returncode == 0 and "INCOMPLETE" not in step.stderr, step.stderr
    assert json.loads(step.stdout)["metrics"]["agent_loop/num_samples"] == SAMPLES
    page = _report(store, cwd, service, "--step", "3", "--html", "step.html")
    assert page.returncode == 0, page.stderr
    assert (cwd / "step.html").stat().st_size > 1000
    run = _report(store, cwd, service, "--run", "--json")
    assert run.returncode == 0, run.stderr
    assert [s["n"] for s in json.loads(run.stdout)["steps"]] == [SAMPLES] * STEPS
    run_page = _report(store, cwd, service, "--run", "--html", "run.html", "--step-pages", "1")
    assert run_page.returncode == 0, run_page.stderr
    assert (cwd / "run.html").exists()
    compare = _report(store, cwd, service, "--compare", "2", "5", "--json")
    assert compare.returncode == 0, compare.stderr
    body = json.loads(compare.stdout)
    assert body["a"]["num_samples"] == body["b"]["num_samples"] == SAMPLES
    perfetto = _report(store, cwd, service, "--step", "4", "--perfetto", "trace.json")
    assert perfetto.returncode == 0, perfetto.stderr
    events = json.loads((cwd / "trace.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert sum(1 for e in events if e.get("cat") == "sample") == SAMPLES
    runs = _report(store, cwd, service, "--runs")
    assert runs.returncode == 0, runs.stderr
    assert len(runs.stdout.splitlines()) >= 2


def _key(record: Any) -> tuple[int, int]:
    return record.trace_id, record.span_id


def test_a_steps_spans_from_the_indices_equal_jaegers_answer(
    cluster: stack_store.OpenSearchCluster, store: stack_mod.Stack, written: dict[str, Any]
) -> None:
    """``IndexQuery`` (``report --opensearch``) reads a step's traces straight from Jaeger's span indices: the same
    records, span for span, as Jaeger's own api_v3 answer (gRPC) for the same search, failed samples' status and
    exception events included; and a search of N traces keeps the newest N, as Jaeger's does."""
    service = written["service"]
    now = datetime.now(timezone.utc)
    lo, hi = now - timedelta(hours=1), now + timedelta(minutes=5)
    index = IndexQuery(cluster.url(), timeout_s=60)
    grpc = GrpcQuery(f"127.0.0.1:{store.ports['query_grpc']}", timeout_s=60)
    try:
        every: list[Any] = []
        for step in range(1, STEPS + 1):
            attributes = {sc.RL_STEP: str(step)}
            mine = list(decode_resource_spans(index.find_traces(TraceQuery(service, lo, hi, attributes))))
            theirs = list(decode_resource_spans(grpc.find_traces(TraceQuery(service, lo, hi, attributes))))
            assert sorted(mine, key=_key) == sorted(theirs, key=_key), f"step {step}"
            samples = {r.attributes.get(sc.RL_SAMPLE_INDEX) for r in mine if r.name == "rl.sample"}
            assert samples == set(range(SAMPLES)), f"step {step}"
            every += mine
        assert len(every) == sum(written["spans"].values()) + 2 * STEPS  # + each step's rl.step and summary spans
        failed = [r for r in every if r.error and r.name == "rl.sample"]
        assert len(failed) == STEPS * len(range(3, SAMPLES, 5))
        assert all(r.events and r.events[0][0] == "exception" and r.status_message for r in failed)
        assert all(r.resource.get("service.name") == service for r in every)
        newest = {sc.RL_STEP: "4"}
        mine_5 = index.find_traces(TraceQuery(service, lo, hi, newest, search_depth=5))
        theirs_5 = grpc.find_traces(TraceQuery(service, lo, hi, newest, search_depth=5))
        ids = [{r.trace_id for r in decode_resource_spans(page)} for page in (mine_5, theirs_5)]
        assert len(ids[0]) == 5 and ids[0] == ids[1]
    finally:
        grpc.close()


def test_report_opensearch_reads_steps_from_the_indices(
    cluster: stack_store.OpenSearchCluster, store: stack_mod.Stack, written: dict[str, Any]
) -> None:
    """``report --opensearch URL``: the step page, the Perfetto file and ``--compare`` read from the indices
    equal those read through Jaeger; steps are read there only when its indices hold Jaeger's services, and a
    named one that does not answer is said, then Jaeger is read."""
    service, cwd = written["service"], written["cwd"]
    client = JaegerClient(store.jaeger_url, timeout_s=30)
    assert StepReader(client, IndexQuery(cluster.url()), True).how == "index"
    said: list[str] = []
    gone = IndexQuery(f"http://127.0.0.1:{stack_mod.free_port()}")
    dead = StepReader(client, gone, True, said.append)
    line = f"--opensearch {gone.target}: it does not answer as OpenSearch; reading through Jaeger instead"
    assert dead.how != "index" and said == [line]
    other = StepReader(client, IndexQuery(cluster.url(), index="no-such-index-*"), True, said.append)
    assert other.how != "index" and "its span indices lack services Jaeger lists" in said[1] and len(said) == 2
    for case in (
        ["--step", "3", "--html", "{}step.html"],
        ["--step", "4", "--perfetto", "{}trace.json"],
        ["--compare", "2", "5", "--json"],
    ):
        outputs = []
        for tag, extra in (("jaeger-", []), ("index-", ["--opensearch", cluster.url()])):
            args = [a.format(tag) for a in case]
            done = _report(store, cwd, service, *args, *extra)
            assert done.returncode == 0, done.stderr
            assert "--opensearch" not in done.stderr, done.stderr
            written_file = [cwd / a for a in args if a.startswith(tag)]
            outputs.append((done.stdout.replace(tag, ""), [f.read_bytes() for f in written_file]))
        assert outputs[0] == outputs[1], case
    fallback = _report(store, cwd, service, "--step", "3", "--json", "--opensearch", gone.base_url)
    assert fallback.returncode == 0, fallback.stderr
    assert "it does not answer as OpenSearch; reading through Jaeger instead" in fallback.stderr
    assert json.loads(fallback.stdout)["metrics"]["agent_loop/num_samples"] == SAMPLES


def _free_base() -> int:
    """A base for OPENSEARCH_PORT_BASE whose HTTP (base+1..3) and transport (base+101..103) ports are free."""
    for _ in range(50):
        base = stack_mod.free_port() // 1000 * 1000 % 60000 + 2000
        ports = [base + i for i in (1, 2, 3, 101, 102, 103)]
        if not any(stack_procs.port_busy(p) for p in ports):
            return base
    pytest.fail("no free port range for OPENSEARCH_PORT_BASE")


def test_up_store_opensearch_status_and_down(jars: None, tmp_path: Path) -> None:
    """`scripts/stack.py up --store opensearch` as a user runs it (its own run dir, data dir and free ports):
    3 nodes, Jaeger with its day indices and aliases, the retention job and the Collector; `status` prints the
    cluster's health and nodes; a Badger `up` is refused while it runs; `down` stops everything."""
    cli = Cli(tmp_path)
    base = _free_base()
    env = {**cli.env, "OPENSEARCH_PORT_BASE": str(base), "OPENSEARCH_HEAP": "512m"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, str(SCRIPT), *args]
        return subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400)

    up = run("up", "--store", "opensearch")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        # progress while the nodes start and join (each node's stage from its log), then the cluster's true state
        assert re.search(r"^  OpenSearch, \d+ s: os1 starting its JVM, os2 ", up.stdout, re.M), up.stdout
        assert re.search(r"^  OpenSearch, \d+ s: .*os\d (joined|started)", up.stdout, re.M), up.stdout
        last = r"^OpenSearch (ready after \d+ s: green|up after \d+ s but (yellow|red))\b.*$"
        final = re.search(last, up.stdout, re.M)
        assert final is not None, up.stdout
        if final[2] is not None:  # not green after the wait: the line says why, in the cluster's words
            assert "The cluster says: " in final[0], final[0]
            assert final[2] == "red" or "not expected with 3 nodes and 1 replica" in final[0], final[0]
        else:
            assert re.search(r"cluster otel-agentloop: green, 3 nodes, \d+ shards \(0 unassigned\)$", up.stdout, re.M)
        status = run("status")
        assert status.returncode == 0, status.stdout + status.stderr
        for name in stack_store.UP:
            assert f"{name}: up (pid " in status.stdout
        assert "(cluster manager)" in status.stdout
        with urllib.request.urlopen(f"http://127.0.0.1:{base + 1}/_cat/aliases?format=json", timeout=30) as r:
            aliases = {a["alias"] for a in json.load(r)}
        prefix = stack_store.INDEX_PREFIX
        assert {f"{prefix}-jaeger-{k}-{rw}" for k in ("span", "service") for rw in ("read", "write")} <= aliases
        badger = run("up")
        assert badger.returncode == 1 and "the opensearch stack is up" in badger.stderr
        assert "deleted nothing" in (cli.run_dir / "retention.log").read_text()
    finally:
        down = run("down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not cli.state_file.exists()
    ports = [base + i for i in (1, 2, 3, 101, 102, 103)]
    assert not any(stack_procs.port_busy(p) for p in ports)
    assert run("status").returncode == 3  # stopped
