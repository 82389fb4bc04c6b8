"""One trajectory's phase times, from its spans, while it is still open (V1 needs them before the sample ends).

verl's V1 worker writes each finished trajectory into TransferQueue from inside the sample, and the trainer
reads it back steps later, in another process. :class:`OpenSampleRows` is a span processor that, for the
samples registered with it, accumulates phase time exactly like the metrics processor (union of the
phase's span intervals, verl's num_preempted rule); :func:`row_tags` turns that into flat TransferQueue tags
that ride with the trajectory, and :func:`table_from_tags` rebuilds the per-sample table in the trainer.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ... import semconv as sc
from ...config._fork import after_fork_in_child
from ...core._door import RecordProcessor
from ...core._guard import internal_error, safe_str, warn_once
from ...core._record import FastSpan
from ...metrics._accumulate import PHASE_INDEX, StepRows
from ...metrics._engine import EngineTurns
from ...metrics._table import PhaseTable, bound_tools

Key = tuple[Any, Any, Any, Any]  # (step, validate, sample index, rollout n) as the spans carry them
TAG = "otel_agentloop."
"""Prefix of our TransferQueue tags (flat numbers and strings: tags are small metadata dicts)."""
_FIELDS = (
    "generate_sequences",
    "tool_calls",
    "compute_score",
    "num_preempted",
    "index",
    "rollout_n",
    "trace_id",
    "uid",
    "step",
)


_ROW = (0, 0)  # the one row of an open sample's own StepRows
_INT_WIDTHS = (4, 8)  # int32, int64 (shorter byte strings are more likely text than a number)


def identity_int(value: Any) -> int | None:
    """An identity value as verl passes it, as an int; ``None`` when it is not one. Never raises.

    Read: ints and bools, integral floats, numpy scalars and one-element arrays, 0-d tensors (``.item()``),
    ``NonTensorData`` (``.data``), decimal strings, and the raw bytes of one element of an int32/int64 column
    (4 or 8 bytes, this machine's byte order: what an int64 ``index`` column reaches V1's worker as). Only
    int64 values: span attributes hold no more.
    """
    number = _as_int(value)
    return number if number is not None and -(1 << 63) <= number < (1 << 63) else None


def _as_int(value: Any) -> int | None:
    try:
        for _ in range(4):  # unwrap NonTensorData / tensors / numpy: a few levels at most
            if isinstance(value, (bool, int)):
                return int(value)
            if isinstance(value, float):
                return int(value) if value.is_integer() else None
            if isinstance(value, (bytes, bytearray, memoryview)):
                raw = bytes(value)
                return int.from_bytes(raw, sys.byteorder, signed=True) if len(raw) in _INT_WIDTHS else None
            if isinstance(value, str):
                text = value.strip()
                return int(text) if text.lstrip("+-").isdigit() and len(text) < 32 else None
            if isinstance(value, (np.generic, np.ndarray)):
                if value.size != 1 or value.dtype.kind not in "biufSV":
                    return None
                value = value.reshape(()).item() if isinstance(value, np.ndarray) else value.item()
                continue
            item = getattr(value, "item", None)  # a 0-d tensor
            if callable(item):
                try:
                    value = item()
                    continue
                except Exception:
                    pass
            value = getattr(value, "data", None)  # NonTensorData
        return None
    except Exception:
        return None


def read_identity(name: str, value: Any) -> int | None:
    """:func:`identity_int`, warning once per ``name`` when a value is there but is not an int (the sample span
    is recorded without it)."""
    number = identity_int(value)
    if number is None and value is not None:
        warn_once(
            "verl-identity:" + name,
            "otel_agentloop: verl's %s (a %s) cannot be read as an int; sample spans are recorded without it",
            name,
            safe_str(type(value).__qualname__),
        )
    return number


class OpenSampleRows(RecordProcessor):
    """Phase totals of registered open samples (bounded: at most ``max_open`` at once). Thread-safe.

    Each open sample is one row of the metrics processor's own accumulator (:class:`StepRows`), so phase time
    and verl's num_preempted rule are computed by the same code as ``collect()``. It takes the fast path's
    records as they are; ``drain`` (the provider's export pipeline's) runs before a sample's totals are read,
    so its spans that ended are in them.
    """

    def __init__(self, max_open: int = 1 << 16, drain: Callable[[], object] | None = None) -> None:
        self._open: dict[Key, StepRows] = {}
        self._lock = threading.Lock()
        self.max_open = max_open
        self.drain = drain
        after_fork_in_child(self, "_new_lock")

    def _new_lock(self) -> None:
        """In a forked child: a fresh lock (one another thread held at the fork is never inherited held)."""
        self._lock = threading.Lock()

    def open(self, key: Key) -> None:
        with self._lock:
            if len(self._open) < self.max_open:
                self._open[key] = StepRows(1)

    def close(self, key: Key) -> dict[str, Any] | None:
        """The sample's totals (seconds) and num_preempted, releasing it; ``None`` if not registered."""
        self._ended_spans_in()
        with self._lock:
            rows = self._open.pop(key, None)
        if rows is None:
            return None
        return self._values(rows)

    def peek(self, key: Key) -> dict[str, Any] | None:
        self._ended_spans_in()
        with self._lock:
            rows = self._open.get(key)
            return None if rows is None else self._values(rows)

    def _ended_spans_in(self) -> None:
        if self.drain is not None:
            try:
                self.drain()
            except Exception:
                internal_error("verl.OpenSampleRows.drain")

    @staticmethod
    def _values(rows: StepRows) -> dict[str, Any]:
        """Phase totals (seconds) and num_preempted; ``start_ns``/``end_ns`` (its phase spans' extent so far) and
        ``tools`` (tool name -> call seconds) when known."""
        if not len(rows):  # no phase span yet
            return {sc.GENERATE: 0.0, sc.TOOL_CALLS: 0.0, sc.COMPUTE_SCORE: 0.0, "num_preempted": -1.0}
        table = rows.to_table()
        return {
            sc.GENERATE: float(table.generate_sequences[0]),
            sc.TOOL_CALLS: float(table.tool_calls[0]),
            sc.COMPUTE_SCORE: float(table.compute_score[0]),
            "num_preempted": float(table.num_preempted[0]),
            "start_ns": int(table.start_ns[0]),
            "end_ns": int(table.end_ns[0]),
            "tools": {name: [float(v) for v in calls] for name, calls in table.tools.items()},
            "engine": engine_columns(table.engine),
        }

    def record_end(self, span: FastSpan) -> None:
        try:
            if not self._open:
                return
            attrs = span.attributes or {}
            phase = attrs.get(sc.RL_PHASE)
            if phase is None:
                return
            p = PHASE_INDEX.get(phase)
            if p is None:
                return
            key = (*sc.step_key(attrs), attrs.get(sc.RL_SAMPLE_INDEX), attrs.get(sc.RL_ROLLOUT_N))
            start, end = span.start_time or 0, span.end_time or 0
            with self._lock:
                rows = self._open.get(key)
                if rows is not None:
                    rows.add(_ROW, p, start, end, attrs, 0, False)
        except Exception:
            internal_error("verl.OpenSampleRows.on_end")


