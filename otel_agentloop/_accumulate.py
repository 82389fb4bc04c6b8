"""Per-step, per-sample accumulation of phase time: exact union of intervals, updated span by span.

A phase's time for one sample is the wall time covered by that sample's spans of that phase: parallel
tool calls overlap and count once (what verl's timer around ``asyncio.gather`` measures), sequential turns
add up. Each (sample, phase) keeps its disjoint blocks sorted; the common cases (a span after the last
block, or overlapping only it) are O(1), the rest a short scan. Totals are kept in integer nanoseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import semconv as sc
from ._table import PhaseTable

PHASE_INDEX: Mapping[str, int] = {name: i for i, name in enumerate(sc.PHASES)}
_GENERATE = PHASE_INDEX[sc.GENERATE]
_UNSET = -(1 << 62)


def add_interval(blocks: list[int], start: int, end: int) -> int:
    """Merge ``[start, end]`` into ``blocks`` (flat ``[s0, e0, s1, e1, ...]``, sorted, disjoint).

    Returns how much the covered length grew.
    """
    if not blocks or start > blocks[-1]:
        blocks += (start, end)
        return end - start
    if start >= blocks[-2]:  # overlaps the last block only
        if end > blocks[-1]:
            grown = end - blocks[-1]
            blocks[-1] = end
            return grown
        return 0
    # General case: find the blocks that touch [start, end] and fuse them.
    n = len(blocks) // 2
    lo = 0
    while lo < n and blocks[2 * lo + 1] < start:
        lo += 1
    hi = lo
    covered = 0
    new_start, new_end = start, end
    while hi < n and blocks[2 * hi] <= end:
        covered += blocks[2 * hi + 1] - blocks[2 * hi]
        new_start = min(new_start, blocks[2 * hi])
        new_end = max(new_end, blocks[2 * hi + 1])
        hi += 1
    blocks[2 * lo: 2 * hi] = (new_start, new_end)
    return (new_end - new_start) - covered


class StepRows:
    """Accumulated facts of one step: one row per sample, created on the sample's first span."""

    __slots__ = ("max_rows", "rows", "index", "rollout", "total", "blocks", "npre_sum", "npre_first",
                 "npre_first_missing", "npre_final", "prompt_len", "response_len", "error", "trace_id",
                 "dropped")

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self.rows: dict[tuple[int, int], int] = {}
        self.index: list[int] = []
        self.rollout: list[int] = []
        self.total: tuple[list[int], ...] = ([], [], [])
        self.blocks: tuple[list[list[int] | None], ...] = ([], [], [])
        self.npre_sum: list[int] = []
        self.npre_first: list[int] = []  # start of the earliest generation span; -1 when none yet
        self.npre_first_missing: list[bool] = []
        self.npre_final: list[int] = []  # set on the root span; _UNSET when not
        self.prompt_len: list[int] = []
        self.response_len: list[int] = []
        self.error: list[bool] = []
        self.trace_id: list[int] = []
        self.dropped = 0

    def __len__(self) -> int:
        return len(self.index)

    def row(self, index: int, rollout: int) -> int:
        """Row of sample (index, rollout); -1 when the step is full (the span is dropped and counted)."""
        key = (index, rollout)
        r = self.rows.get(key)
        if r is not None:
            return r
        r = len(self.index)
        if r >= self.max_rows:
            self.dropped += 1
            return -1
        self.rows[key] = r
        self.index.append(index)
        self.rollout.append(rollout)
        for p in range(3):
            self.total[p].append(0)
            self.blocks[p].append(None)
        self.npre_sum.append(0)
        self.npre_first.append(-1)
        self.npre_first_missing.append(False)
        self.npre_final.append(_UNSET)
        self.prompt_len.append(-1)
        self.response_len.append(-1)
        self.error.append(False)
        self.trace_id.append(0)
        return r

    def add_phase(self, r: int, p: int, start: int, end: int, attrs: Mapping[str, Any]) -> None:
        blocks = self.blocks[p][r]
        if blocks is None:
            self.blocks[p][r] = [start, end]
            self.total[p][r] += end - start
        else:
            self.total[p][r] += add_interval(blocks, start, end)
        if p == _GENERATE:
            # verl: the first turn sets num_preempted (None -> -1), later turns add (None -> 0).
            value = attrs.get(sc.RL_NUM_PREEMPTED)
            if isinstance(value, int):
                self.npre_sum[r] += value
            first = self.npre_first[r]
            if first < 0 or start < first:
                self.npre_first[r] = start
                self.npre_first_missing[r] = not isinstance(value, int)

    def add_root(self, r: int, attrs: Mapping[str, Any]) -> None:
        value = attrs.get(sc.RL_NUM_PREEMPTED)
        if isinstance(value, int):
            self.npre_final[r] = value
        value = attrs.get(sc.RL_PROMPT_LENGTH)
        if isinstance(value, int):
            self.prompt_len[r] = value
        value = attrs.get(sc.RL_RESPONSE_LENGTH)
        if isinstance(value, int):
            self.response_len[r] = value

    def _num_preempted(self) -> np.ndarray:
        final = np.array(self.npre_final, dtype=np.int64)
        summed = np.array(self.npre_sum, dtype=np.int64) - np.array(self.npre_first_missing, dtype=np.int64)
        summed[np.array(self.npre_first, dtype=np.int64) < 0] = -1  # no generation span: unknown
        return np.where(final != _UNSET, final, summed)

    def to_table(self) -> PhaseTable:
        return PhaseTable(
            sample_index=np.array(self.index, dtype=np.int64),
            rollout_n=np.array(self.rollout, dtype=np.int64),
            generate_sequences=np.array(self.total[0], dtype=np.float64) / 1e9,
            tool_calls=np.array(self.total[1], dtype=np.float64) / 1e9,
            compute_score=np.array(self.total[2], dtype=np.float64) / 1e9,
            num_preempted=self._num_preempted(),
            prompt_length=np.array(self.prompt_len, dtype=np.int64),
            response_length=np.array(self.response_len, dtype=np.int64),
            error=np.array(self.error, dtype=np.bool_),
            trace_id=np.array(self.trace_id, dtype=np.object_),
        )
