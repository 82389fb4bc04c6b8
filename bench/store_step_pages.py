"""Step pages from the store, before and after reading a step's traces by ``rl.step`` (issue 38, item 7).

Writes one run of contiguous steps into a fresh store through the library (``oal.step``, each sample 5 spans
by the decorators, ``collect()`` writing each step's ``rl.step.summary``): ``--lead`` steps of ``--small``
samples (default 1), then the big step of ``--big``, then one more of ``--small``, so that each step's window (its
summary's time +- 30 s) holds its neighbours' traces, as a run's steps do; ``--lead 1000`` gives the run 1,000
summaries to read before the big step, as the store soak's run has. The store: Jaeger 2.13 on Badger, or on a
3-node OpenSearch cluster (``--store opensearch``), its query gRPC port right below its HTTP port (as ``make up``
pairs them).

Then times ``report --jaeger`` as a user runs it (a subprocess; wall time) for: the small step's page
after the big one, the big step's page and Perfetto file, ``--compare`` of the first step with the one after the
big one and with the big one (``--json``); each with this
checkout and with the code of ``--old`` (a ``git worktree`` of main before the change), alternating, ``--repeats``
times each; the outputs of old and new must be equal (the page's HTML, the Perfetto file, the JSON). On
OpenSearch this checkout reads with ``--opensearch URL`` (the step's spans straight from Jaeger's indices;
``--through-jaeger``: not). Load averages are read around each run.

    .venv/bin/python bench/store_step_pages.py --old /tmp/store-main [--store opensearch] [--big 8192] \
        [--lead 1000 --small 2] [--case "step page" --case Perfetto]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "bench"))
import stack_lib as stack_mod  # noqa: E402
import stack_store  # noqa: E402
from soak_worker import SPANS_PER_SAMPLE, one_sample  # noqa: E402

import otel_agentloop as oal  # noqa: E402


def start_store(kind: str, out: Path) -> tuple[stack_mod.Stack, Any]:
    if kind == "badger":
        stack = stack_mod.prepare(stack_mod.free_ports_query_paired(), log_dir=out / "logs", data_dir=out / "badger")
        stack.start_process("jaeger")
        return stack, None
    cluster = stack_store.start_opensearch(out / "opensearch", nodes=3, heap="1g")
    try:
        ports = stack_mod.free_ports_query_paired()
        return stack_store.start_stack(cluster, out / "logs", names=("jaeger",), ports=ports), cluster
    except BaseException:
        cluster.stop()
        raise


BATCH = 256
"""Samples run at once; the export queue is flushed between batches (a burst of 8,192 would overflow it)."""


async def _step(first: int, n: int) -> None:
    await asyncio.gather(*(one_sample(i) for i in range(first, first + n)))


def write_run(stack: stack_mod.Stack, service: str, sizes: list[int]) -> int:
    """The run's steps 1.. of ``sizes`` samples; the spans exported."""
    endpoint = f"http://127.0.0.1:{stack.ports['jaeger_otlp_grpc']}"  # a slow store: wait, never drop
    handle = oal.configure(service, endpoint=endpoint, protocol="grpc", max_queue_size=1 << 17, export_timeout_s=300)
    for step, n in enumerate(sizes, 1):
        with oal.step(step):
            for first in range(0, n, BATCH):
                asyncio.run(_step(first, min(BATCH, n - first)))
                handle.force_flush(120)
        handle.metrics.collect(step)
    handle.force_flush(120)
    exported, dropped = int(handle.stats["exported"]), int(handle.stats["dropped"])
    if dropped:
        raise RuntimeError(f"{dropped} spans dropped while writing the run")
    handle.shutdown(30)
    return exported


def wait_stored(stack: stack_mod.Stack, cluster: Any, spans: int, timeout: float = 900) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        done = stack.counter("jaeger", "otelcol_exporter_sent_spans") >= spans
        if done and cluster is not None:
            done = (cluster.doc_count() or 0) >= spans
        if done:
            time.sleep(5)  # OpenSearch's refresh; Badger's flush
            return time.monotonic() - t0
        time.sleep(2)
    raise RuntimeError(f"the store did not get {spans} spans within {timeout} s")


CASES = {
    "small step page (`--step AFTER --html`)": ["--step", "{after}", "--html", "{out}/page.html"],
    "big step page (`--step BIG --html`)": ["--step", "{big}", "--html", "{out}/page.html"],
    "big step Perfetto (`--step BIG --perfetto`)": ["--step", "{big}", "--perfetto", "{out}/trace.json"],
    "`--compare 1 AFTER --json`": ["--compare", "1", "{after}", "--json"],
    "`--compare 1 BIG --json`": ["--compare", "1", "{big}", "--json"],
}
"""Step BIG is the big one, AFTER the small step right after it (``--lead`` small steps before it)."""