def row_tags(
    values: Mapping[str, Any],
    *,
    index: int,
    rollout_n: int,
    uid: str,
    step: int,
    trace_id: str | None,
    start_ns: int | None = None,
) -> dict[str, Any]:
    """Flat TransferQueue tags for one trajectory (``start_ns``: its sample span's start, when known; else its
    first phase span's). Wall times go as decimal text (a float would lose nanoseconds), tool calls as JSON."""
    out: dict[str, Any] = {
        TAG + name: float(values[name]) for name in (sc.GENERATE, sc.TOOL_CALLS, sc.COMPUTE_SCORE, "num_preempted")
    }
    start = start_ns or int(values.get("start_ns", 0))
    end = int(values.get("end_ns", 0))
    if start > 0 and end >= start:
        out[TAG + "start_ns"], out[TAG + "end_ns"] = str(start), str(end)
    tools = values.get("tools")
    if tools:
        out[TAG + "tools"] = json.dumps(tools, separators=(",", ":"))
    engine = values.get("engine")
    if engine:
        out[TAG + "engine"] = json.dumps(engine, separators=(",", ":"))
    out[TAG + "index"] = int(index)
    out[TAG + "rollout_n"] = int(rollout_n)
    out[TAG + "uid"] = str(uid)
    out[TAG + "step"] = int(step)
    if trace_id:
        out[TAG + "trace_id"] = trace_id
    return out


def table_from_tags(tags: Sequence[Mapping[str, Any]]) -> tuple[PhaseTable, list[Mapping[str, Any]]]:
    """The per-sample table of the trajectories whose tags carry our row (padding skipped), and per row the
    tags it came from (uid, dispatch step, policy versions)."""
    rows = [t for t in tags if isinstance(t, Mapping) and not t.get("is_padding", False) and (TAG + sc.GENERATE) in t]
    n = len(rows)

    def col(name: str, dtype: Any, default: Any = -1) -> Any:
        return np.array([r.get(name, default) for r in rows], dtype=dtype) if n else np.empty(0, dtype)

    tids = [int(r.get(TAG + "trace_id") or "0", 16) for r in rows]
    calls: dict[str, list[float]] = {}
    for r in rows:
        try:
            for name, seconds in json.loads(r.get(TAG + "tools") or "{}").items():
                calls.setdefault(str(name), []).extend(float(v) for v in seconds)
        except (TypeError, ValueError, AttributeError):
            continue  # a malformed row's tool calls are left out, never the row
    table = PhaseTable(
        sample_index=col(TAG + "index", np.int64),
        rollout_n=col(TAG + "rollout_n", np.int64),
        generate_sequences=col(TAG + sc.GENERATE, np.float64, 0.0),
        tool_calls=col(TAG + sc.TOOL_CALLS, np.float64, 0.0),
        compute_score=col(TAG + sc.COMPUTE_SCORE, np.float64, 0.0),
        num_preempted=col(TAG + "num_preempted", np.float64).astype(np.int64) if n else np.empty(0, np.int64),
        prompt_length=col("prompt_len", np.int64),
        response_length=col("response_len", np.int64),
        error=np.zeros(n, np.bool_),
        trace_id_hi=np.array([(t >> 64) & ((1 << 64) - 1) for t in tids], dtype=np.uint64),
        trace_id_lo=np.array([t & ((1 << 64) - 1) for t in tids], dtype=np.uint64),
        start_ns=np.array([_ns(r.get(TAG + "start_ns")) for r in rows], dtype=np.int64),
        end_ns=np.array([_ns(r.get(TAG + "end_ns")) for r in rows], dtype=np.int64),
        tools=bound_tools(calls),
        engine=engine_from_tags(rows),
    )
    return table, rows


