"""Why a sample took its time, in words: the one rule (:func:`cause`) that ``report``, the pages, ``--compare``
and Perfetto print, and :func:`sample_causes`, which applies it to a step's table."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from .. import semconv as sc
from ._engine import PERCENTILES, EngineSample
from ._numpy import LazyNumpy
from ._table import PhaseTable

if TYPE_CHECKING:
    import numpy as np
else:
    np = LazyNumpy(globals(), "np")

QUEUE_SHARE = 0.25
"""A sample *waited in the engine queue* when its turns queued for at least this share of its generation time."""
SLOW_DECODE = 2.0
"""A sample *decoded K times slower* when the step's median decode speed is at least this many times its own."""
MIN_QUEUE_S = 0.01
"""...and for at least this many seconds (shorter waits are the scheduler's normal step, not a cause)."""
LONG_OUTPUT = 1.5
"""A sample *generated N tokens* when its output reaches the step's p90 and this many times the step's median."""
BUSY_ENGINE = 1.5
"""A slow decode is said to be *while the engine ran N sequences* when the sample's turns ran, on average, among
at least this many times the step's median turn's running sequences."""


class StepEngine(NamedTuple):
    """What a sample's engine facts are compared with: the step's median decode speed (tokens/s, the p50 of
    ``agent_loop/engine/decode_tokens_per_s``) and the p50/p90/p99 of its samples' output tokens (per sample,
    summed over its turns)."""

    median_tokens_per_s: float | None
    tokens_p50: float
    tokens_p90: float
    tokens_p99: float
    running_median: float | None = None
    """The median of the turns' ``rl.engine.batch.running.mean`` (``None``: no turn carries it)."""
    cached_median: float | None = None
    """The median of the turns' ``gen_ai.usage.cache_read.input_tokens`` (``None``: no turn carries it)."""


def cause(
    *,
    generate_s: float,
    tool_s: float,
    score_s: float,
    tool: str = "",
    engine: EngineSample | None = None,
    step: StepEngine | None = None,
) -> str:
    """Why a sample took its time, in words: the one rule (``report``, the pages, ``--compare``, Perfetto).

    The phase that took most of its time first: ``reward`` when scoring took longer than generation and tools;
    ``tool X`` (its most expensive tool) when tool calls took longer than generation. Generation, with the
    engine's facts (``engine``, ``step``), the first rule that holds (the table is in docs/engines.md, "Causes"):

    - ``aborted by N weight syncs, resumed under policy A and B``: its turns' engine requests were aborted N
      times and resumed (partial rollouts; ``aborted N times`` when no later policy version is known);
    - ``preempted N times at K % KV cache``: the engine preempted its requests (``rl.engine.preemptions``) while
      the KV cache was at most K % full (its turns' ``rl.engine.kv_cache.usage.max``);
    - ``waited N s in the engine queue``: its turns queued for >= :data:`QUEUE_SHARE` (25%) of its generation
      time and >= :data:`MIN_QUEUE_S` (10 ms) (the engine was saturated: more concurrent requests than
      ``max_num_seqs``, or preemption);
    - ``decoded K times slower than the step's median``: its decode speed (its tokens / its decode seconds) is
      <= 1 / :data:`SLOW_DECODE` (half) the step's median turn's (a straggler replica, long-context attention);
      said ``decoded Kx slower than the step's median while the engine ran N sequences (step median M)`` when its
      turns ran among >= :data:`BUSY_ENGINE` times the step's median running sequences;
    - ``generated N tokens (p99 of the step) at normal speed``: its output tokens reach the step's p90 (the label
      says p99 when they reach it) and >= :data:`LONG_OUTPUT` (1.5x) the step's median (a long response: the
      policy's, not the system's);
    - ``no prefix-cache hit on N prompt tokens (turn median M cached)``: some of its turns had no prompt token
      from the prefix cache while the step's median turn had M > 0;
    - otherwise ``generation N s`` (no engine facts, or none of these stands out).
    """
    if score_s > generate_s and score_s >= tool_s:
        return f"reward {score_s:.2f} s"
    if tool_s > generate_s:
        return f"tool {tool} {tool_s:.2f} s" if tool else f"tools {tool_s:.2f} s"
    if engine is not None and step is not None:
        return _engine_cause(engine, step, generate_s) or f"generation {generate_s:.2f} s"
    return f"generation {generate_s:.2f} s"


