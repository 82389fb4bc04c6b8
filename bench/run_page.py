"""Issue 19 (4): the run page of a run of 1000 steps x 8,192 samples: build time and load time in Chromium.

The trace file is what the live side writes: OTLP-JSON lines (one line per export batch of 512 spans, encoded by
the file exporter's own encoder), each step's ``rl.step.summary`` span inside a batch of sample spans. The
summaries are real ones: :func:`summarize` on a synthetic 8,192-row :class:`PhaseTable` per step (gamma-
distributed phase times, a heavy tail in some steps, 4 tools, staleness). The full file (~41M spans, ~25 GB) does
not fit this shared machine's disk and time, so each step carries ``--lines-per-step`` batches of sample spans
(default 4: 2,048 spans, 5 % of a real step's ~41,000): the build time is measured on that file and the cost of
skipping sample lines is extrapolated to the full file from the measured scan rate (bytes per second), said so in
the output.

    .venv/bin/python bench/run_page.py [--steps 1000] [--samples 8192] [--lines-per-step 4]

The page is built by the real CLI (``otel-agentloop report --file F --run --html run.html``) in a fresh process;
the load time is from ``driver.get`` to the page's script having drawn everything (``body[data-ready]``), in
headless Chromium driven by selenium as tests/analysis/test_timeline_page.py does.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_agentloop import semconv as sc
from otel_agentloop.analysis._reading._decode import Skipped
from otel_agentloop.analysis._reading._summary_lines import lines_with, read_summary_lines
from otel_agentloop.export._otlp_json import encode_request
from otel_agentloop.metrics._summary import summarize
from otel_agentloop.metrics._table import PhaseTable, compute_metrics

ROOT = Path(__file__).resolve().parents[1]
BATCH = 512
SPANS_PER_SAMPLE = 5  # rl.sample, 2 generation turns, 1 tool call, 1 reward: a modest real sample
TOOLS = ("search", "python", "calculator", "sandbox")


def _table(n: int, rng: np.random.Generator, t0: int, slow: float) -> PhaseTable:
    gen = rng.gamma(2.0, 0.6, n)
    tool = rng.gamma(1.0, 0.3, n) * np.where(rng.random(n) < 0.01, slow, 1.0)
    score = rng.gamma(1.5, 0.02, n)
    start = t0 + rng.integers(0, 5 * 10**8, n)
    z = np.zeros(n, np.int64)
    return PhaseTable(
        sample_index=np.arange(n, dtype=np.int64) // 8,
        rollout_n=np.arange(n, dtype=np.int64) % 8,
        generate_sequences=gen,
        tool_calls=tool,
        compute_score=score,
        num_preempted=z,
        prompt_length=rng.integers(100, 2000, n),
        response_length=rng.integers(100, 8000, n),
        error=rng.random(n) < 0.002,
        trace_id_hi=rng.integers(1, 2**62, n, dtype=np.uint64),
        trace_id_lo=rng.integers(1, 2**62, n, dtype=np.uint64),
        start_ns=start,
        end_ns=start + ((gen + tool + score) * 1e9).astype(np.int64),
    )


def _spans(resource: Resource, make: int, summary_json: str | None = None, step: int = 0) -> list[ReadableSpan]:
    """``make`` realistic sample spans (and one summary span when given), as the SDK hands them to exporters."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("otel_agentloop")
    t = 1_800_000_000 * 10**9
    for k in range(make // SPANS_PER_SAMPLE):
        ident = {sc.RL_STEP: step, sc.RL_SAMPLE_INDEX: k // 8, sc.RL_ROLLOUT_N: k % 8, sc.RL_VALIDATE: False}
        root = tracer.start_span(sc.SAMPLE_SPAN, attributes=ident, start_time=t)
        ctx = trace.set_span_in_context(root)
        for turn in range(2):
            attrs = {**ident, sc.RL_PHASE: sc.GENERATE, "gen_ai.operation.name": "text_completion",
                     "gen_ai.request.model": "qwen2.5-7b-instruct", "gen_ai.usage.input_tokens": 812 + turn,
                     "gen_ai.usage.output_tokens": 377, "rl.turn": turn}  # fmt: skip
            tracer.start_span("text_completion qwen2.5-7b-instruct", ctx, attributes=attrs, start_time=t).end(t + 9)
        tool = {**ident, sc.RL_PHASE: sc.TOOL_CALLS, sc.GEN_AI_TOOL_NAME: TOOLS[k % 4], "gen_ai.operation.name":
                "execute_tool", "gen_ai.tool.call.id": f"call_{k:08x}"}  # fmt: skip
        tracer.start_span(f"execute_tool {TOOLS[k % 4]}", ctx, attributes=tool, start_time=t).end(t + 7)
        reward = {**ident, sc.RL_PHASE: sc.COMPUTE_SCORE}
        tracer.start_span("rl.reward", ctx, attributes=reward, start_time=t).end(t + 3)
        root.end(t + 20)
    if summary_json is not None:
        attrs = {sc.RL_STEP: step, sc.RL_VALIDATE: False, sc.RL_STEP_SUMMARY: summary_json}
        tracer.start_span(sc.STEP_SUMMARY_SPAN, attributes=attrs, start_time=t).end(t + 1)
    provider.shutdown()
    return list(exporter.get_finished_spans())


def write_run(path: Path, steps: int, samples: int, lines_per_step: int) -> dict[str, float]:
    resource = Resource.create({"service.name": "bench-run", sc.RL_RUN_ID: "bench", sc.RL_RUN_ATTEMPT: 1})
    sample_line, _ = encode_request(_spans(resource, BATCH), "\n")
    template = _spans(resource, BATCH - SPANS_PER_SAMPLE)  # the summary's batch: sample spans and the summary
    rng = np.random.default_rng(19)
    t_sum = t_enc = 0.0
    summary_bytes = 0
    with open(path, "wb") as f:
        for step in range(1, steps + 1):
            t = time.perf_counter()
            table = _table(samples, rng, 1_800_000_000 * 10**9 + step * 60 * 10**9, 1.0 + 30.0 * (step % 97 == 0))
            tools = {name: rng.gamma(1.0, 0.3, samples // 2) for name in TOOLS}
            s = summarize(table, compute_metrics(table), step, tools=tools, staleness=rng.integers(0, 3, samples))
            t_sum += time.perf_counter() - t
            t = time.perf_counter()
            text = s.to_json()
            summary_bytes += len(text)
            line, _ = encode_request(template + _spans(resource, 0, text, step), "\n")
            t_enc += time.perf_counter() - t
            for k in range(lines_per_step):
                if k == lines_per_step // 2:
                    f.write(line)  # the summary inside the step's batches, as the exporter interleaves it
                f.write(sample_line)
    return {
        "summarize_s": t_sum,
        "encode_s": t_enc,
        "sample_line_bytes": len(sample_line),
        "summary_bytes": summary_bytes / steps,
    }


def _skip_rate(path: Path) -> float:
    """Bytes per second of what ``read_summary_lines`` does to the lines without a summary (search, no parse)."""
    t = time.perf_counter()
    assert not any(True for _ in lines_with(str(path), b"a needle no line holds: \x00"))
    return path.stat().st_size / (time.perf_counter() - t)


def _load_in_chromium(page: Path, rounds: int = 3) -> list[float]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    browser, driver_bin = shutil.which("chromium"), shutil.which("chromedriver")
    if not (browser and driver_bin):
        raise SystemExit("needs Debian's chromium + chromium-driver (scripts/install_chromium.sh)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1500,1000",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=driver_bin), options=options)
    times = []
    try:
        for _ in range(rounds):
            driver.get("about:blank")
            t = time.perf_counter()
            driver.get(page.resolve().as_uri())
            WebDriverWait(driver, 60).until(lambda d: d.execute_script("return document.body.dataset.ready") == "true")
            times.append(time.perf_counter() - t)
            rows = driver.execute_script("return document.querySelectorAll('#steps tr.step-row').length")
            assert rows > 0, "the page drew no step"
    finally:
        driver.quit()
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--lines-per-step", type=int, default=4, help="sample-span batches (512 spans) per step")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="oal-run-page-"))
    try:
        trace_file = work / "run.jsonl"
        t = time.perf_counter()
        made = write_run(trace_file, args.steps, args.samples, args.lines_per_step)
        size = trace_file.stat().st_size
        print(f"wrote {size / 2**30:.2f} GiB in {time.perf_counter() - t:.0f} s "
              f"(summarize {made['summarize_s']:.1f} s for {args.steps} steps x {args.samples} samples; "
              f"summary JSON {made['summary_bytes']:.0f} B per step)")  # fmt: skip

        t = time.perf_counter()
        n = sum(1 for _ in read_summary_lines(str(trace_file), Skipped()))
        scan = time.perf_counter() - t
        assert n == args.steps, n
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        page = work / "run.html"
        t = time.perf_counter()
        cmd = [
            sys.executable,
            "-m",
            "otel_agentloop",
            "report",
            "--file",
            str(trace_file),
            "--run",
            "--html",
            str(page),
        ]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        build = time.perf_counter() - t
        print(out.stdout.strip())
        loads = _load_in_chromium(page)

        # extrapolation to the full file: every sample span of every step on disk
        full_spans = args.steps * args.samples * SPANS_PER_SAMPLE
        span_bytes = made["sample_line_bytes"] / BATCH
        full_bytes = full_spans * span_bytes
        skip_rate = _skip_rate(trace_file)  # bytes per second through a sample line: read, searched, not parsed
        full_build = build + (full_bytes - size) / skip_rate
        rows = [
            ("trace file here", f"{size / 2**30:.2f} GiB, {args.steps * args.lines_per_step * BATCH:,} sample spans + "
             f"{args.steps} summaries"),
            ("summary scan (read_summary_lines)", f"{scan:.2f} s"),
            ("run page build (CLI, fresh process)", f"{build:.2f} s (target <= 30 s)"),
            ("run page size", f"{page.stat().st_size / 2**20:.2f} MiB"),
            ("page load in Chromium (3 loads)", ", ".join(f"{x:.2f}" for x in loads) + " s (target <= 3 s)"),
            ("skipping sample lines (mapped search)", f"{skip_rate / 2**30:.2f} GiB/s (warm page cache)"),
            ("full file, extrapolated",
             f"{full_spans / 1e6:.0f}M spans x {span_bytes:.0f} B = {full_bytes / 2**30:.1f} GiB"),
            ("build on the full file, extrapolated", f"{full_build:.0f} s (+{(full_bytes - size) / skip_rate:.0f} s of "
             "skipping sample lines at the measured rate; the disk's read rate bounds it on a cold cache)"),
        ]  # fmt: skip
        print(f"\nMachine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
              f"Python {platform.python_version()}, {platform.system()} {platform.release()}")  # fmt: skip
        print("| measure | value |\n|---|---|")
        for name, value in rows:
            print(f"| {name} | {value} |")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
