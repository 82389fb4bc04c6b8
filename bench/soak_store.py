"""Issue 29 (5): the soak's second store, fed the same spans as Badger (bench/soak.py ``--opensearch``).

Topology: the library -> agent Collector -> ONE gateway Collector with two OTLP exporters, each with its own
disk queue: ``otlp/jaeger`` to Jaeger on Badger (collector/jaeger.yaml) and ``otlp/opensearch`` to a second
Jaeger on a 3-node OpenSearch cluster (collector/jaeger-opensearch.yaml, the nodes started by
scripts/stack_store.py). The gateway's config is collector/gateway.yaml with that one exporter added
(:func:`dual_gateway_config`, written into the run's directory), so both stores get every span the gateway
accepted, and the gateway's per-exporter counters say what each was sent. ``--second-store badger`` puts a
second Badger Jaeger there instead (to check the counting without the cluster).

Counted per store: the gateway's exporter (sent, failed), the store's Jaeger (receiver accepted, storage
exporter sent) and, for OpenSearch, the document count of the span indices after a refresh.
"""

from __future__ import annotations

import copy
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import stack_lib as stack_mod
import stack_store
from soak_grpc import FoundSpan, GrpcSearch

from otel_agentloop.analysis import decode_resource_spans
from otel_agentloop.analysis._reading._jaeger import JaegerClient

EXPORTERS = {"badger": "otlp/jaeger", "second": "otlp/opensearch"}
"""The gateway's exporter to each store."""
SECOND_ENDPOINT_VAR = "JAEGER_SECOND_OTLP_ENDPOINT"
T = TypeVar("T")


def dual_gateway_config(path: Path) -> Path:
    """collector/gateway.yaml plus an ``otlp/opensearch`` exporter (a copy of ``otlp/jaeger``: same timeout,
    disk queue, retries) sending to ``${env:JAEGER_SECOND_OTLP_ENDPOINT}``, written to ``path``."""
    config = yaml.safe_load((stack_mod.COLLECTOR_DIR / "gateway.yaml").read_text())
    exporter = copy.deepcopy(config["exporters"][EXPORTERS["badger"]])
    exporter["endpoint"] = "${env:" + SECOND_ENDPOINT_VAR + "}"
    config["exporters"][EXPORTERS["second"]] = exporter
    config["service"]["pipelines"]["traces"]["exporters"].insert(1, EXPORTERS["second"])
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def labelled_counter(url: str, name: str, **labels: str) -> float:
    """The Prometheus counter ``name`` at ``url``, summed over the series carrying all ``labels``."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for m in re.finditer(rf"^{name}(?:_total)?\{{([^}}]*)\}} ([0-9.e+-]+)$", text, re.M):
        if all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


def _http_json(url: str, method: str = "GET", timeout: float = 60) -> Any:
    import json

    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


@dataclass
class SecondStore:
    """The second store's Jaeger (``stack``: its own ports, only ``jaeger`` runs) and, for OpenSearch, the
    cluster it writes to."""

    kind: str
    stack: stack_mod.Stack
    cluster: stack_store.OpenSearchCluster | None = None

    @property
    def name(self) -> str:
        """``opensearch``, or ``badger-2`` for the stand-in."""
        return "badger-2" if self.kind == "badger" else self.kind

    @property
    def otlp_endpoint(self) -> str:
        return f"127.0.0.1:{self.stack.ports['jaeger_otlp_grpc']}"

    def pids(self) -> dict[str, int]:
        pids = {f"jaeger-{self.name}": p for p in self.stack.pids().values()}
        if self.cluster is not None:
            pids.update({f"opensearch-{name}": pid for name, pid in self.cluster.pids().items()})
        return pids

    def stored(self) -> float:
        """Spans the store's Jaeger has written (its storage exporter's sent count)."""
        return self.stack.counter("jaeger", "otelcol_exporter_sent_spans")

    def doc_count(self) -> int | None:
        """OpenSearch's documents in the span indices (after a refresh), ``None`` for a Badger store."""
        return None if self.cluster is None else self.cluster.doc_count()

    def disk_bytes(self) -> tuple[int, int]:
        """(allocated, apparent) bytes of the store: the OpenSearch nodes' data directories (primaries, the
        replica and translogs, after a flush), or the second Badger directory."""
        if self.cluster is None:
            return disk_bytes(self.stack.data_dir)
        _http_json(f"{self.cluster.url()}/_flush", "POST", timeout=300)
        return disk_bytes(self.cluster.run_dir)  # the nodes' homes: data/ (and their small logs)

    def stop(self) -> None:
        self.stack.stop()
        if self.cluster is not None:
            self.cluster.stop()


def disk_bytes(path: Path) -> tuple[int, int]:
    """(allocated bytes on disk, apparent size) of every file below ``path``."""
    used = apparent = 0
    for p in path.rglob("*"):
        if p.is_file():
            st = p.stat()
            used += st.st_blocks * 512
            apparent += st.st_size
    return used, apparent


