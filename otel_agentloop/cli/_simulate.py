"""``otel-agentloop simulate``: its flags, and the run (in-process, or on Ray with ``--workers``)."""

from __future__ import annotations

import argparse

from ..config._settings import DEFAULT_FILE, PROTOCOLS
from ..demo._main import simulate as simulate_in_process
from ..demo._trainer import (
    MISBEHAVE_FROM_STEP,
    SLOWDOWN,
)
from ._args import Parser, ShowDefaults, count, number, output_file, trace_path


def _simulate(args: argparse.Namespace) -> int:
    if args.workers:
        from ..demo._ray import simulate_on_ray  # needs the ``ray`` extra

        return simulate_on_ray(args)
    return simulate_in_process(args)


def add_simulate_parser(sub: argparse._SubParsersAction[Parser]) -> None:
    """``simulate`` and its flags under ``sub``."""
    sim = sub.add_parser(
        "simulate", help="run the simulated agent loop and print per-step metrics", formatter_class=ShowDefaults
    )
    _add_shape_arguments(sim)
    _add_output_arguments(sim)
    sim.set_defaults(func=_simulate)


def _add_shape_arguments(sim: argparse.ArgumentParser) -> None:
    """The simulated run's shape: steps, prompts, rollouts, workers, turns, latencies."""
    sim.add_argument("--steps", type=count(1), default=3, help="training steps")
    sim.add_argument("--prompts", type=count(1), default=16, help="prompts per step")
    sim.add_argument("--rollout-n", type=count(1), default=4, help="rollouts per prompt")
    sim.add_argument(
        "--workers",
        type=count(0, 1024),
        default=0,
        help="run as a manager plus N Ray actor workers on a local Ray cluster (0: in-process)",
    )
    sim.add_argument("--max-turns", type=count(1), default=3, help="generation turns per sample, at most")
    sim.add_argument("--time-scale", type=number(0, 1000), default=1.0, help="multiply every simulated latency")
    sim.add_argument("--seed", type=int, default=0, help="random seed of the simulated latencies")
    sim.add_argument("--service-name", default="otel-agentloop-sim", help="the traces' service.name")


def _add_output_arguments(sim: argparse.ArgumentParser) -> None:
    """Where the spans go and what is printed; validation, misbehaviour and the live view."""
    sim.add_argument("--endpoint", help="OTLP endpoint (default: OTEL_EXPORTER_OTLP_ENDPOINT, else a file)")
    sim.add_argument(
        "--protocol", choices=PROTOCOLS, help="OTLP protocol (default: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc)"
    )
    sim.add_argument(
        "--file",
        type=trace_path,
        help="also write OTLP-JSON lines here: a directory rolled per step, or one file for a path ending .jsonl "
        f"or .json (default: OTEL_AGENTLOOP_FILE; without an endpoint, ./{DEFAULT_FILE})",
    )
    sim.add_argument(
        "--trace-per",
        choices=("sample", "step"),
        help="one trace per sample or per step (default: OTEL_AGENTLOOP_TRACE_PER, else sample)",
    )
    sim.add_argument("--png", type=output_file, help="write the slowest sample's waterfall as a PNG")
    sim.add_argument("--json", action="store_true", help="print the metric dicts as JSON")
    sim.add_argument("--quiet", action="store_true", help="no progress bar")
    sim.add_argument("--flush-timeout", type=number(0, 3600), default=10.0, help="seconds")
    sim.add_argument("--val-every", type=count(0), default=2, help="a validation pass every N steps (0: none)")
    sim.add_argument("--val-generations", type=count(0), default=4, help="validation generations to keep")
    sim.add_argument(
        "--misbehave",
        action="store_true",
        help=f"from step {MISBEHAVE_FROM_STEP}: KL spike, a {SLOWDOWN:.0f}x slower rollout, a hung and a "
        "slow tool call (reported by the watchdog, classified hung/slow)",
    )
    sim.add_argument(
        "--live-every",
        type=number(0.1, 3600),
        default=5.0,
        help="seconds between live-view lines when stderr is not a terminal",
    )
