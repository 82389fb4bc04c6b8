"""Printing a step's metrics the way a person reads them."""

from __future__ import annotations

from collections.abc import Mapping

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