def start_second(kind: str, out_dir: Path, heap: str = "1g") -> SecondStore:
    """The second store, started: ``opensearch`` (3 nodes + Jaeger on them) or ``badger`` (a second Jaeger)."""
    log_dir = out_dir / "logs-second"
    log_dir.mkdir(parents=True, exist_ok=True)
    if kind == "badger":
        store = out_dir / "store-badger-2"
        stack = stack_mod.prepare(log_dir=log_dir, data_dir=store / "badger", queue_dir=store / "queues")
        stack.start_process("jaeger")
        return SecondStore(kind, stack)
    cluster = stack_store.start_opensearch(out_dir / "store-opensearch", nodes=3, heap=heap)
    try:
        ports = stack_mod.free_ports_query_paired()  # as `make up` pairs them: `report` finds the gRPC port
        jaeger = stack_store.start_stack(cluster, log_dir, names=("jaeger",), ports=ports)
    except BaseException:
        cluster.stop()
        raise
    return SecondStore(kind, jaeger, cluster)


def start_first(out_dir: Path, second: SecondStore | None) -> stack_mod.Stack:
    """Jaeger on Badger, the gateway and the agent (:func:`stack.start_cluster`'s topology, run data below
    ``out_dir``); with ``second``, the gateway is the dual one (:func:`dual_gateway_config`), sending to it too."""
    stack = stack_mod.prepare(
        stack_mod.free_ports_query_paired(),  # as `make up` pairs them: `report` finds Jaeger's gRPC port
        log_dir=out_dir / "logs",
        data_dir=out_dir / "jaeger-badger",
        queue_dir=out_dir / "queues",
    )
    if second is not None:
        config = dual_gateway_config(out_dir / "gateway-dual.yaml")
        _, health, path, metrics = stack_mod.PROCESSES["gateway"]
        stack_mod.PROCESSES["gateway"] = (str(config), health, path, metrics)  # an absolute path wins the join
        stack.extra_env[SECOND_ENDPOINT_VAR] = second.otlp_endpoint
    for name in ("jaeger", "gateway", "agent"):
        stack.start_process(name)
    return stack


def store_counters(stack: stack_mod.Stack, second: SecondStore) -> dict[str, float]:
    """Per store: what the gateway's exporter sent / failed / has queued, what its Jaeger accepted / wrote."""
    out: dict[str, float] = {}
    url = stack.metrics_url("gateway")
    for store, exporter in EXPORTERS.items():
        for metric in ("sent_spans", "send_failed_spans", "enqueue_failed_spans"):
            out[f"gateway.{store}.{metric}"] = labelled_counter(url, f"otelcol_exporter_{metric}", exporter=exporter)
        out[f"gateway.{store}.queue_size"] = labelled_counter(url, "otelcol_exporter_queue_size", exporter=exporter)
    for store, jaeger in (("badger", stack), ("second", second.stack)):
        out[f"{store}.jaeger.receiver_accepted_spans"] = jaeger.counter("jaeger", "otelcol_receiver_accepted_spans")
        out[f"{store}.jaeger.exporter_sent_spans"] = jaeger.counter("jaeger", "otelcol_exporter_sent_spans")
    return out


ONE_TRY_S = 60.0
"""A query that takes longer than this once is not repeated (the run has a deadline)."""


def timed(fn: Callable[[], T], reps: int) -> tuple[float, list[float], T]:
    """(median s, every time, the last result) of ``reps`` calls of ``fn`` (one only when it takes more than
    :data:`ONE_TRY_S`)."""
    times: list[float] = []
    result: T | None = None
    for _ in range(reps):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        if times[0] > ONE_TRY_S:
            break
    assert result is not None
    return statistics.median(times), [round(t, 4) for t in times], result


@dataclass
class QueryPlan:
    service: str
    start: datetime
    end: datetime
    step: int
    """A regular step: its slowest and failed samples."""
    big_step: int
    """The big step: ``report --step``, and its slowest samples."""
    probes: list[str]
    """Sample trace ids to fetch by id."""
    big_step_start: datetime
    """When the big step began (``report --since`` from then covers it)."""
    reps: int = 3
    report_timeout_s: float = 600.0


def slowest(spans: list[FoundSpan], top: int = 10) -> list[tuple[str, int]]:
    """The ``top`` slowest ``rl.sample`` spans (trace id, ns), sorted from the slowest."""
    samples = sorted((s for s in spans if s.name == "rl.sample"), key=lambda s: -s.duration_ns)
    return [(s.trace_id, s.duration_ns) for s in samples[:top]]