def run_report(
    tree: Path, url: str, service: str, args: list[str], out: Path, extra: list[str] | None = None
) -> tuple[float, str, str, bytes]:
    out.mkdir(parents=True, exist_ok=True)
    argv = [a.replace("{out}", str(out)) for a in args] + (extra or [])
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(tree)
    cmd = [sys.executable, "-m", "otel_agentloop", "report", "--jaeger", url, "--service", service, *argv]
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    if done.returncode != 0:  # kept, as what a user gets (e.g. no answer within the default --timeout)
        print(f"{tree}: {' '.join(argv)}: exit {done.returncode}: {done.stderr[-600:]}", flush=True)
        return -wall, done.stdout, done.stderr, b""
    files = b"".join(p.read_bytes() for p in sorted(out.iterdir()))  # a failed run: negative wall time
    return wall, done.stdout, done.stderr, files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, required=True, help="a checkout of the code before (git worktree)")
    parser.add_argument("--store", choices=("badger", "opensearch"), default="badger")
    parser.add_argument("--small", type=int, default=64)
    parser.add_argument("--big", type=int, default=8192)
    parser.add_argument(
        "--lead",
        type=int,
        default=1,
        help="small steps before the big one (1000: a run's 1,000 summaries to read first, as in the store soak)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--through-jaeger",
        action="store_true",
        help="on OpenSearch, read the new tree's steps through Jaeger too (default: `report --opensearch URL`)",
    )
    parser.add_argument("--json-out", type=Path)
    parser.add_argument(
        "--case", action="append", default=[], help="only the cases whose name holds this text (repeatable)"
    )
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="oal-step-pages-"))
    result: dict[str, Any] = {"store": args.store, "small": args.small, "big": args.big, "cases": {}}
    result["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    result["started"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    stack, cluster = start_store(args.store, out)
    try:
        service = f"step-pages-{uuid.uuid4().hex[:6]}"
        t0 = time.monotonic()
        spans = write_run(stack, service, [args.small] * args.lead + [args.big, args.small])
        result["spans"] = spans
        result["expected_spans"] = ((args.lead + 1) * args.small + args.big) * SPANS_PER_SAMPLE
        steps = {"{big}": str(args.lead + 1), "{after}": str(args.lead + 2)}
        result["written_s"] = round(time.monotonic() - t0, 1)
        result["stored_s"] = round(wait_stored(stack, cluster, spans), 1)
        print(f"{spans:,} spans written in {result['written_s']} s, stored {result['stored_s']} s later", flush=True)
        new_args = ["--opensearch", cluster.url()] if cluster is not None and not args.through_jaeger else []
        result["new_args"] = new_args
        for number, (name, case) in enumerate(CASES.items()):
            if args.case and not any(text in name for text in args.case):
                continue
            times: dict[str, list[float]] = {"old": [], "new": []}
            loads: list[float] = []
            outputs: dict[str, bytes] = {}
            progress = ""
            for i in range(args.repeats):
                for which, tree in (
                    (("old", args.old), ("new", ROOT)) if i % 2 == 0 else (("new", ROOT), ("old", args.old))
                ):
                    loads.append(os.getloadavg()[0])
                    extra = new_args if which == "new" else []
                    argv = [steps.get(a, a) for a in case]
                    wall, stdout, stderr, files = run_report(
                        tree, stack.jaeger_url, service, argv, out / which / f"case{number}-{i}", extra
                    )  # this case's files only
                    times[which].append(round(wall, 2))
                    outputs.setdefault(which, stdout.encode() + files)
                    if which == "new":
                        progress = stderr
                    print(f"{name}: {which} {wall:.2f} s (load {loads[-1]:.1f})", flush=True)
            result["cases"][name] = {
                "old": times["old"],
                "new": times["new"],
                "old_median": statistics.median(times["old"]),
                "new_median": statistics.median(times["new"]),
                "load": [min(loads), max(loads)],
                "same_output": _same(outputs["old"], outputs["new"]),
                "new_stderr": progress,
            }
    finally:
        stack.stop()
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(out, ignore_errors=True)  # the store and the reports' files (hundreds of MB)
    text = json.dumps(result, indent=2)
    if args.json_out:
        args.json_out.write_text(text)
    print(text)
    return 0


def _same(old: bytes, new: bytes) -> bool:
    """Equal, but for the pages' own paths (each run writes below its own folder)."""
    strip = [b"/old/", b"/new/"]
    for s in strip:
        old, new = old.replace(s, b"/x/"), new.replace(s, b"/x/")
    return old == new


if __name__ == "__main__":
    sys.exit(main())
