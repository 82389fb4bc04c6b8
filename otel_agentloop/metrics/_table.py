"""Per-sample phase tables and verl's agent-loop metric formula, in one place.

Every path that produces metrics goes through :func:`compute_metrics`: the live processor's ``collect``, the
merge of tables from several Ray workers, and the ``report`` command rebuilding a step from stored spans.
Rows are put in a canonical order (sample index, rollout n) first, so the result does not depend on how
samples were split across workers or in which order spans arrived.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

from .. import semconv as sc
from ._engine import PERCENTILES as PERCENTILES
from ._engine import EngineSample as EngineSample
from ._engine import EngineTurns, engine_metrics
from ._numpy import LazyNumpy

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
else:
    np = LazyNumpy(globals(), "np")

_PREFIX = sc.METRIC_PREFIX
MAX_TOOLS = 64
"""Tool names kept per step; calls of further names are pooled under :data:`OTHER_TOOLS`."""
OTHER_TOOLS = "(other tools)"
ToolCalls: TypeAlias = "Mapping[str, npt.NDArray[np.float64]]"
"""Each tool's call durations in seconds, by tool name (at most :data:`MAX_TOOLS` names + :data:`OTHER_TOOLS`)."""


def bound_tools(tools: Mapping[str, npt.ArrayLike]) -> dict[str, npt.NDArray[np.float64]]:
    """``tools`` (name -> call durations) with at most :data:`MAX_TOOLS` names: the most called (ties by
    name); the calls of every other name, and any already pooled, under :data:`OTHER_TOOLS`."""
    calls = {name: np.asarray(values, dtype=np.float64).ravel() for name, values in tools.items()}
    pooled = calls.pop(OTHER_TOOLS, None)
    ranked = sorted(calls, key=lambda name: (-calls[name].size, name))
    out = {name: calls[name] for name in ranked[:MAX_TOOLS]}
    rest = [calls[name] for name in ranked[MAX_TOOLS:]]
    if pooled is not None:
        rest.append(pooled)
    if rest:
        out[OTHER_TOOLS] = np.concatenate(rest)
    return out


class OverdueSample(NamedTuple):
    """A sample the watchdog reported, as classified when its step was collected (``StepMetrics.slow_samples``,
    ``hung_samples``)."""

    sample_index: int | None
    rollout_n: int | None
    trace_id: str
    phase: str
    tool: str | None


