"""Union of intervals, verl's formula on tables, bounds of the processor."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest

from otel_agentloop import semconv as sc
from otel_agentloop.metrics import PhaseMetricsProcessor, PhaseTable, compute_metrics
from otel_agentloop.metrics._accumulate import add_interval


def brute_union(intervals: list[tuple[int, int]]) -> int:
    covered = 0
    cur_s = cur_e = None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                covered += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return covered + (cur_e - cur_s if cur_e is not None else 0)


@pytest.mark.parametrize("seed", range(40))
def test_incremental_union_equals_brute_force_in_any_order(seed: int) -> None:
    rng = random.Random(seed)
    intervals = []
    for _ in range(rng.randint(1, 12)):
        s = rng.randint(0, 100)
        intervals.append((s, s + rng.randint(0, 30)))
    order = intervals[:]
    rng.shuffle(order)
    blocks: list[int] = []
    total = sum(add_interval(blocks, s, e) for s, e in order)
    assert total == brute_union(intervals)
    assert blocks == sorted(blocks)


def _table(gen, tool, score, npre=None, plen=None, rlen=None, index=None) -> PhaseTable:
    n = len(gen)
    return PhaseTable(
        sample_index=np.array(index if index is not None else range(n), dtype=np.int64),
        rollout_n=np.zeros(n, dtype=np.int64),
        generate_sequences=np.array(gen, dtype=float),
        tool_calls=np.array(tool, dtype=float),
        compute_score=np.array(score, dtype=float),
        num_preempted=np.array(npre if npre is not None else [-1] * n, dtype=np.int64),
        prompt_length=np.array(plen if plen is not None else [-1] * n, dtype=np.int64),
        response_length=np.array(rlen if rlen is not None else [-1] * n, dtype=np.int64),
        error=np.zeros(n, dtype=bool),
        trace_id_hi=np.zeros(n, dtype=np.uint64),
        trace_id_lo=np.zeros(n, dtype=np.uint64),
    )


def test_compute_metrics_slowest_includes_score_and_lengths_only_when_known() -> None:
    # sample 1 has the largest generation, sample 2 the largest gen+tool+score
    t = _table([1.0, 3.0, 2.0], [0.5, 0.0, 0.5], [0.1, 0.1, 1.0], npre=[0, 2, 1], plen=[5, 6, -1], rlen=[7, 8, -1])
    m = compute_metrics(t)
    assert m["agent_loop/slowest/sample_index"] == 2
    assert m["agent_loop/slowest/compute_score"] == 1.0
    assert "agent_loop/slowest/prompt_length" not in m and "agent_loop/slowest/response_length" not in m
    assert m["agent_loop/num_preempted/mean"] == 1.0
    assert m["agent_loop/generate_sequences/p50"] == 2.0
    assert m["agent_loop/generate_sequences/p90"] == pytest.approx(np.percentile([1, 3, 2], 90))
    assert m.slowest_trace_id is None
    assert compute_metrics(PhaseTable.empty()) == {"agent_loop/num_samples": 0.0}


def test_metrics_are_independent_of_row_order_and_splits() -> None:
    rng = np.random.default_rng(0)
    n = 101
    t = _table(
        rng.random(n),
        rng.random(n),
        rng.random(n),
        npre=rng.integers(-1, 3, n),
        plen=rng.integers(1, 9, n),
        rlen=rng.integers(1, 9, n),
    )
    whole = compute_metrics(t)
    perm = rng.permutation(n)
    parts = np.array_split(perm, 4)
    columns = [f for f in t.__dataclass_fields__ if f not in ("ordered", "tools", "step_key", "engine")]
    pieces = [PhaseTable(**{f: getattr(t, f)[p] for f in columns}) for p in parts]
    merged = compute_metrics(PhaseTable.concat(pickle.loads(pickle.dumps(pieces))))
    assert merged == whole


def test_processor_bounds_and_release() -> None:
    proc = PhaseMetricsProcessor(max_steps=2, max_samples_per_step=3)

    def feed(step: int, index: int) -> None:
        attrs = {sc.RL_PHASE: sc.GENERATE, sc.RL_STEP: step, sc.RL_SAMPLE_INDEX: index, sc.RL_VALIDATE: False}
        proc.ingest("g", attrs, 0, 1_000_000, 1, False)

    for i in range(5):
        feed(1, i)
    feed(2, 0)
    feed(3, 0)  # evicts step 1
    assert proc.open_steps() == [(2, False), (3, False)]
    assert proc.stats == {
        "spans_outside_sample": 0,
        "steps_evicted": 1,
        "samples_dropped": 2,
        "samples_in_flight": 0,
        "samples_in_flight_total": 0,
        "spans_after_collect": 0,
        "late_samples_evicted": 0,
    }
    assert proc.collect(1)["agent_loop/num_samples"] == 0
    m = proc.collect(2)
    assert m["agent_loop/generate_sequences/max"] == pytest.approx(0.001)
    assert proc.open_steps() == [(3, False)]
    with pytest.raises(ValueError, match="max_steps"):
        PhaseMetricsProcessor(max_steps=0)


def test_num_preempted_follows_verl_rules() -> None:
    proc = PhaseMetricsProcessor()

    def gen(index: int, start: int, npre: int | None) -> None:
        attrs = {sc.RL_PHASE: sc.GENERATE, sc.RL_STEP: 1, sc.RL_SAMPLE_INDEX: index}
        if npre is not None:
            attrs[sc.RL_NUM_PREEMPTED] = npre
        proc.ingest("g", attrs, start, start + 10, 1, False)

    gen(0, 0, None)  # first turn unknown -> -1, later +2 -> 1 (verl's arithmetic)
    gen(0, 20, 2)
    gen(1, 20, 1)  # arrives first but started later: first turn is the one at t=0 (value 3)
    gen(1, 0, 3)
    gen(2, 0, None)  # never known -> -1
    proc.ingest(sc.SAMPLE_SPAN, {sc.RL_STEP: 1, sc.RL_SAMPLE_INDEX: 3, sc.RL_NUM_PREEMPTED: 7}, 0, 5, 1, False)
    table = proc.take(1)
    got = dict(zip(table.sample_index.tolist(), table.num_preempted.tolist(), strict=True))
    assert got == {0: 1, 1: 4, 2: -1, 3: 7}
