"""Printing a step's metrics, and the samples still running, the way a person reads them."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from . import semconv as sc

_PHASES = ("generate_sequences", "tool_calls", "compute_score")


def metrics_table(metrics: Mapping[str, float], title: str = "") -> str:
    """verl's per-phase keys as a grid (phase x min/mean/p50/p90/p99/max, seconds), then the slowest sample."""
    p = sc.METRIC_PREFIX
    cols = ("min", "mean", "p50", "p90", "p99", "max")
    lines = [title] if title else []
    lines.append(f"{'phase (s)':<20}" + "".join(f"{c:>9}" for c in cols))
    for phase in _PHASES:
        cells = [metrics.get(f"{p}/{phase}/{c}") for c in cols]
        lines.append(f"{phase:<20}" + "".join(f"{c:9.3f}" if c is not None else f"{'-':>9}" for c in cells))
    pre = [metrics.get(f"{p}/num_preempted/{c}") for c in ("min", "mean", "max")]
    if all(v is not None for v in pre):
        lines.append(f"{'num_preempted':<20}{pre[0]:9.0f}{pre[1]:9.2f}{'':27}{pre[2]:9.0f}")
    if f"{p}/slowest/sample_index" in metrics:
        s = f"{p}/slowest/"
        parts = [f"sample {metrics[s + 'sample_index']:.0f}", f"rollout {metrics.get(s + 'rollout_n', -1):.0f}"]
        parts += [f"{k} {metrics[s + k]:.3f}s" for k in _PHASES]
        parts.append(f"num_preempted {metrics[s + 'num_preempted']:.0f}")
        for k in ("prompt_length", "response_length"):
            if s + k in metrics:
                parts.append(f"{k} {metrics[s + k]:.0f}")
        lines.append("slowest: " + ", ".join(parts))
    lines.append(f"samples: {metrics.get(p + '/num_samples', 0):.0f}")
    return "\n".join(lines)


def inflight_lines(samples: Sequence[Any], top: int = 3) -> list[str]:
    """The live view of running samples (``InflightSample``\\ s, any order): counts by phase (tools by name),
    then the ``top`` oldest, overdue ones flagged."""
    by_phase: dict[str, int] = {}
    tools: dict[str, int] = {}
    for s in samples:
        by_phase[s.phase] = by_phase.get(s.phase, 0) + 1
        if s.tool:
            tools[s.tool] = tools.get(s.tool, 0) + 1
    parts = []
    for phase in (*_PHASES, "other"):
        n = by_phase.get(phase, 0)
        if phase == sc.TOOL_CALLS and tools:
            parts.append(f"{phase} {n} ({', '.join(f'{t} {c}' for t, c in sorted(tools.items()))})")
        elif n or phase != "other":
            parts.append(f"{phase} {n}")
    lines = [f"in flight: {len(samples):>4}  " + " | ".join(parts)]
    for s in sorted(samples, key=lambda s: -s.sample_age_s)[:top]:
        where = f"{s.phase}{' ' + s.tool if s.tool else ''} {s.phase_age_s:.1f}s"
        lines.append(
            f"  oldest: {s.label():<28} {where:<32} sample {s.sample_age_s:6.1f}s  trace {s.trace_id}"
            f"{'  OVERDUE' if s.overdue else ''}"
        )
    return lines


def info_stream(args: Any) -> TextIO:
    """Where lines for people go: stderr under ``--json``, so stdout holds only the JSON document."""
    return sys.stderr if getattr(args, "json", False) else sys.stdout
