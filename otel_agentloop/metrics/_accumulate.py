"""Per-step, per-sample accumulation of phase time: exact union of intervals, updated span by span.

A phase's time for one sample is the wall time covered by that sample's spans of that phase: parallel
tool calls overlap and count once (what verl's timer around ``asyncio.gather`` measures), sequential turns
add up. Each (sample, phase) keeps its disjoint blocks sorted; the common cases (a span after the last
block, or overlapping only it) are O(1), the rest a short scan. Totals are integer nanoseconds.

Columns are ``array.array`` so the collect (``_rows_table``: :meth:`StepRows.to_table`) hands them to numpy
without copying element by element; :meth:`StepRows.add` is one flat method because Python calls dominate the
cost of ``on_end``. No numpy here.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .. import semconv as sc
from ._engine import ENGINE_ATTRIBUTE_OF, ENGINE_FLOATS, ENGINE_MARKERS, array_value
from ._rows_table import I64_MAX as _I64_MAX
from ._rows_table import UNSET as _UNSET
from ._rows_table import TableOfRows
from ._table import MAX_TOOLS, OTHER_TOOLS

if TYPE_CHECKING:
    from ._rows_table import EngineColumns
PHASE_INDEX: Mapping[object, int] = {name: i for i, name in enumerate(sc.PHASES)}
_MASK64 = (1 << 64) - 1
_I64_MIN = -(1 << 63)  # an attribute outside int64 is ignored, never stored
_NPRE = sc.RL_NUM_PREEMPTED
_PLEN = sc.RL_PROMPT_LENGTH
_RLEN = sc.RL_RESPONSE_LENGTH
_TOOL = sc.GEN_AI_TOOL_NAME
_EFIN, _EVERS, _ABORTED = sc.RL_ENGINE_FINISH, sc.RL_ENGINE_POLICY_VERSIONS, sc.ENGINE_ABORTED
_EMARK = ENGINE_MARKERS
_NAN = float("nan")
MAX_ENGINE_TURNS = 1 << 20
"""Generation turns with engine timing kept per step; later ones are left out of the engine statistics."""
# per-row scalar columns besides the phase totals and blocks (copied by StepRows.split_off)
_ROW_FIELDS = (
    "npre_sum",
    "npre_first",
    "npre_first_missing",
    "npre_final",
    "prompt_len",
    "response_len",
    "error",
    "tid_hi",
    "tid_lo",
    "root_start",
    "root_end",
    "span_start",
    "span_end",
)


def engine_number(value: object) -> float | None:
    """An engine attribute's value as a float: a finite, non-negative int or float below 1e18 (``None``
    otherwise: absent, a bool, a string, NaN, negative)."""
    if type(value) is int or type(value) is float:
        number = float(value)
        if 0 <= number < 1e18:  # NaN fails this too
            return number
    return None


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
    blocks[2 * lo : 2 * hi] = (new_start, new_end)
    return (new_end - new_start) - covered


class StepRows(TableOfRows):
    """Accumulated facts of one step: one row per sample, created on the sample's first span; the table they
    make at a collect is its base's (:meth:`~._rows_table.TableOfRows.to_table`). Not locked: the caller
    serialises access."""

    __slots__ = (
        "blocks",
        "dropped",
        "engine",
        "engine_pairs",
        "error",
        "in_order",
        "index",
        "late",
        "max_rows",
        "npre_final",
        "npre_first",
        "npre_first_missing",
        "npre_sum",
        "prompt_len",
        "response_len",
        "rollout",
        "root_end",
        "root_start",
        "rows",
        "span_end",
        "span_start",
        "tid_hi",
        "tid_lo",
        "tools",
        "total",
        "versions",
    )

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self.rows: dict[tuple[int, int], int] = {}
        self.index = array("q")
        self.rollout = array("q")
        self.total = (array("q"), array("q"), array("q"))
        self.blocks: tuple[list[list[int] | None], ...] = ([], [], [])
        self.npre_sum = array("q")
        self.npre_first = array("q")  # start of the earliest generation span; -1 when none yet
        self.npre_first_missing = array("b")
        self.npre_final = array("q")  # set from the root span; _UNSET when not
        self.prompt_len = array("q")
        self.response_len = array("q")
        self.error = array("b")
        self.tid_hi = array("Q")
        self.tid_lo = array("Q")
        # the sample's rl.sample span start and end (0: not ended yet), and its phase spans' earliest start
        # (_I64_MAX: none yet) and latest end
        self.root_start = array("q")
        self.root_end = array("q")
        self.span_start = array("q")
        self.span_end = array("q")
        # tool name -> (rows, durations ns) of each call (spans with gen_ai.tool.name of phase tool_calls);
        # at most MAX_TOOLS names, further names' calls under OTHER_TOOLS
        self.tools: dict[str, tuple[array[int], array[int]]] = {}
        # generation turns carrying the engine's facts: (row, *ENGINE_FLOATS), floats NaN where not carried;
        # at most MAX_ENGINE_TURNS; the policy versions of the turns that carry them, by turn number
        floats: tuple[array[float], ...] = tuple(array("d") for _ in ENGINE_FLOATS)
        self.engine: EngineColumns = (array("q"), *floats)
        self.engine_pairs = tuple(zip(floats[:-1], ENGINE_ATTRIBUTE_OF, strict=True))
        self.versions: dict[int, tuple[int, ...]] = {}
        self.dropped = 0
        self.in_order = True  # rows created in (index, rollout) order: no sort needed at collect
        self.late = False  # holds samples carried over from an earlier collect of the step (split_off)

    def __len__(self) -> int:
        return len(self.index)

    def _new_row(self, key: tuple[int, int]) -> int:
        r = len(self.index)
        if r >= self.max_rows:
            self.dropped += 1
            return -1
        index, rollout = key
        if r and self.in_order and (index, rollout) < (self.index[-1], self.rollout[-1]):
            self.in_order = False
        self.rows[key] = r
        self.index.append(index)
        self.rollout.append(rollout)
        for p in (0, 1, 2):
            self.total[p].append(0)
            self.blocks[p].append(None)
        self.npre_sum.append(0)
        self.npre_first.append(-1)
        self.npre_first_missing.append(0)
        self.npre_final.append(_UNSET)
        self.prompt_len.append(-1)
        self.response_len.append(-1)
        self.error.append(0)
        self.tid_hi.append(0)
        self.tid_lo.append(0)
        self.root_start.append(0)
        self.root_end.append(0)
        self.span_start.append(_I64_MAX)
        self.span_end.append(0)
        return r

    def _tool(self, name: object) -> tuple[array[int], array[int]] | None:
        """The call lists of tool ``name`` (new, or :data:`OTHER_TOOLS`'s past :data:`MAX_TOOLS` names)."""
        if type(name) is not str:
            return None
        if len(self.tools) >= MAX_TOOLS and name != OTHER_TOOLS:
            name = OTHER_TOOLS
            calls = self.tools.get(name)
            if calls is not None:
                return calls
        calls = self.tools[name] = (array("q"), array("q"))
        return calls

    def add(
        self, key: tuple[int, int], p: int, start: int, end: int, attrs: Mapping[str, Any], trace_id: int, error: bool
    ) -> None:
        """Account one span of sample ``key``: phase ``p`` (0..2), or ``p = -1`` for the sample's root span."""
        r = self.rows.get(key)
        if r is None:
            r = self._new_row(key)
            if r < 0:
                return
            self.tid_hi[r], self.tid_lo[r] = (trace_id >> 64) & _MASK64, trace_id & _MASK64  # its first span's trace
        if p >= 0:
            blocks = self.blocks[p]
            b = blocks[r]
            if b is None:
                blocks[r] = [start, end]
                self.total[p][r] += end - start
                if start < self.span_start[r]:
                    self.span_start[r] = start
            elif start > b[-1]:  # after the phase's first block: cannot move the sample's earliest start
                b += (start, end)
                self.total[p][r] += end - start
            else:
                self.total[p][r] += add_interval(b, start, end)
                if start < self.span_start[r]:
                    self.span_start[r] = start
            if end > self.span_end[r]:
                self.span_end[r] = end
            if p == 0:
                # verl: the first turn sets num_preempted (None -> -1), later turns add (None -> 0).
                value = attrs.get(_NPRE)
                known = type(value) is int and -(1 << 40) < value < (1 << 40)
                if known:
                    self.npre_sum[r] += value  # type: ignore[operator]
                if (first := self.npre_first[r]) < 0 or start < first:
                    self.npre_first[r] = start
                    self.npre_first_missing[r] = not known
                if not _EMARK.isdisjoint(attrs):  # the engine's facts
                    self._engine_turn(r, attrs)
            elif (
                p == 1
                and (tool := attrs.get(_TOOL)) is not None
                and (calls := self.tools.get(tool) or self._tool(tool)) is not None
            ):
                calls[0].append(r)
                calls[1].append(end - start)
        else:
            self.root_start[r], self.root_end[r] = start, end
            value = attrs.get(_NPRE)
            if type(value) is int and _I64_MIN < value <= _I64_MAX:
                self.npre_final[r] = value
            value = attrs.get(_PLEN)
            if type(value) is int and _I64_MIN <= value <= _I64_MAX:
                self.prompt_len[r] = value
            value = attrs.get(_RLEN)
            if type(value) is int and _I64_MIN <= value <= _I64_MAX:
                self.response_len[r] = value
            self.tid_hi[r], self.tid_lo[r] = (trace_id >> 64) & _MASK64, trace_id & _MASK64  # ... until the root's
        if error and p < 0:  # failed: the sample span ended with an error (a caught tool error is not)
            self.error[r] = 1

    def _engine_turn(self, r: int, attrs: Mapping[str, Any]) -> None:
        """Record the engine's facts of one generation turn of row ``r``: each value :func:`engine_number`
        accepts, else NaN (an absent one, and a float in range, are taken inline: the usual cases)."""
        rows = self.engine[0]
        t = len(rows)
        if t >= MAX_ENGINE_TURNS:
            return
        rows.append(r)
        get = attrs.get
        for column, name in self.engine_pairs:  # every column but the last, aborted
            v = get(name)
            if v is None:
                column.append(_NAN)
            elif type(v) is float and 0.0 <= v < 1e18:
                column.append(v)
            else:
                number = engine_number(v)
                column.append(_NAN if number is None else number)
        finish = get(_EFIN)
        self.engine[-1].append(_NAN if type(finish) is not str else float(finish == _ABORTED))
        versions = get(_EVERS)
        if versions is not None and (items := array_value(versions)):  # a list, or Jaeger's JSON text of it
            self.versions[t] = tuple(v for v in items[:64] if type(v) is int and _I64_MIN < v <= _I64_MAX)

    def split_off(self, keys: Iterable[tuple[int, int]]) -> StepRows:
        """A new ``StepRows`` (``late``) holding copies of the rows of ``keys`` that exist here: what a sample
        still running at its step's collect had accumulated so far, so its later spans add to it."""
        out = StepRows(self.max_rows)
        out.late = True
        for key in sorted(k for k in keys if k in self.rows):
            r, o = self.rows[key], out._new_row(key)
            for p in (0, 1, 2):
                out.total[p][o] = self.total[p][r]
                b = self.blocks[p][r]
                out.blocks[p][o] = None if b is None else list(b)
            for name in _ROW_FIELDS:
                getattr(out, name)[o] = getattr(self, name)[r]
        for tool, (rows, durations) in self.tools.items():
            for row, duration in zip(rows, durations, strict=True):
                o = out.rows.get((self.index[row], self.rollout[row]), -1)
                if o >= 0:
                    calls = out.tools.get(tool) or out._tool(tool)
                    if calls is not None:
                        calls[0].append(o)
                        calls[1].append(duration)
        rows, *values = self.engine
        for t, row in enumerate(rows):
            o = out.rows.get((self.index[row], self.rollout[row]), -1)
            if o >= 0:
                if t in self.versions:
                    out.versions[len(out.engine[0])] = self.versions[t]
                out.engine[0].append(o)
                for column, source in zip(out.engine[1:], values, strict=True):
                    column.append(source[t])
        return out