@dataclass(frozen=True)
class PhaseTable:
    """Per-sample facts of one step: compact numpy columns, picklable, cheap to ship across processes.

    Times are seconds (float64), phase time = wall time covered by the sample's spans of that phase.
    ``num_preempted`` is -1 when unknown; ``prompt_length``/``response_length`` are -1 when unknown.
    ``error``: the sample failed (its ``rl.sample`` span ended with an error; an error span below it that the
    agent loop caught is not a failure). ``trace_id_hi``/``trace_id_lo`` are the two halves of the 128-bit
    trace id (0 when unknown).
    ``late`` flags rows whose sample was still running at an earlier collect of its step (all False when
    not given). ``start_ns``/``end_ns``: each sample's wall-clock start and end (Unix ns; 0 when unknown):
    its ``rl.sample`` span's, else the earliest start and latest end of its phase spans. ``top_tool``: the tool
    whose calls took the most seconds in the sample (``""`` when none). ``engine``: the engine's timing of the
    step's turns (:class:`EngineTurns`; empty when no turn carries it).
    ``tools``: each tool's call durations in seconds (spans with ``gen_ai.tool.name`` of phase tool_calls),
    bounded by :func:`bound_tools`; not per row. ``step_key``: the (step, validate) the table was taken for
    (``None`` when unknown; :meth:`concat` keeps it when every part agrees). ``ordered`` promises rows are
    already in canonical order (skips a sort); leave it False when unsure.
    """

    sample_index: npt.NDArray[np.int64]
    rollout_n: npt.NDArray[np.int64]
    generate_sequences: npt.NDArray[np.float64]
    tool_calls: npt.NDArray[np.float64]
    compute_score: npt.NDArray[np.float64]
    num_preempted: npt.NDArray[np.int64]
    prompt_length: npt.NDArray[np.int64]
    response_length: npt.NDArray[np.int64]
    error: npt.NDArray[np.bool_]
    trace_id_hi: npt.NDArray[np.uint64]
    trace_id_lo: npt.NDArray[np.uint64]
    late: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, np.bool_))
    start_ns: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    end_ns: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    ordered: bool = False
    top_tool: npt.NDArray[np.object_] = field(default_factory=lambda: np.zeros(0, np.object_))
    tools: ToolCalls = field(default_factory=dict)
    step_key: sc.StepKey | None = None
    engine: EngineTurns = field(default_factory=EngineTurns)

    def __post_init__(self) -> None:
        n = self.sample_index.shape[0]
        for name, dtype in _OPTIONAL_COLUMNS:
            column = getattr(self, name)
            if column.shape[0] != n:
                if column.shape[0]:
                    raise ValueError(f"{name} has {column.shape[0]} rows, the table {n}")
                object.__setattr__(self, name, np.full(n, "", np.object_) if dtype == "object" else np.zeros(n, dtype))

    def __len__(self) -> int:
        return int(self.sample_index.shape[0])

    @property
    def total(self) -> npt.NDArray[np.float64]:
        """generate_sequences + tool_calls + compute_score: verl's measure of a sample's cost."""
        return self.generate_sequences + self.tool_calls + self.compute_score

    @classmethod
    def empty(cls) -> PhaseTable:
        return cls.concat(())

    @classmethod
    def concat(cls, tables: Iterable[PhaseTable]) -> PhaseTable:
        """One table holding the rows and tool calls of all ``tables`` (e.g. one per Ray worker)."""
        parts = list(tables)
        # Any: each field's array type follows its dtype name in _COLUMNS, a pairing no checker sees through **
        cols: dict[str, Any] = {}  # column name -> array, for the dataclass constructor
        for name, dtype in _COLUMNS:
            arrays = [getattr(t, name) for t in parts]
            cols[name] = np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.empty(0, dtype)
        calls: dict[str, list[npt.NDArray[np.float64]]] = {}
        for t in parts:
            for tool, values in t.tools.items():
                calls.setdefault(tool, []).append(values)
        tools = bound_tools({tool: np.concatenate(values) for tool, values in calls.items()})
        keys = {t.step_key for t in parts}
        engine = EngineTurns.concat(t.engine for t in parts)
        return cls(**cols, tools=tools, step_key=keys.pop() if len(keys) == 1 else None, engine=engine)

    def trace_id_hex(self, i: int) -> str | None:
        """Row ``i``'s trace id as 32 hex digits, or ``None`` when unknown."""
        value = (int(self.trace_id_hi[i]) << 64) | int(self.trace_id_lo[i])
        return format(value, "032x") if value else None

    def canonical(self) -> PhaseTable:
        """Rows sorted by (sample_index, rollout_n): the order every metric is computed in."""
        if self.ordered:
            return self
        order = np.lexsort((self.rollout_n, self.sample_index))
        cols = {name: getattr(self, name)[order] for name, _ in _COLUMNS}
        return PhaseTable(**cols, ordered=True, tools=self.tools, step_key=self.step_key, engine=self.engine)

    def slowest_rows(self, n: int) -> list[int]:
        """The rows of the ``n`` samples with the largest total, slowest first (row order breaks ties: call it
        on the :meth:`canonical` table)."""
        return [int(i) for i in np.argsort(-self.total, kind="stable")[: max(0, n)]]

    def slowest(self, n: int = 5) -> list[dict[str, object]]:
        """The ``n`` samples with the largest total, slowest first (canonical order breaks ties)."""
        t = self.canonical()
        order = t.slowest_rows(n)
        rows: list[dict[str, object]] = []
        for i in order:
            rows.append(
                {
                    "sample_index": int(t.sample_index[i]),
                    "rollout_n": int(t.rollout_n[i]),
                    "total": float(t.total[i]),
                    sc.GENERATE: float(t.generate_sequences[i]),
                    sc.TOOL_CALLS: float(t.tool_calls[i]),
                    sc.COMPUTE_SCORE: float(t.compute_score[i]),
                    "error": bool(t.error[i]),
                    "trace_id": t.trace_id_hex(int(i)),
                }
            )
        return rows


_COLUMNS: Sequence[tuple[str, str]] = (  # numpy dtype names
    ("sample_index", "int64"),
    ("rollout_n", "int64"),
    ("generate_sequences", "float64"),
    ("tool_calls", "float64"),
    ("compute_score", "float64"),
    ("num_preempted", "int64"),
    ("prompt_length", "int64"),
    ("response_length", "int64"),
    ("error", "bool"),
    ("trace_id_hi", "uint64"),
    ("trace_id_lo", "uint64"),
    ("late", "bool"),
    ("start_ns", "int64"),
    ("end_ns", "int64"),
    ("top_tool", "object"),
)
_OPTIONAL_COLUMNS: Sequence[tuple[str, str]] = (
    ("late", "bool"),
    ("start_ns", "int64"),
    ("end_ns", "int64"),
    ("top_tool", "object"),
)
"""Columns a caller may leave out (empty): filled with zeros (False, unknown; ``""`` for ``top_tool``)."""


