"""Issue 19 (scale): ``report --step N --perfetto`` on a step of 8,192 samples (target <= 10 s).

The trace file is written by the library's own OTLP-JSON file exporter (``OTLPJsonFileExporter``, batches of
512 as the batch processor sends them) from spans built with verl-like timings, so the bytes are those a real
run writes: 8 workers (verl's ``agent.num_workers``, each its own resource), per sample 3 generation turns,
parallel tool calls after the first turn (1 to 3 at once) and one after the second, a reward, with the
library's identity attributes on every span; the trainer's ``rl.step``/``rl.train.*`` spans; 4 hung samples
(watchdog snapshot, no sample span) and 8 slow ones (snapshot, then the span ended). A second, smaller step
sits in the same file so that reading has something to skip.

Timed, each as the median of ``--rounds`` (fresh processes for the end-to-end run):
- end to end: ``otel-agentloop report --file F --step N --perfetto out.json`` as a user runs it (interpreter
  start, reading, the metrics report, the export), interleaved with the same command without ``--perfetto``
  (on a shared machine the difference of the two is the export's cost, measured side by side);
- reading alone (``read_jsonl``), and the export alone (``write_perfetto`` on the records in memory).

Usage: ``python bench/perfetto_export.py [--samples 8192] [--rounds 3] [--results]`` (``--results`` prints the
markdown section for bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

from machine import machine  # bench/ is on the path when run as a script, as bench/run.py's own imports are
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import read_jsonl
from otel_agentloop.analysis._rendering._perfetto import write_perfetto
from otel_agentloop.export._file import OTLPJsonFileExporter

WORKERS = 8
STEP = 7
TOOLS = ("search", "python", "calculator", "sandbox")
T0 = 1_795_000_000_000_000_000


class _Ids:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def trace(self) -> int:
        return self.rng.getrandbits(128) | 1

    def span(self) -> int:
        return self.rng.getrandbits(64) | 1


def _ctx(trace_id: int, span_id: int) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def _span(
    name: str,
    trace_id: int,
    span_id: int,
    parent: int,
    start: int,
    end: int,
    attrs: dict[str, object],
    resource: Resource,
    error: bool = False,
) -> ReadableSpan:
    return ReadableSpan(
        name,
        context=_ctx(trace_id, span_id),
        parent=_ctx(trace_id, parent) if parent else None,
        resource=resource,
        attributes=attrs,  # type: ignore[arg-type]
        status=Status(StatusCode.ERROR, "ToolError") if error else Status(StatusCode.UNSET),
        start_time=start,
        end_time=end,
    )


def _lognormal_ns(rng: random.Random, median_s: float, sigma: float) -> int:
    return int(rng.lognormvariate(math.log(median_s), sigma) * 1e9)


def _sample_spans(
    rng: random.Random, ids: _Ids, step: int, index: int, rollout: int, start: int, resource: Resource, worker: str
) -> tuple[list[ReadableSpan], int]:
    """One sample's spans (root last, as the SDK ends them); returns them and the sample's end."""
    trace_id, root = ids.trace(), ids.span()
    ident: dict[str, object] = {
        sc.RL_STEP: step,
        sc.RL_VALIDATE: False,
        sc.RL_SAMPLE_INDEX: index,
        sc.RL_ROLLOUT_N: rollout,
    }
    spans: list[ReadableSpan] = []
    t = start + rng.randrange(20_000, 200_000)
    prompt = rng.randrange(100, 2000)
    response = 0
    for turn in range(3):
        dur = _lognormal_ns(rng, 2.0, 0.6)
        tokens = max(8, dur // 10_000_000)
        response += tokens
        spans.append(
            _span(
                f"{sc.DEFAULT_GENERATE_OPERATION} qwen-7b",
                trace_id,
                ids.span(),
                root,
                t,
                t + dur,
                {
                    **ident,
                    sc.RL_PHASE: sc.GENERATE,
                    sc.GEN_AI_OPERATION_NAME: sc.DEFAULT_GENERATE_OPERATION,
                    sc.GEN_AI_REQUEST_MODEL: "qwen-7b",
                    sc.GEN_AI_USAGE_INPUT_TOKENS: prompt + response,
                    sc.GEN_AI_USAGE_OUTPUT_TOKENS: tokens,
                    sc.RL_NUM_PREEMPTED: 0,
                },
                resource,
            )
        )
        t += dur + rng.randrange(50_000, 500_000)
        if turn == 2:
            break
        calls = rng.randint(1, 3) if turn == 0 else 1
        block_end = t
        for _ in range(calls):
            tool = rng.choice(TOOLS)
            call_start = t + rng.randrange(0, 3_000_000)
            call_end = call_start + _lognormal_ns(rng, 0.4, 0.8)
            block_end = max(block_end, call_end)
            spans.append(
                _span(
                    f"{sc.TOOL_SPAN_PREFIX} {tool}",
                    trace_id,
                    ids.span(),
                    root,
                    call_start,
                    call_end,
                    {
                        **ident,
                        sc.RL_PHASE: sc.TOOL_CALLS,
                        sc.GEN_AI_OPERATION_NAME: sc.EXECUTE_TOOL,
                        sc.GEN_AI_TOOL_NAME: tool,
                        sc.GEN_AI_TOOL_CALL_ID: f"call_{ids.span():x}",
                    },
                    resource,
                    error=rng.random() < 0.01,
                )
            )
        t = block_end + rng.randrange(50_000, 500_000)
    reward = _lognormal_ns(rng, 0.2, 0.5)
    spans.append(
        _span(
            sc.REWARD_SPAN,
            trace_id,
            ids.span(),
            root,
            t,
            t + reward,
            {**ident, sc.RL_PHASE: sc.COMPUTE_SCORE, sc.RL_REWARD_SCORE: rng.random()},
            resource,
        )
    )
    end = t + reward + rng.randrange(10_000, 100_000)
    root_attrs = {
        **ident,
        sc.RL_WORKER: worker,
        sc.RL_PROMPT_LENGTH: prompt,
        sc.RL_RESPONSE_LENGTH: response,
        sc.RL_NUM_TURNS: 3,
    }
    spans.append(_span(sc.SAMPLE_SPAN, trace_id, root, 0, start, end, root_attrs, resource))
    return spans, end


def _snapshot(span: ReadableSpan, at: int, resource: Resource, ids: _Ids) -> ReadableSpan:
    attrs = {k: v for k, v in (span.attributes or {}).items() if k in (sc.RL_STEP, sc.RL_VALIDATE)}
    attrs.update({k: v for k, v in (span.attributes or {}).items() if k.startswith("rl.sample.")})
    attrs.update({sc.RL_SNAPSHOT: True, sc.RL_PHASE: sc.TOOL_CALLS, sc.GEN_AI_TOOL_NAME: "sandbox"})
    attrs[sc.RL_WORKER] = (span.attributes or {}).get(sc.RL_WORKER, "")
    ctx = span.context
    assert ctx is not None and span.start_time is not None
    return _span(
        sc.SAMPLE_SPAN + sc.SNAPSHOT_SUFFIX, ctx.trace_id, ids.span(), ctx.span_id, span.start_time, at, attrs, resource
    )


def write_trace_file(path: str, samples: int, seed: int = 0) -> int:
    """The file: step ``STEP`` with ``samples`` samples, plus a step of 256 before it. Returns its span count."""
    rng, ids = random.Random(seed), _Ids(random.Random(seed + 1))
    exporter = OTLPJsonFileExporter(path)
    resources = []
    for w in range(WORKERS):
        worker = f"node-{w // 4}:{4100 + w}"
        resources.append(
            (
                Resource.create(
                    {
                        "service.name": "rollout",
                        "host.name": f"node-{w // 4}",
                        "process.pid": 4100 + w,
                        sc.RL_WORKER: worker,
                        sc.RL_RUN_ID: "bench-run",
                    }
                ),
                worker,
            )
        )
    driver = Resource.create({"service.name": "trainer", "host.name": "node-0", "process.pid": 4000})
    batch: list[ReadableSpan] = []
    total = 0

    def emit(spans: list[ReadableSpan]) -> None:
        nonlocal total
        batch.extend(spans)
        total += len(spans)
        while len(batch) >= 512:
            exporter.export(batch[:512])
            del batch[:512]

    t = T0
    for step, n in ((STEP - 1, 256), (STEP, samples)):
        step_trace, step_root = ids.trace(), ids.span()
        ends = []
        hung = set(rng.sample(range(n), 4)) if step == STEP else set()
        slow = set(rng.sample(sorted(set(range(n)) - hung), 8)) if step == STEP else set()
        for k in range(n):
            index, rollout = divmod(k, 16)
            resource, worker = resources[k % WORKERS]
            start = t + int(k / n * 2e9)  # dispatched over the first 2 s
            spans, end = _sample_spans(rng, ids, step, index, rollout, start, resource, worker)
            root = spans[-1]
            if k in hung:  # the watchdog's snapshot; the sample span never ends (not exported)
                spans = [s for s in spans[:2] if s is not root] + [_snapshot(root, start + 60 * 10**9, resource, ids)]
            elif k in slow:
                spans.append(_snapshot(root, start + (end - start) // 2, resource, ids))
            emit(spans)
            ends.append(end)
        step_end = max(ends) + 500_000_000
        gen_end = max(ends) + 10_000_000
        train = [
            _span(
                "rl.train.gen",
                step_trace,
                ids.span(),
                step_root,
                t,
                gen_end,
                {sc.RL_STEP: step, "rl.train.phase": "gen"},
                driver,
            )
        ]
        phase_start = gen_end
        for phase in ("old_log_prob", "ref", "adv", "update_actor"):
            phase_end = phase_start + rng.randrange(10**8, 10**9)
            train.append(
                _span(
                    f"rl.train.{phase}",
                    step_trace,
                    ids.span(),
                    step_root,
                    phase_start,
                    min(phase_end, step_end),
                    {sc.RL_STEP: step, "rl.train.phase": phase},
                    driver,
                )
            )
            phase_start = phase_end
        train.append(
            _span(
                sc.STEP_SPAN, step_trace, step_root, 0, t - 1000, max(step_end, phase_start), {sc.RL_STEP: step}, driver
            )
        )
        emit(train)
        t = max(step_end, phase_start) + 10**9
    if batch:
        exporter.export(batch)
    exporter.shutdown()
    return total


def _median_time(fn: object, rounds: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(rounds):
        begun = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - begun)
    return statistics.median(times), times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", action="store_true", help="print the RESULTS.md section")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    folder = tempfile.mkdtemp(prefix="perfetto-bench-")
    path, out = os.path.join(folder, "run.jsonl"), os.path.join(folder, "step.json")
    begun = time.perf_counter()
    spans = write_trace_file(path, args.samples)
    made_s = time.perf_counter() - begun
    size_mb = os.path.getsize(path) / 1e6
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    cmd = [sys.executable, "-m", "otel_agentloop", "report", "--file", path, "--step", str(STEP), "--perfetto", out]

    e2e_all: list[float] = []
    plain_all: list[float] = []
    for _ in range(args.rounds):  # interleaved: the same report without --perfetto, side by side
        for command, times in ((cmd, e2e_all), (cmd[:-2], plain_all)):
            begun = time.perf_counter()
            subprocess.run(command, env=env, check=True, capture_output=True, timeout=600)
            times.append(time.perf_counter() - begun)
    e2e, plain = statistics.median(e2e_all), statistics.median(plain_all)
    holder: dict[str, list[object]] = {}

    def read() -> None:
        holder.clear()  # the previous round's records are garbage before this round reads
        gc.collect()
        holder["records"] = list(read_jsonl(path))

    read_s, read_all = _median_time(read, args.rounds)
    records = holder["records"]

    def export() -> None:
        write_perfetto(records, STEP, False, out)  # type: ignore[arg-type]

    export_s, export_all = _median_time(export, args.rounds)
    with open(out, encoding="utf-8") as f:
        trace = json.load(f)
    events = [e for e in trace["traceEvents"] if e["ph"] != "M"]
    threads = [e for e in trace["traceEvents"] if e["name"] == "thread_name"]
    lanes = sum("(lane " in e["args"]["name"] for e in threads)
    other = trace["otherData"]
    facts = {
        "load_average_1min": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "samples": other["samples"],
        "spans_in_step": other["spans"],
        "spans_in_file": spans,
        "events": len(events),
        "tracks": len(threads),
        "lane_tracks": lanes,
        "processes": sum(e["name"] == "process_name" for e in trace["traceEvents"]),
        "verdicts": other["verdicts"],
        "trace_file_mb": round(size_mb, 1),
        "perfetto_json_mb": round(os.path.getsize(out) / 1e6, 1),
        "write_trace_file_s": round(made_s, 2),
        "end_to_end_s": round(e2e, 2),
        "end_to_end_runs_s": [round(x, 2) for x in e2e_all],
        "report_without_perfetto_s": round(plain, 2),
        "report_without_perfetto_runs_s": [round(x, 2) for x in plain_all],
        "read_s": round(read_s, 2),
        "read_runs_s": [round(x, 2) for x in read_all],
        "export_s": round(export_s, 2),
        "export_runs_s": [round(x, 2) for x in export_all],
    }
    print(json.dumps(facts, indent=1))
    if args.results:
        met = "met" if e2e <= 10 else "NOT met"
        print(
            f"""