def pick_probes(grpc_target: str, plan: QueryPlan, count: int) -> list[str]:
    """``count`` sample trace ids of ``plan.step``, spread over its samples (by trace id order)."""
    search = GrpcSearch(grpc_target)
    try:
        found = search.find(plan.service, plan.start, plan.end, {"rl.step": str(plan.step)}, "rl.sample", 20000)
    finally:
        search.close()
    ids = sorted({s.trace_id for s in found if s.name == "rl.sample"})
    return ids[:: max(1, len(ids) // count)][:count]


def query_store(http_url: str, grpc_target: str, plan: QueryPlan, index_url: str | None = None) -> dict[str, Any]:
    """The query times of one store's Jaeger (median of ``plan.reps``, each time listed) and what they found;
    ``index_url``: its OpenSearch, for ``report --opensearch``."""
    client = JaegerClient(http_url, timeout_s=300)
    search = GrpcSearch(grpc_target)
    out: dict[str, Any] = {}
    try:
        by_id = []
        for tid in plan.probes:  # several different traces, each fetched once: no answer is cached
            t0 = time.perf_counter()
            spans = list(decode_resource_spans(client.get_trace(tid)))
            by_id.append(time.perf_counter() - t0)
            out.setdefault("trace_by_id_spans", []).append(len(spans))
        out["trace_by_id_s"] = round(statistics.median(by_id), 4)
        out["trace_by_id_all_s"] = [round(t, 4) for t in by_id]
        for name, step in (("slowest", plan.step), ("slowest_big", plan.big_step)):
            median, times, spans = timed(
                lambda s=step: search.find(
                    plan.service, plan.start, plan.end, {"rl.step": str(s)}, "rl.sample", search_depth=20000
                ),
                plan.reps,
            )
            out[f"{name}_s"], out[f"{name}_all_s"] = round(median, 4), times
            out[f"{name}_traces"] = len({s.trace_id for s in spans if s.name == "rl.sample"})
            out[f"{name}_top"] = slowest(spans, 3)
        for name, step in (("failed", plan.step), ("failed_big", plan.big_step)):
            median, times, spans = timed(
                lambda s=step: search.find(
                    plan.service, plan.start, plan.end, {"error": "true", "rl.step": str(s)}, search_depth=20000
                ),
                plan.reps,
            )
            out[f"{name}_s"], out[f"{name}_all_s"] = round(median, 4), times
            out[f"{name}_traces"] = len({s.trace_id for s in spans if s.name == "rl.sample" and s.error})
        out.update(report_times(http_url, plan, index_url))
    finally:
        search.close()
    return out


def report_times(http_url: str, plan: QueryPlan, index_url: str | None = None) -> dict[str, Any]:
    """``otel-agentloop report --jaeger URL --service S --step BIG`` as a subprocess, as a user runs it (the whole
    store's window): ``full`` (read from the step's stored summary and the slowest trace), then what needs every
    sample span of the big step: ``page`` (``--html``), ``perfetto`` (``--perfetto``) and ``compare``
    (``--compare STEP BIG --json``); ``index_url``: the OpenSearch Jaeger stores in, given as ``--opensearch``
    (a step's spans read straight from its indices). Median of ``plan.reps`` (one try for a slow one), each
    bounded by ``plan.report_timeout_s``. Wall seconds, exit code, stderr's last lines, the first line printed."""
    cli = Path(sys.executable).parent / "otel-agentloop"
    cmd = [str(cli), "report", "--jaeger", http_url, "--service", plan.service, "--timeout", "120"]
    if index_url is not None:
        cmd += ["--opensearch", index_url]
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="soak-report-") as tmp:
        cases = {
            "full": ["--step", str(plan.big_step)],
            "page": ["--step", str(plan.big_step), "--html", f"{tmp}/step.html"],
            "perfetto": ["--step", str(plan.big_step), "--perfetto", f"{tmp}/step.json"],
            "compare": ["--compare", str(plan.step), str(plan.big_step), "--json"],
        }
        for name, extra in cases.items():
            times: list[float] = []
            for _ in range(plan.reps):
                out[f"report_{name}_command"] = " ".join([*cmd[1:], *extra])
                t0 = time.perf_counter()
                try:
                    proc = subprocess.run([*cmd, *extra], capture_output=True, text=True, timeout=plan.report_timeout_s)
                except subprocess.TimeoutExpired:
                    out[f"report_{name}_timed_out_s"] = plan.report_timeout_s
                    break
                times.append(time.perf_counter() - t0)
                out[f"report_{name}_rc"] = proc.returncode
                out[f"report_{name}_stderr"] = proc.stderr.strip().splitlines()[-4:]
                out[f"report_{name}_stdout_head"] = proc.stdout.splitlines()[:2]
                if times[0] > ONE_TRY_S:
                    break
            if times:
                out[f"report_{name}_s"] = round(statistics.median(times), 2)
                out[f"report_{name}_all_s"] = [round(t, 2) for t in times]
    return out
