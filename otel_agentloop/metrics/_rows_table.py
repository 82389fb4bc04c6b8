"""A step's accumulated rows as a :class:`PhaseTable`, once per collect: the collect side of
:class:`~._accumulate.StepRows`, which fills its columns span by span.

Each ``array.array`` column becomes a numpy column without a copy element by element; the samples still running
are left out with their tool calls and engine turns; each sample's wall time is its ``rl.sample`` span's, else
its phase spans'. numpy is imported here, on the first collect (``._numpy``), never by the accumulation.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ._engine import ENGINE_FLOATS, EngineTurns
from ._numpy import LazyNumpy
from ._table import PhaseTable, bound_tools

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    EngineColumns = tuple[array[Any], ...]
    """The engine's facts of a step's turns: row, then each column of ``_engine.ENGINE_FLOATS``."""
else:
    np = LazyNumpy(globals(), "np")  # imported on first use, numpy.ma with it (fork safety: see ._numpy)

UNSET = -(1 << 62)
"""``npre_final`` of a row whose ``rl.sample`` span did not say (the sum of its turns' is used)."""
I64_MAX = (1 << 63) - 1
"""``span_start`` of a row with no phase span yet."""


class TableOfRows:
    """The columns of a step's rows (:class:`~._accumulate.StepRows` makes and fills them) and the table they
    make (:meth:`to_table`)."""

    __slots__ = ()

    rows: dict[tuple[int, int], int]
    index: array[int]
    rollout: array[int]
    total: tuple[array[int], array[int], array[int]]
    npre_sum: array[int]
    npre_first: array[int]
    npre_first_missing: array[int]
    npre_final: array[int]
    prompt_len: array[int]
    response_len: array[int]
    error: array[int]
    tid_hi: array[int]
    tid_lo: array[int]
    root_start: array[int]
    root_end: array[int]
    span_start: array[int]
    span_end: array[int]
    tools: dict[str, tuple[array[int], array[int]]]
    engine: EngineColumns
    versions: dict[int, tuple[int, ...]]
    in_order: bool

    def _top_tools(self) -> np.ndarray:
        """Each row's tool whose calls took the most nanoseconds (``""`` when none; ties to the first name)."""
        top = np.full(len(self.index), "", dtype=np.object_)
        spent: dict[int, int] = {}
        for tool, (rows, durations) in self.tools.items():
            per_row: dict[int, int] = {}
            for row, duration in zip(rows, durations, strict=True):
                per_row[row] = per_row.get(row, 0) + duration
            for row, total in per_row.items():
                if total > spent.get(row, -1):
                    spent[row] = total
                    top[row] = tool
        return top

    def _engine_turns(self, keep: np.ndarray | None) -> EngineTurns:
        """The engine turns of the rows in ``keep`` (all when ``None``), keyed by sample."""
        rows_a, *values = self.engine
        if not len(rows_a):
            return EngineTurns()
        rows = np.frombuffer(rows_a, dtype=np.int64)
        mask = np.ones(rows.size, np.bool_) if keep is None else keep[rows]
        index = np.frombuffer(self.index, dtype=np.int64)
        rollout = np.frombuffer(self.rollout, dtype=np.int64)
        columns = zip(ENGINE_FLOATS, values, strict=True)
        cols = {name: np.frombuffer(v, dtype=np.float64)[mask].copy() for name, v in columns}
        versions = np.empty(rows.size, np.object_)
        versions[:] = [()] * rows.size
        for t, turn in self.versions.items():
            versions[t] = turn
        return EngineTurns(index[rows[mask]], rollout[rows[mask]], **cols, policy_versions=versions[mask])

    def _walls(self) -> tuple[np.ndarray, np.ndarray]:
        """Each row's wall start and end: its ``rl.sample`` span's, else the earliest start and latest end of
        its phase spans (0 when none)."""
        if not len(self.index):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        root_start = np.frombuffer(self.root_start, dtype=np.int64)
        root_end = np.frombuffer(self.root_end, dtype=np.int64)
        span_start = np.frombuffer(self.span_start, dtype=np.int64)
        rooted = root_end > 0
        start = np.where(rooted, root_start, np.where(span_start == I64_MAX, 0, span_start))
        end = np.where(rooted, root_end, np.frombuffer(self.span_end, dtype=np.int64))
        return start, end

    def _tool_seconds(self, keep: npt.NDArray[np.bool_] | None) -> dict[str, npt.NDArray[np.float64]]:
        """Each tool's call durations in seconds, without the calls of rows ``keep`` leaves out."""
        tools: dict[str, npt.NDArray[np.float64]] = {}
        for tool, (call_rows, durations) in self.tools.items():
            seconds = np.frombuffer(durations, dtype=np.int64) / 1e9 if len(durations) else np.empty(0)
            if keep is not None and len(call_rows):
                seconds = seconds[keep[np.frombuffer(call_rows, dtype=np.int64)]]
            if seconds.size:
                tools[tool] = seconds
        return tools

    def to_table(
        self,
        exclude: Mapping[tuple[int, int], object] | None = None,
        late: Iterable[tuple[int, int]] = (),
        step_key: tuple[int | None, bool] | None = None,
    ) -> PhaseTable:
        """The accumulated rows as a table, without the samples in ``exclude`` (those still running) and their
        tool calls; rows whose sample is in ``late`` are flagged ``late``; ``step_key`` is recorded on it."""
        keep: np.ndarray | None = None
        if exclude:
            rows = [self.rows[key] for key in exclude if key in self.rows]
            if rows:
                keep = np.ones(len(self.index), dtype=np.bool_)
                keep[rows] = False
        late_col = np.zeros(len(self.index), dtype=np.bool_)
        for key in late:
            r = self.rows.get(key)
            if r is not None:
                late_col[r] = True

        def col(a: array[int], dtype: type) -> np.ndarray:
            out = np.frombuffer(a, dtype=dtype).copy() if len(a) else np.empty(0, dtype)
            return out if keep is None else out[keep]

        def col_object(a: np.ndarray) -> np.ndarray:
            return a if keep is None else a[keep]

        wall_start, wall_end = self._walls()
        if keep is not None:
            wall_start, wall_end = wall_start[keep], wall_end[keep]
        final = col(self.npre_final, np.int64)
        summed = col(self.npre_sum, np.int64) - col(self.npre_first_missing, np.int8)
        summed[col(self.npre_first, np.int64) < 0] = -1  # no generation span: unknown, like verl
        return PhaseTable(
            sample_index=col(self.index, np.int64),
            rollout_n=col(self.rollout, np.int64),
            generate_sequences=col(self.total[0], np.int64) / 1e9,
            tool_calls=col(self.total[1], np.int64) / 1e9,
            compute_score=col(self.total[2], np.int64) / 1e9,
            num_preempted=np.where(final != UNSET, final, summed),
            prompt_length=col(self.prompt_len, np.int64),
            response_length=col(self.response_len, np.int64),
            error=col(self.error, np.int8).astype(np.bool_),
            trace_id_hi=col(self.tid_hi, np.uint64),
            trace_id_lo=col(self.tid_lo, np.uint64),
            late=late_col if keep is None else late_col[keep],
            start_ns=wall_start,
            end_ns=wall_end,
            ordered=self.in_order,
            top_tool=col_object(self._top_tools()),
            tools=bound_tools(self._tool_seconds(keep)),
            step_key=step_key,
            engine=self._engine_turns(keep),
        )