class StepMetrics(dict[str, float]):
    """verl's metric dict (``agent_loop/...`` -> float), plus non-float facts as attributes.

    ``slowest_trace_id``: hex trace id of the slowest sample's root span (``None`` if it was not traced).
    """

    slowest_trace_id: str | None = None
    slowest_sample: tuple[int, int] | None = None
    slow_trace_ids: tuple[str, ...] = ()
    """Trace ids of samples the watchdog reported that finished before collection (``agent_loop/watchdog/slow``)."""
    hung_trace_ids: tuple[str, ...] = ()
    """Trace ids of samples the watchdog reported still running at collection (``agent_loop/watchdog/hung``)."""
    slow_samples: tuple[OverdueSample, ...] = ()
    hung_samples: tuple[OverdueSample, ...] = ()
    """(sample_index, rollout_n, trace_id, phase, tool) of each, as ``OverdueSample``."""


def compute_metrics(table: PhaseTable) -> StepMetrics:
    """verl's ``AgentLoopManager._performance_metrics`` on ``table``, plus our keys under ``agent_loop/``.

    verl's keys: ``{num_preempted,generate_sequences,tool_calls,compute_score}/{min,max,mean}`` and
    ``slowest/{generate_sequences,tool_calls,compute_score,num_preempted}`` where slowest is the argmax of
    generate_sequences + tool_calls + compute_score; ``slowest/{prompt_length,response_length}`` only when
    known. Ours: ``{phase}/p50|p90|p99`` (linear interpolation), ``slowest/sample_index``,
    ``slowest/rollout_n``, ``num_samples``, ``late_samples`` (rows flagged ``late``) only when > 0, and
    ``engine/<stat>/{p50,p90,p99,max}`` over the turns of :attr:`PhaseTable.engine` that carry the statistic
    (:func:`engine_metrics`), only when some turn carries the engine's timing. An empty table gives only
    ``num_samples`` = 0.
    """
    out = StepMetrics()
    n = len(table)
    if n == 0:
        out[f"{_PREFIX}/num_samples"] = 0.0
        return out
    t = table.canonical()
    columns = (
        ("num_preempted", t.num_preempted),
        (sc.GENERATE, t.generate_sequences),
        (sc.TOOL_CALLS, t.tool_calls),
        (sc.COMPUTE_SCORE, t.compute_score),
    )
    for name, col in columns:
        out[f"{_PREFIX}/{name}/min"] = float(col.min())
        out[f"{_PREFIX}/{name}/max"] = float(col.max())
        out[f"{_PREFIX}/{name}/mean"] = float(col.mean())
    for name, col in columns[1:]:
        for q, value in zip(PERCENTILES, np.percentile(col, PERCENTILES), strict=True):
            out[f"{_PREFIX}/{name}/p{q}"] = float(value)
    i = int(np.argmax(t.total))
    out[f"{_PREFIX}/slowest/{sc.GENERATE}"] = float(t.generate_sequences[i])
    out[f"{_PREFIX}/slowest/{sc.TOOL_CALLS}"] = float(t.tool_calls[i])
    out[f"{_PREFIX}/slowest/{sc.COMPUTE_SCORE}"] = float(t.compute_score[i])
    out[f"{_PREFIX}/slowest/num_preempted"] = float(t.num_preempted[i])
    if t.prompt_length[i] >= 0:
        out[f"{_PREFIX}/slowest/prompt_length"] = float(t.prompt_length[i])
    if t.response_length[i] >= 0:
        out[f"{_PREFIX}/slowest/response_length"] = float(t.response_length[i])
    out[f"{_PREFIX}/slowest/sample_index"] = float(t.sample_index[i])
    out[f"{_PREFIX}/slowest/rollout_n"] = float(t.rollout_n[i])
    out[f"{_PREFIX}/num_samples"] = float(n)
    late = int(np.count_nonzero(t.late))
    if late:
        out[f"{_PREFIX}/{sc.LATE_SAMPLES}"] = float(late)
    out.slowest_trace_id = t.trace_id_hex(i)
    out.slowest_sample = (int(t.sample_index[i]), int(t.rollout_n[i]))
    out.update(engine_metrics(t.engine))
    return out