## Perfetto export of one step (issue 19)

Machine: {machine()}. `python bench/perfetto_export.py --rounds {args.rounds}`: a trace file written by the
library's OTLP-JSON file exporter ({facts["trace_file_mb"]} MB, {spans:,} spans): step {STEP} with
{facts["samples"]:,} samples on {WORKERS} workers (3 generation turns, 1-3 parallel tool calls, a tool call,
a reward; 4 hung and 8 slow samples with watchdog snapshots) and the trainer's spans, plus a step of 256.

| measure | median of {args.rounds} | target |
|---|---|---|
| `report --step {STEP} --perfetto` end to end (fresh process: read, metrics, export) | {e2e:.2f} s | <= 10 s: {met} |
| the same `report --step {STEP}` without `--perfetto`, interleaved | {plain:.2f} s | |
| reading the file (`read_jsonl`) | {read_s:.2f} s | |
| the export alone (`write_perfetto`, records in memory) | {export_s:.2f} s | |

The step's file: {facts["events"]:,} events (one per span of the step: {facts["spans_in_step"]:,}),
{facts["tracks"]:,} tracks ({facts["lane_tracks"]:,} of them lanes for overlapping tool calls) in
{facts["processes"]} processes, {facts["perfetto_json_mb"]} MB; verdicts {facts["verdicts"]}.
Load average (1 min) before and after: {facts["load_average_1min"]} on 2 cores (other work shares the machine).
Runs (s): end to end {facts["end_to_end_runs_s"]}, without --perfetto {facts["report_without_perfetto_runs_s"]},
read {facts["read_runs_s"]}, export {facts["export_runs_s"]}.
"""
        )


if __name__ == "__main__":
    main()
