"""Issue 18 (4): a long, time-compressed run through the cluster topology, counted end to end.

A driver and ``--workers`` Ray actor workers (a local Ray cluster, ``address="local"``; the workers configured
through ``runtime_env`` by ``otel_agentloop.integrations.ray``, as the demo does) run ``--steps`` steps of
``--samples`` samples per worker. Each sample is a trace of 5 spans (the sample, two generation turns, a tool
call, a reward), made by decorated functions without sleeping. Spans go to an agent Collector, which forwards
to a gateway Collector, which writes to Jaeger on disk (Badger): collector/agent.yaml, gateway.yaml,
jaeger.yaml, started by scripts/stack.py.

Reported: spans created (counted here, by construction) against the library's exported + dropped; what each
process's own metrics say it accepted and sent (``otelcol_receiver_accepted_spans`` /
``otelcol_exporter_sent_spans`` of the agent, the gateway and Jaeger); the spans Jaeger returns through api_v3
for sampled traces; RSS of every process at ``--rss-steps``; the store's bytes on disk per span and per step;
the time to fetch one sample's trace by id at the end, warm and after a restart of Jaeger.

    .venv/bin/python bench/soak.py --steps 1000 --samples 256 --workers 2 --time-limit 2400 --out /tmp/soak

``--time-limit`` bounds the run: at that many seconds no new step starts (but ``--big-step``, if not run yet,
still runs, last), and the report says how many ran.

Issue 29 (5): ``--second-store opensearch`` feeds the same spans to a second Jaeger on a 3-node OpenSearch cluster
through the same gateway (bench/soak_store.py), with ``--big-step N --big-samples 4096`` (one step of 8,192
samples) and ``--fail-every 64`` (failed samples); the query times of both stores side by side come last, and
``bench/soak_results.py soak.json`` prints the RESULTS.md tables. The stores are deleted at the end
(``--keep-stores`` keeps them); ``soak.json`` stays.

    .venv/bin/python bench/soak.py --steps 1001 --samples 256 --workers 2 --big-step 1001 --big-samples 4096 \
        --fail-every 64 --second-store opensearch --time-limit 1200 --drain-timeout 2100 --out /tmp/soak-store/full
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import ray

import otel_agentloop as oal
from otel_agentloop.analysis import decode_resource_spans
from otel_agentloop.analysis._reading._jaeger import JaegerClient
from otel_agentloop.integrations import ray as oal_ray

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import soak_store
import stack_lib as stack_mod
from soak_worker import SPANS_PER_SAMPLE, SoakWorker, fails

SERVICE = "soak"
BENCH = str(Path(__file__).resolve().parent)


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """The resident set (``VmRSS``) of process ``pid`` in MB, or its peak so far (``VmHWM``)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def machine() -> str:
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kb = next(int(x.split()[1]) for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal"))
    return (
        f"{cpu}, {os.cpu_count()} cores, {mem_kb / 2**20:.1f} GiB RAM, Python {platform.python_version()}, "
        f"Ray {ray.__version__}, Linux {platform.release()}"
    )


def counters(stack: stack_mod.Stack) -> dict[str, float]:
    out = {}
    for name in ("agent", "gateway", "jaeger"):
        for metric in ("otelcol_receiver_accepted_spans", "otelcol_exporter_sent_spans"):
            out[f"{name}.{metric[8:]}"] = stack.counter(name, metric)
        out[f"{name}.receiver_refused_spans"] = stack.counter(name, "otelcol_receiver_refused_spans")
    for name in ("agent", "gateway"):
        out[f"{name}.exporter_send_failed_spans"] = stack.counter(name, "otelcol_exporter_send_failed_spans")
        out[f"{name}.exporter_enqueue_failed_spans"] = stack.counter(name, "otelcol_exporter_enqueue_failed_spans")
    return out


def all_pids(stack: stack_mod.Stack, second: soak_store.SecondStore | None, workers: list[int]) -> dict[str, int]:
    """Every process of the run by name: driver, Ray workers, the Collectors, both Jaegers, the OpenSearch nodes."""
    pids = {"driver": os.getpid(), **{f"worker{i}": p for i, p in enumerate(workers)}}
    pids.update(stack.pids())
    if second is not None:
        pids.update(second.pids())
    return pids


def drain(
    stack: stack_mod.Stack, second: soak_store.SecondStore | None, exported: int, timeout: float, t0: float
) -> dict[str, float | None]:
    """Wait until every store has written ``exported`` spans and the agent's and gateway's queues are empty (or
    ``timeout`` s); returns, per store, the seconds from ``t0`` (the first step) until it had them all
    (``None``: not within the timeout). For OpenSearch, "had them" is its span indices' document count."""
    stored_at: dict[str, float | None] = {"badger": None} | ({second.name: None} if second is not None else {})
    deadline = time.monotonic() + timeout
    last_print = time.monotonic()
    while time.monotonic() < deadline:
        if stored_at["badger"] is None and stack.counter("jaeger", "otelcol_exporter_sent_spans") >= exported:
            stored_at["badger"] = round(time.monotonic() - t0, 1)
        if second is not None and stored_at[second.name] is None and second.stored() >= exported:
            docs = second.doc_count()
            if docs is None or docs >= exported:
                stored_at[second.name] = round(time.monotonic() - t0, 1)
        queues = stack.counter("agent", "otelcol_exporter_queue_size") + stack.counter(
            "gateway", "otelcol_exporter_queue_size"
        )
        if queues == 0 and all(v is not None for v in stored_at.values()):
            break
        if time.monotonic() - last_print > 30:
            last_print = time.monotonic()
            second_text = f", {second.stored():,.0f} in {second.name}" if second is not None else ""
            print(
                f"drain: stored {stack.counter('jaeger', 'otelcol_exporter_sent_spans'):,.0f} in Badger{second_text} "
                f"of {exported:,}; {queues:,.0f} queued",
                flush=True,
            )
        time.sleep(2)
    return stored_at


def side_by_side(
    args: argparse.Namespace,
    stack: stack_mod.Stack,
    second: soak_store.SecondStore,
    since: datetime,
    big_step_start: datetime,
) -> dict[str, Any]:
    """The query times of point 5 on both stores, the same queries on the same spans."""
    query_step = args.query_step or max(1, args.steps // 2 - 1)
    plan = soak_store.QueryPlan(
        SERVICE,
        since,
        datetime.now(timezone.utc),
        query_step,
        args.big_step,
        [],
        big_step_start,
        report_timeout_s=args.report_timeout,
    )
    plan.probes = soak_store.pick_probes(f"127.0.0.1:{stack.ports['query_grpc']}", plan, 5)
    out = {"plan": {"step": plan.step, "big_step": plan.big_step, "probes": plan.probes}}
    for name, jaeger in (("badger", stack), (second.name, second.stack)):
        print(f"queries on {name} ...", flush=True)
        try:  # a failed query must not lose the run's counts
            index = second.cluster.url() if name == second.name and second.cluster is not None else None
            grpc = f"127.0.0.1:{jaeger.ports['query_grpc']}"
            out[name] = soak_store.query_store(jaeger.jaeger_url, grpc, plan, index)
        except Exception as exc:
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    out_dir = Path(args.out)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    second = None
    t_start = time.monotonic()
    if args.second_store:  # first: the gateway sends to it
        second = soak_store.start_second(args.second_store, out_dir, args.heap)
    try:
        stack = soak_store.start_first(out_dir, second)
    except BaseException:
        if second is not None:
            second.stop()
        raise
    result: dict[str, Any] = {"machine": machine(), "command": " ".join([sys.executable, *sys.argv])}
    result["stores_start_s"] = round(time.monotonic() - t_start, 1)
    result["started_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    since = datetime.now(timezone.utc) - timedelta(seconds=5)
    try:
        handle = oal.configure(SERVICE, endpoint=stack.otlp_grpc_endpoint, max_queue_size=65536)
        package_root = str(Path(oal.__file__).resolve().parent.parent)
        ray.init(
            address="local",
            num_cpus=max(2, args.workers),
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            # the workers import the package and bench/soak_worker.py (the worker class pickles by reference)
            runtime_env=oal_ray.runtime_env(handle, base={"env_vars": {"PYTHONPATH": f"{package_root}:{BENCH}"}}),
        )
        actor = ray.remote(num_cpus=0)(SoakWorker)
        workers = [actor.remote() for _ in range(args.workers)]
        worker_pids: list[int] = []
        rss: dict[int, dict[str, float]] = {}
        steps_done = 0
        created = 0
        failed: dict[int, int] = {}  # failed samples per step (only steps with any)
        big_step_start = since
        rss[0] = {name: round(rss_mb(pid), 1) for name, pid in all_pids(stack, second, []).items()}
        step_walls: list[float] = []
        t_loop = time.monotonic()
        step = 0
        while step < args.steps:
            step += 1
            if time.monotonic() - t_start > args.time_limit:  # past the limit: the big step still runs, last
                if not args.big_step or step > args.big_step:
                    break
                step = args.big_step
            t0 = time.monotonic()
            n = args.big_samples if step == args.big_step else args.samples
            if step == args.big_step:
                big_step_start = datetime.now(timezone.utc)
            with oal.step(step):
                carrier = oal_ray.carrier()
                refs = [
                    w.run_step.remote(i * n, n, args.fail_every, otel_carrier=carrier) for i, w in enumerate(workers)
                ]
                failures = sum(ray.get(refs, timeout=600))
            finished = ray.get([w.finish_step.remote(step) for w in workers], timeout=120)
            metrics = oal_ray.merge_metrics(t for t, _ in finished)
            worker_pids = [pid for _, pid in finished]
            if metrics["agent_loop/num_samples"] != n * args.workers:
                raise RuntimeError(f"step {step}: metrics of {metrics['agent_loop/num_samples']} samples")
            if failures != sum(fails(i, args.fail_every) for i in range(n * args.workers)):
                raise RuntimeError(f"step {step}: {failures} samples failed")
            if failures:
                failed[step] = failures
            # + each worker span, the step's span and its rl.step.summary (written by merge_metrics)
            created += args.workers * (n * SPANS_PER_SAMPLE + 1) + 2
            step_walls.append(time.monotonic() - t0)
            steps_done = step
            if step in args.rss_steps or step == args.steps:
                rss[step] = {name: round(rss_mb(pid), 1) for name, pid in all_pids(stack, second, worker_pids).items()}
            if step % args.report_every == 0:
                rate = created / (time.monotonic() - t_loop)
                stored = f"; stored: {stack.counter('jaeger', 'otelcol_exporter_sent_spans'):,.0f} in Badger"
                if second is not None:
                    stored += f", {second.stored():,.0f} in {second.name}"
                print(f"step {step}: {created:,} spans made, {rate:,.0f} spans/s{stored}", flush=True)
        pids = all_pids(stack, second, worker_pids)
        if steps_done and steps_done not in rss:
            rss[steps_done] = {name: round(rss_mb(pid), 1) for name, pid in pids.items()}
        cpu = {name: round(cpu_s(pid), 1) for name, pid in pids.items()}  # over the whole run, by process
        loop_s = time.monotonic() - t_loop
        worker_stats = ray.get([w.close.remote(60) for w in workers], timeout=180)
        ray.shutdown()
        handle.force_flush(60)
        driver_stats = dict(handle.stats)
        handle.shutdown(10)
        totals = {k: driver_stats[k] + sum(ws[k] for ws in worker_stats) for k in ("queued", "exported", "dropped")}
        # wait until Jaeger has stored everything the agent took (the queues drain on their own)
        t_drain = time.monotonic()
        stored_at = drain(stack, second, totals["exported"], args.drain_timeout, t_loop)
        drain_s = time.monotonic() - t_drain
        time.sleep(3)
        pids = all_pids(stack, second, [])  # the workers have gone with Ray
        result["rss_after_drain_mb"] = {name: round(rss_mb(pid), 1) for name, pid in pids.items()}
        result["rss_peak_mb"] = {name: round(rss_mb(pid, "VmHWM"), 1) for name, pid in pids.items()}
        result["cpu_after_drain_s"] = {name: round(cpu_s(pid), 1) for name, pid in pids.items()}
        result.update(
            steps=steps_done,
            samples_per_worker_step=args.samples,
            workers=args.workers,
            loop_s=round(loop_s, 1),
            drain_s=round(drain_s, 1),
            spans_per_s=round(created / loop_s),
            step_wall_median_s=round(sorted(step_walls)[len(step_walls) // 2], 3),
            created=created,
            library=totals,
            collectors=counters(stack),
            rss_mb=rss,
            cpu_s=cpu,
            failed_samples=failed,
            stored_at_s=stored_at,
        )
        if second is not None:
            result["stores"] = soak_store.store_counters(stack, second)
            result["opensearch_docs"] = second.doc_count()
            result["queries"] = side_by_side(args, stack, second, since, big_step_start)
            used, apparent = second.disk_bytes()
            result["second_disk"] = {"bytes": used, "apparent_bytes": apparent}
        client = JaegerClient(stack.jaeger_url, timeout_s=60)
        # a few sample traces back through api_v3: all 5 spans each (search one step's window)
        t0 = time.perf_counter()
        found = client.find_traces(SERVICE, since, datetime.now(timezone.utc), search_depth=20)
        result["search_20_traces_s"] = round(time.perf_counter() - t0, 3)
        records = list(decode_resource_spans(found))
        trace_ids = sorted({r.trace_id_hex for r in records if r.name == "rl.sample"})
        result["search_sample_traces_found"] = len(trace_ids)
        probe = trace_ids[0] if trace_ids else None
        if probe is not None:
            t0 = time.perf_counter()
            spans = list(decode_resource_spans(client.get_trace(probe)))
            result["fetch_one_trace_warm_s"] = round(time.perf_counter() - t0, 4)
            result["fetch_one_trace_spans"] = len(spans)
        used, apparent = soak_store.disk_bytes(stack.data_dir)
        result["disk_live"] = {"bytes": used, "apparent_bytes": apparent}
        # a clean stop (Badger writes its memtables out), then the settled size, then a cold start and fetch
        stack.stop_process("jaeger", timeout=120)
        used, apparent = soak_store.disk_bytes(stack.data_dir)
        stored = result["collectors"]["jaeger.exporter_sent_spans"]
        result["disk_after_stop"] = {
            "bytes": used,
            "apparent_bytes": apparent,
            "bytes_per_span": round(used / stored, 1) if stored else None,
            "bytes_per_step": round(used / steps_done) if steps_done else None,
        }
        t0 = time.monotonic()
        stack.start_process("jaeger", timeout=300)
        result["jaeger_restart_s"] = round(time.monotonic() - t0, 1)
        if probe is not None:
            t0 = time.perf_counter()
            spans = list(decode_resource_spans(client.get_trace(probe)))
            result["fetch_one_trace_cold_s"] = round(time.perf_counter() - t0, 4)
            result["fetch_one_trace_cold_spans"] = len(spans)
        queue_used, _ = soak_store.disk_bytes(stack.queue_dir)
        result["queue_disk_bytes_end"] = queue_used
        result["wall_s"] = round(time.monotonic() - t_start, 1)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        stack.stop()
        if second is not None:
            second.stop()
        if not args.keep_stores:  # the summary stays; the stores go
            for path in (out_dir / "jaeger-badger", *(out_dir.glob("store-*"))):
                shutil.rmtree(path, ignore_errors=True)
        (out_dir / "soak.json").write_text(json.dumps(result, indent=2))  # what was measured, even on failure
    return result


def markdown(r: dict[str, Any]) -> str:
    """The result as a bench/RESULTS.md section."""
    lib, col = r["library"], r["collectors"]
    steps = r["steps"]
    first = min((s for s in r["rss_mb"] if s >= 100), default=min(r["rss_mb"]))
    last = max(r["rss_mb"])
    rows = []
    for name in r["rss_mb"][last]:
        a, b = r["rss_mb"][first].get(name, float("nan")), r["rss_mb"][last][name]
        rows.append(f"| {name} | {a:.1f} | {b:.1f} | {b - a:+.1f} | {r['cpu_s'].get(name, float('nan')):.0f} |")
    disk = r["disk_after_stop"]
    return "\n".join(
        [
            f"Machine: {r['machine']}. Command: `{r['command']}`.",
            "",
            f"{steps} steps x {r['workers']} Ray workers x {r['samples_per_worker_step']} samples per worker "
            f"per step, 5 spans per sample: **{r['created']:,} spans** made in {r['loop_s']:.0f} s "
            f"({r['spans_per_s']:,} spans/s, median step {r['step_wall_median_s']:.2f} s), then {r['drain_s']:.0f} s "
            f"until Jaeger had stored everything; whole run {r['wall_s']:.0f} s.",
            "",
            "| count | spans |",
            "|---|---|",
            f"| made (by construction) | {r['created']:,} |",
            f"| library: queued / exported / dropped | {lib['queued']:,} / {lib['exported']:,} / {lib['dropped']:,} |",
            f"| agent: accepted / sent / refused | {col['agent.receiver_accepted_spans']:,.0f} / "
            f"{col['agent.exporter_sent_spans']:,.0f} / {col['agent.receiver_refused_spans']:,.0f} |",
            f"| gateway: accepted / sent / refused | {col['gateway.receiver_accepted_spans']:,.0f} / "
            f"{col['gateway.exporter_sent_spans']:,.0f} / {col['gateway.receiver_refused_spans']:,.0f} |",
            f"| Jaeger: accepted / written to Badger | {col['jaeger.receiver_accepted_spans']:,.0f} / "
            f"{col['jaeger.exporter_sent_spans']:,.0f} |",
            f"| send failures (agent, gateway) | {col['agent.exporter_send_failed_spans']:,.0f}, "
            f"{col['gateway.exporter_send_failed_spans']:,.0f} |",
            "",
            f"| process | RSS MB at step {first} | at step {last} | growth | CPU s (run) |",
            "|---|---|---|---|---|",
            *rows,
            "",
            f"Disk (Badger, after a clean stop of Jaeger): {disk['bytes'] / 1e6:,.0f} MB = "
            f"**{disk['bytes_per_span']:.0f} bytes per span**, {disk['bytes_per_step'] / 1e6:.2f} MB per step "
            f"({r['workers'] * r['samples_per_worker_step']} samples); while Jaeger ran: "
            f"{r['disk_live']['bytes'] / 1e6:,.0f} MB allocated. Agent and gateway queues after the drain: "
            f"{r['queue_disk_bytes_end'] / 1e6:.1f} MB.",
            f"One sample's trace by id at the end: {r.get('fetch_one_trace_warm_s', float('nan')) * 1000:.1f} ms "
            f"({r.get('fetch_one_trace_spans')} spans); after restarting Jaeger on the same store "
            f"({r['jaeger_restart_s']:.1f} s to healthy): "
            f"{r.get('fetch_one_trace_cold_s', float('nan')) * 1000:.1f} ms. "
            f"A search for 20 traces of the service over the whole run: {r['search_20_traces_s']:.2f} s.",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=256, help="samples per worker per step")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--time-limit", type=float, default=2400, help="no new step after this many seconds")
    parser.add_argument("--drain-timeout", type=float, default=600)
    parser.add_argument("--rss-steps", type=lambda s: {int(x) for x in s.split(",")}, default={10, 100, 250, 500, 750})
    parser.add_argument("--report-every", type=int, default=50)
    parser.add_argument("--out", default="/tmp/otel-agentloop-soak")
    parser.add_argument(
        "--second-store",
        choices=("opensearch", "badger"),
        help="also feed the same spans to this store (bench/soak_store.py): the gateway exports to both",
    )
    parser.add_argument("--big-step", type=int, default=0, help="this step runs --big-samples per worker")
    parser.add_argument("--big-samples", type=int, default=4096, help="samples per worker in --big-step")
    parser.add_argument("--fail-every", type=int, default=0, help="every Nth sample index fails (0: none)")
    parser.add_argument("--query-step", type=int, default=0, help="the regular step queried (default: mid-run)")
    parser.add_argument("--report-timeout", type=float, default=600, help="s for one `report --step` run")
    parser.add_argument("--heap", default="1g", help="JVM heap of each OpenSearch node")
    parser.add_argument("--keep-stores", action="store_true", help="keep the stores' data (deleted by default)")
    args = parser.parse_args()
    result = run(args)
    print(json.dumps(result, indent=2))
    print(markdown(result))
    lib, col = result["library"], result["collectors"]
    ok = (
        result["created"] == lib["exported"] + lib["dropped"]
        and col["jaeger.exporter_sent_spans"] == lib["exported"] == col["agent.receiver_accepted_spans"]
    )
    print("nothing lost" if ok else "COUNTS DIFFER", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