def _engine_cause(engine: EngineSample, step: StepEngine, generate_s: float) -> str | None:
    """The first of :func:`cause`'s engine rules that holds for ``engine`` (``None``: none)."""
    if engine.aborts > 0:
        resumed = engine.policy_versions[1:]
        if resumed:
            syncs = "weight sync" if engine.aborts == 1 else "weight syncs"
            return f"aborted by {engine.aborts} {syncs}, resumed under policy {_and(resumed)}"
        return f"aborted {_times(engine.aborts)}"
    if engine.preemptions > 0:
        at = f" at {engine.kv_max * 100:.0f} % KV cache" if engine.kv_max is not None else ""
        return f"preempted {_times(engine.preemptions)}{at}"
    if engine.queue_s >= MIN_QUEUE_S and engine.queue_s >= QUEUE_SHARE * generate_s:
        return f"waited {engine.queue_s:.2f} s in the engine queue"
    tps, median = engine.tokens_per_s, step.median_tokens_per_s
    if tps is not None and median is not None and tps > 0 and tps * SLOW_DECODE <= median:
        times = median / tps
        running, usual = engine.running_mean, step.running_median
        if running is not None and usual is not None and usual > 0 and running >= BUSY_ENGINE * usual:
            return (
                f"decoded {times:.1f}x slower than the step's median while the engine ran {running:.0f} sequences"
                f" (step median {usual:.0f})"
            )
        return f"decoded {times:.1f} times slower than the step's median ({tps:.0f} vs {median:.0f} tokens/s)"
    tokens = engine.output_tokens
    if tokens > 0 and tokens >= step.tokens_p90 and tokens >= LONG_OUTPUT * step.tokens_p50:
        rank = "p99" if tokens >= step.tokens_p99 else "p90"
        return f"generated {tokens} tokens ({rank} of the step) at normal speed"
    cached = step.cached_median
    if engine.missed_prompt_tokens > 0 and cached is not None and cached > 0:
        return (
            f"no prefix-cache hit on {engine.missed_prompt_tokens:,} prompt tokens (turn median {cached:,.0f} cached)"
        )
    return None


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _and(values: tuple[int, ...]) -> str:
    """``14``, ``14 and 15``, ``13, 14 and 15``."""
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def sample_causes(
    table: PhaseTable, metrics: Mapping[str, float], keys: Iterable[tuple[int, int]]
) -> dict[tuple[int, int], str]:
    """:func:`cause` of each sample of ``keys`` that is in ``table`` (``metrics``: ``compute_metrics(table)``).
    Only for a step where some turn carries the engine's timing: without it every view stays as it was (the
    phase mix beside the slowest sample already says as much as the phases alone can)."""
    if not len(table.engine):
        return {}
    t = table.canonical()
    rows = {(int(t.sample_index[i]), int(t.rollout_n[i])): i for i in range(len(t))}
    tokens = t.engine.tokens_per_sample()
    p50, p90, p99 = (float(v) for v in np.percentile(tokens, PERCENTILES))
    tps_key = f"{sc.METRIC_PREFIX}/{sc.ENGINE_METRIC}/{sc.ENGINE_DECODE_TPS}/p50"
    engine = t.engine
    step = StepEngine(
        metrics.get(tps_key), p50, p90, p99, engine.median("running_mean"), engine.median("cached_tokens")
    )
    out: dict[tuple[int, int], str] = {}
    for key in keys:
        i = rows.get(key)
        if i is None:
            continue
        out[key] = cause(
            generate_s=float(t.generate_sequences[i]),
            tool_s=float(t.tool_calls[i]),
            score_s=float(t.compute_score[i]),
            tool=str(t.top_tool[i]),
            engine=t.engine.of_sample(key),
            step=step,
        )
    return out