MAX_ROW_ENGINE_TURNS = 1024
"""Engine turns carried per trajectory in its tags (a trajectory's later turns are left out of the engine
statistics; verl caps turns per trajectory far lower)."""
_KEYS = ("sample_index", "rollout_n")  # an engine turn's sample: the row's own identity, not carried


def engine_columns(turns: EngineTurns) -> dict[str, list[Any]]:
    """One trajectory's engine turns (the metrics' own per-turn columns, whatever they are: every field of
    :class:`EngineTurns` but its sample keys) as JSON-ready lists, NaN as ``None``; ``{}`` without turns."""
    if not len(turns):
        return {}
    out: dict[str, list[Any]] = {}
    for f in dataclasses.fields(turns):
        if f.name not in _KEYS:
            column = np.asarray(getattr(turns, f.name))[:MAX_ROW_ENGINE_TURNS]
            if column.dtype.kind == "O":  # policy versions: a tuple of ints per turn
                out[f.name] = [[int(x) for x in v] for v in column.tolist()]
            else:
                out[f.name] = [None if v != v else v for v in column.tolist()]  # v != v: NaN
    return out


def engine_from_tags(rows: Sequence[Mapping[str, Any]]) -> EngineTurns:
    """The engine turns of the trajectories whose tags carry them (:func:`engine_columns`), keyed by each row's
    sample index and rollout. A malformed row's turns are left out, never the row; a column the tags do not
    carry (an older writer) is NaN."""
    fields = [f for f in dataclasses.fields(EngineTurns) if f.name not in _KEYS]
    empty = EngineTurns()
    keys: list[tuple[int, int]] = []
    columns: dict[str, list[Any]] = {f.name: [] for f in fields}
    for r in rows:
        try:
            carried = json.loads(r.get(TAG + "engine") or "{}")
            n = max((len(v) for v in carried.values() if isinstance(v, list)), default=0)
            turn_columns = {}
            for f in fields:
                values = carried.get(f.name)
                values = values if isinstance(values, list) and len(values) == n else [None] * n
                turn_columns[f.name] = (
                    [_versions(v) for v in values]
                    if getattr(empty, f.name).dtype.kind == "O"
                    else [_number(v) for v in values]
                )
        except (TypeError, ValueError, AttributeError):
            continue
        keys.extend([(int(r.get(TAG + "index", -1)), int(r.get(TAG + "rollout_n", -1)))] * n)
        for name, values in turn_columns.items():
            columns[name].extend(values)
    if not keys:
        return empty
    built = {name: _column(values, getattr(empty, name).dtype) for name, values in columns.items()}
    index = np.array([k[0] for k in keys], dtype=np.int64)
    rollout = np.array([k[1] for k in keys], dtype=np.int64)
    return EngineTurns(sample_index=index, rollout_n=rollout, **built)


def _versions(value: Any) -> tuple[int, ...]:
    """A carried turn's policy versions (a list of ints) as a tuple; ``()`` when malformed."""
    if not isinstance(value, list) or not all(type(v) is int for v in value):
        return ()
    return tuple(value)


def _column(values: list[Any], dtype: Any) -> Any:
    """Carried values as a column of the metrics' own dtype (a non-float column: NaN as -1; an object column:
    its values as they are)."""
    if dtype.kind == "O":
        column = np.empty(len(values), np.object_)
        column[:] = values
        return column
    column = np.array(values, dtype=np.float64)
    return column if dtype.kind == "f" else np.nan_to_num(column, nan=-1.0).astype(dtype)


def _number(value: Any) -> float:
    """A carried engine value (``None``: not carried) as a float, NaN when missing or not a number."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")


def _ns(value: Any) -> int:
    """A wall time tag (decimal text) as int ns; 0 when absent or malformed."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return 0
    return number if 0 < number < (1 << 63) else 0
