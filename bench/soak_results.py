"""The store soak's summary (``soak.json`` of ``bench/soak.py --second-store opensearch``) as tables for
bench/RESULTS.md: counts at every hop, RSS and CPU of every process, disk, ingest, query times side by side.

    .venv/bin/python bench/soak_results.py /tmp/soak-store/full/soak.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _n(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def counts(r: dict[str, Any]) -> list[str]:
    lib, col, st = r["library"], r["collectors"], r["stores"]
    return [
        "| hop | Badger | OpenSearch |",
        "|---|---|---|",
        f"| made (by construction) | {r['created']:,} | (the same spans) |",
        f"| library: queued / exported / dropped | {lib['queued']:,} / {lib['exported']:,} / {lib['dropped']:,} | |",
        f"| agent: accepted / sent / refused | {_n(col['agent.receiver_accepted_spans'])} / "
        f"{_n(col['agent.exporter_sent_spans'])} / {_n(col['agent.receiver_refused_spans'])} | |",
        f"| gateway: accepted / refused | {_n(col['gateway.receiver_accepted_spans'])} / "
        f"{_n(col['gateway.receiver_refused_spans'])} | |",
        f"| gateway exporter: sent / failed / queued at the end | {_n(st['gateway.badger.sent_spans'])} / "
        f"{_n(st['gateway.badger.send_failed_spans'])} / {_n(st['gateway.badger.queue_size'])} | "
        f"{_n(st['gateway.second.sent_spans'])} / {_n(st['gateway.second.send_failed_spans'])} / "
        f"{_n(st['gateway.second.queue_size'])} |",
        f"| Jaeger: receiver accepted | {_n(st['badger.jaeger.receiver_accepted_spans'])} | "
        f"{_n(st['second.jaeger.receiver_accepted_spans'])} |",
        f"| Jaeger: storage exporter sent (written) | {_n(st['badger.jaeger.exporter_sent_spans'])} | "
        f"{_n(st['second.jaeger.exporter_sent_spans'])} |",
        f"| OpenSearch: documents in `otel-agentloop-jaeger-span-*` (after `_refresh`) | | "
        f"{_n(r.get('opensearch_docs'))} |",
    ]


def rss(r: dict[str, Any]) -> list[str]:
    steps = sorted(r["rss_mb"], key=int)
    first, last = steps[0], steps[-1]
    rows = [
        f"| process | RSS MB at start | at step {last} | after the drain | peak (VmHWM) | CPU s (loop / to drained) |",
        "|---|---|---|---|---|---|",
    ]
    for name in r["rss_mb"][last]:
        a, b = r["rss_mb"][first].get(name), r["rss_mb"][last][name]
        c, p = r["rss_after_drain_mb"].get(name), r["rss_peak_mb"].get(name)
        cpu = f"{_n(r['cpu_s'].get(name))} / {_n(r['cpu_after_drain_s'].get(name))}"
        rows.append(f"| {name} | {_n(a)} | {_n(b)} | {_n(c)} | {_n(p)} | {cpu} |")
    return rows


def _q(store: dict[str, Any], key: str, found: str | None = None) -> str:
    if "error" in store:
        return f"error: {store['error'][:80]}"
    if f"{key}_s" not in store:
        timed_out = store.get(f"{key}_timed_out_s")
        return f"> {timed_out:.0f} s (stopped)" if timed_out else "-"
    times = ", ".join(f"{t:.3g}" for t in store[f"{key}_all_s"])
    if store.get(f"{key}_rc", 0) != 0:
        why = " ".join(store.get(f"{key}_stderr") or [])[:160]
        return f"fails (exit {store[f'{key}_rc']}) after {store[f'{key}_s']:.3g} s: {why}"
    text = f"**{store[f'{key}_s']:.3g} s** ({times})"
    if found:
        text += f"; {store.get(found)} found"
    return text


def queries(r: dict[str, Any]) -> list[str]:
    q = r["queries"]
    b, o = q["badger"], q["opensearch"]
    plan = q["plan"]
    rows = [
        "| query | Badger | OpenSearch |",
        "|---|---|---|",
        f"| one sample's trace by id (HTTP api_v3; median of {len(plan['probes'])} different traces) | "
        f"{_q(b, 'trace_by_id')} | {_q(o, 'trace_by_id')} |",
    ]
    for key, what, step in (
        ("slowest", "slowest samples of step {} (gRPC api_v3, `rl.step`, op `rl.sample`; fetch and sort)", "step"),
        ("slowest_big", "the same for the big step {}", "big_step"),
        ("failed", "failed samples of step {} (gRPC api_v3, `error=true` + `rl.step`)", "step"),
        ("failed_big", "the same for the big step {}", "big_step"),
    ):
        rows.append(f"| {what.format(plan[step])} | {_q(b, key, key + '_traces')} | {_q(o, key, key + '_traces')} |")
    big = plan["big_step"]
    for key, what in (
        ("report_full", f"`report --step {big}` as a user runs it (whole store; the step's summary + one trace)"),
        ("report_since", f"the same with `--since` covering only step {big}"),
        ("report_spans_since", f"`report --step {big} --from-spans` with that `--since` (every sample span)"),
        ("report_page", f"`report --step {big} --html` (the step page: every sample span; OpenSearch: `--opensearch`)"),
        ("report_perfetto", f"`report --step {big} --perfetto` (the same spans)"),
        ("report_compare", f"`report --compare {plan['step']} {big} --json`"),
    ):
        if any(f"{key}{end}" in store for store in (b, o) for end in ("_s", "_timed_out_s")):
            rows.append(f"| {what} | {_q(b, key)} | {_q(o, key)} |")
    return rows


def section(r: dict[str, Any]) -> str:
    lib = r["library"]
    per_step = r["workers"] * (r["samples_per_worker_step"] * 5 + 1) + 2  # samples, worker spans, step, summary
    big = ((r["created"] - (r["steps"] - 1) * per_step - 2) // r["workers"] - 1) // 5  # per worker
    disk_b = r["disk_after_stop"]
    disk_o = r["second_disk"]
    exported = lib["exported"]
    at = r["stored_at_s"]
    ingest = ", ".join(
        f"{name}: all {exported:,} spans stored {t:.0f} s after the first step ({exported / t:,.0f} spans/s end to end)"
        if t
        else f"{name}: not all stored within the drain timeout"
        for name, t in at.items()
    )
    return "\n".join(
        [
            f"Machine: {r['machine']}. Started {r.get('started_utc', '?')}. Command: `{r['command']}`.",
            "",
            f"{r['steps']} steps x {r['workers']} Ray workers: {r['samples_per_worker_step']} samples per worker per "
            f"step, the last step {r['queries']['plan']['big_step']} with {big:,} per worker "
            f"({big * r['workers']:,} samples); 5 spans "
            f"per sample; **{r['created']:,} spans** made in {r['loop_s']:.0f} s ({r['spans_per_s']:,} spans/s); "
            f"{sum(r['failed_samples'].values()):,} failed samples. Ingest: {ingest}. Whole run {r['wall_s']:.0f} s.",
            "",
            *counts(r),
            "",
            *rss(r),
            "",
            f"Disk: Badger {disk_b['bytes'] / 1e6:,.0f} MB after a clean stop = **{disk_b['bytes_per_span']:.0f} "
            f"bytes per span**; OpenSearch (3 nodes' data directories after `_flush`, primaries + 1 replica) "
            f"{disk_o['bytes'] / 1e6:,.0f} MB = **{disk_o['bytes'] / exported:.0f} bytes per span** "
            f"({disk_o['apparent_bytes'] / exported:.0f} apparent).",
            "",
            *queries(r),
        ]
    )


if __name__ == "__main__":
    print(section(json.loads(Path(sys.argv[1]).read_text())))
