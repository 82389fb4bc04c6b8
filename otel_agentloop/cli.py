"""``otel-agentloop``: run the simulated agent loop (``simulate``) or rebuild a step from stored traces (``report``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence

from . import _context as ctx
from ._configure import configure
from ._display import metrics_table
from ._progress import Progress
from ._timeline import TimelineRecorder
from ._waterfall import render_png, render_text
from .simulate import SimConfig, run_samples


def _simulate(args: argparse.Namespace) -> int:
    if args.workers:
        from ._ray_sim import simulate_on_ray  # needs the ``ray`` extra

        return simulate_on_ray(args)
    cfg = SimConfig(prompts=args.prompts, rollout_n=args.rollout_n, max_turns=args.max_turns,
                    time_scale=args.time_scale, seed=args.seed)
    timelines = TimelineRecorder()
    handle = configure(args.service_name, endpoint=args.endpoint, protocol=args.protocol, file=args.file,
                       trace_per=args.trace_per, processors=[timelines])
    print(f"otel-agentloop simulate: {args.steps} steps x {len(cfg.work())} samples; traces -> {handle.description}")
    results = []
    try:
        for step in range(1, args.steps + 1):
            bar = Progress(len(cfg.work()), f"step {step}", enabled=not args.quiet)

            async def run(step: int = step, bar: Progress = bar) -> list[float | BaseException]:
                with ctx.step(step):
                    return await run_samples(cfg, step, cfg.work(), on_done=bar.advance)

            outcomes = asyncio.run(run())
            bar.close()
            metrics = handle.metrics.collect(step)
            failed = sum(isinstance(o, BaseException) for o in outcomes)
            spans = timelines.pop(step)
            results.append({"step": step, "metrics": dict(metrics), "slowest_trace_id": metrics.slowest_trace_id,
                            "failed_samples": failed})
            if args.json:
                continue
            print()
            print(metrics_table(metrics, title=f"== step {step}: agent_loop metrics ({failed} failed samples)"))
            if metrics.slowest_sample is not None and metrics.slowest_sample in spans:
                index, rollout = metrics.slowest_sample
                title = (f"slowest sample {index} (rollout {rollout}), trace {metrics.slowest_trace_id}")
                print()
                print(render_text(spans[metrics.slowest_sample], title=title))
                if args.png:
                    print(f"waterfall written to {render_png(spans[metrics.slowest_sample], args.png, title=title)}")
    finally:
        flushed = handle.force_flush(args.flush_timeout)
        stats = handle.stats
        handle.shutdown(args.flush_timeout)
    if args.json:
        print(json.dumps(results, indent=1))
    print(f"\nspans exported: {stats['exported']}, dropped: {stats['dropped']}, failed: {stats['failed']}"
          f"{'' if flushed else ' (flush timed out)'}; traces -> {handle.description}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="otel-agentloop", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="run the simulated agent loop and print per-step metrics")
    sim.add_argument("--steps", type=int, default=3)
    sim.add_argument("--prompts", type=int, default=16, help="prompts per step")
    sim.add_argument("--rollout-n", type=int, default=4, help="rollouts per prompt")
    sim.add_argument("--workers", type=int, default=0,
                     help="run as a manager plus N Ray actor workers on a local Ray cluster (0: in-process)")
    sim.add_argument("--max-turns", type=int, default=3)
    sim.add_argument("--time-scale", type=float, default=1.0, help="multiply every simulated latency")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--service-name", default="otel-agentloop-sim")
    sim.add_argument("--endpoint", help="OTLP endpoint (default: OTEL_EXPORTER_OTLP_ENDPOINT, else a file)")
    sim.add_argument("--protocol", choices=("grpc", "http/protobuf"))
    sim.add_argument("--file", help="also write OTLP-JSON lines here")
    sim.add_argument("--trace-per", choices=("sample", "step"))
    sim.add_argument("--png", help="write the slowest sample's waterfall as a PNG")
    sim.add_argument("--json", action="store_true", help="print the metric dicts as JSON")
    sim.add_argument("--quiet", action="store_true", help="no progress bar")
    sim.add_argument("--flush-timeout", type=float, default=10.0)
    sim.set_defaults(func=_simulate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
