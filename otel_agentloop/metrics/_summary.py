"""One step in a few kilobytes at most: the record the run page, ``report --compare`` and a step's report from
Jaeger read.

A :class:`StepSummary` is computed from the step's :class:`PhaseTable` and its :class:`StepMetrics` by
:func:`summarize`: the same table and the same :func:`compute_metrics` call as ``collect()``, so a summary and
the metrics dict cannot disagree. The live side writes one per collected step as a ``rl.step.summary`` span
(JSON in :data:`semconv.RL_STEP_SUMMARY`, see :meth:`StepSummary.to_json`); ``report`` rebuilds the same record
from stored sample spans when a summary was not written (older traces, a step never collected).

Each sample's verdict is the one rule's (:func:`~._verdicts.verdict`, re-exported here with its values).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import semconv as sc
from ._causes import cause as cause  # the causes' rule (its own module), read with the summary
from ._causes import sample_causes as sample_causes
from ._numpy import LazyNumpy
from ._stored import causes_of, count, finite, is_int, mapping, overdue, sample_key, seconds, string, times
from ._table import MAX_TOOLS as MAX_TOOLS  # defined with the table, which bounds tool calls as it merges them
from ._table import OTHER_TOOLS as OTHER_TOOLS
from ._table import PERCENTILES, OverdueSample, PhaseTable, StepMetrics, bound_tools
from ._verdicts import FAILED as FAILED  # the one verdict rule (its own module), read with the summary
from ._verdicts import HUNG as HUNG
from ._verdicts import OK as OK
from ._verdicts import SLOW as SLOW
from ._verdicts import VERDICTS as VERDICTS
from ._verdicts import verdict as verdict

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
else:
    np = LazyNumpy(globals(), "np")

SCHEMA_VERSION = 3
"""Version 3 adds ``top`` and ``failed`` (what ``report --step`` prints, without the step's sample spans);
version 2 added ``engine``, ``causes`` and the slowest sample's cause; versions 1 and 2 still read."""
_READABLE_VERSIONS = (1, 2, 3)
TOP_STORED = 16
"""The slowest samples a summary lists (``top``): ``report --top`` up to this many reads no sample spans."""
FAILED_STORED = 1024
"""The failed samples a summary lists by key (``failed``, lowest keys first); its ``counts`` has them all."""


@dataclass(frozen=True, slots=True)
class Distribution:
    """Seconds of one phase (per sample: the wall time its spans of the phase cover) or of one tool (per call)
    in one step. Percentiles interpolate linearly, as ``agent_loop/<phase>/p50`` does."""

    count: int
    p50: float
    p90: float
    p99: float
    max: float
    mean: float
    sum: float

    @classmethod
    def of(cls, values: npt.ArrayLike) -> Distribution:
        a = np.asarray(values, dtype=np.float64)
        if not a.size:
            return cls(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        p50, p90, p99 = (float(v) for v in np.percentile(a, PERCENTILES))
        return cls(int(a.size), p50, p90, p99, float(a.max()), float(a.mean()), float(a.sum()))

    def to_list(self) -> list[float]:
        return [self.count, self.p50, self.p90, self.p99, self.max, self.mean, self.sum]

    @classmethod
    def from_list(cls, raw: object) -> Distribution:
        if not isinstance(raw, list) or len(raw) != 7:
            raise ValueError("a distribution is a list of 7 numbers")
        number, *rest = (finite(v) for v in raw)
        if number < 0 or not float(number).is_integer():
            raise ValueError("a distribution's count is not a non-negative integer")
        return cls(int(number), *rest)

    @classmethod
    def of_seconds(cls, raw: object) -> Distribution:
        """:meth:`from_list` of a distribution of durations: no value negative."""
        for v in raw if isinstance(raw, list) else ():
            seconds(v)
        return cls.from_list(raw)


@dataclass(frozen=True, slots=True)
class SlowestSample:
    """verl's slowest sample of the step (argmax of generate + tool + score seconds) and its phase mix."""

    index: int
    rollout: int
    trace_id: str | None
    generate_s: float
    tool_s: float
    score_s: float
    verdict: str = OK
    cause: str = ""

    @property
    def total_s(self) -> float:
        return self.generate_s + self.tool_s + self.score_s


@dataclass(frozen=True)
class StepSummary:
    """The facts of one collected step (one collect; ``late`` samples of a later collect are another summary).

    Times are Unix nanoseconds on the samples' wall clock (0 when unknown). ``wall_s`` runs from the first
    sample's start to the last finished sample's end; ``median_s`` to the end of the median finished sample; the
    tail (``tail_s``) is the rest. ``metrics`` is exactly the dict ``collect()`` returned (verl's keys and ours).
    ``counts`` has every verdict of :data:`VERDICTS`. ``hung``/``slow`` are the samples the watchdog reported.
    ``engine``: each statistic of ``semconv.ENGINE_STATS`` over the step's turns with engine timing (empty
    without). ``causes``: :func:`cause` of the slowest sample and of each slow one, by (index, rollout).
    ``top``: the :data:`TOP_STORED` slowest collected samples, slowest first (``PhaseTable.slowest``'s order), each
    with its verdict and cause; ``failed``: the (index, rollout) of the first :data:`FAILED_STORED` failed ones,
    sorted (both empty in summaries older than version 3: :attr:`lists_complete` says what they cover).
    """

    step: int
    validate: bool
    num_samples: int
    metrics: Mapping[str, float]
    phases: Mapping[str, Distribution]
    tools: Mapping[str, Distribution]
    counts: Mapping[str, int]
    slowest: SlowestSample | None = None
    start_ns: int = 0
    median_end_ns: int = 0
    end_ns: int = 0
    collected_ns: int = 0
    hung: tuple[OverdueSample, ...] = ()
    slow: tuple[OverdueSample, ...] = ()
    staleness_mean: float | None = None
    staleness_max: float | None = None
    extra: Mapping[str, object] = field(default_factory=dict)
    engine: Mapping[str, Distribution] = field(default_factory=dict)
    causes: Mapping[tuple[int, int], str] = field(default_factory=dict)
    top: tuple[SlowestSample, ...] = ()
    failed: tuple[tuple[int, int], ...] = ()
    version: int = SCHEMA_VERSION
    """The schema version it was written with (:meth:`from_json` keeps the stored one)."""

    def top_complete(self, n: int) -> bool:
        """Whether :attr:`top` holds the ``n`` slowest collected samples (or every one, when fewer)."""
        return self.version >= 3 and len(self.top) >= min(n, self.num_samples)

    @property
    def failed_complete(self) -> bool:
        """Whether :attr:`failed` lists every failed sample."""
        return self.version >= 3 and len(self.failed) == self.counts.get(FAILED, 0)

    @property
    def wall_s(self) -> float:
        return max(self.end_ns - self.start_ns, 0) / 1e9 if self.start_ns else 0.0

    @property
    def median_s(self) -> float:
        return max(self.median_end_ns - self.start_ns, 0) / 1e9 if self.start_ns else 0.0

    @property
    def tail_s(self) -> float:
        return max(self.end_ns - self.median_end_ns, 0) / 1e9 if self.start_ns else 0.0

    # -- the record on the wire --------------------------------------------------------------------
    def to_json(self) -> str:
        """Versioned compact JSON (``{"v": 2, ...}``); :meth:`from_json` reads it back equal."""
        body: dict[str, object] = {
            "v": SCHEMA_VERSION,
            "step": self.step,
            "validate": self.validate,
            "n": self.num_samples,
            "metrics": dict(self.metrics),
            "phases": {k: d.to_list() for k, d in self.phases.items()},
            "tools": {k: d.to_list() for k, d in self.tools.items()},
            "counts": dict(self.counts),
            "t": [self.start_ns, self.median_end_ns, self.end_ns, self.collected_ns],
            "hung": [list(s) for s in self.hung],
            "slow": [list(s) for s in self.slow],
        }
        if self.slowest is not None:
            body["slowest"] = _sample_list(self.slowest)
        if self.staleness_mean is not None:
            body["staleness"] = [self.staleness_mean, self.staleness_max]
        if self.extra:
            body["extra"] = dict(self.extra)
        if self.engine:
            body["engine"] = {k: d.to_list() for k, d in self.engine.items()}
        if self.causes:
            body["causes"] = [[k[0], k[1], text] for k, text in sorted(self.causes.items())]
        body["top"] = [_sample_list(s) for s in self.top]
        body["failed"] = [list(k) for k in self.failed]
        return json.dumps(body, separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> StepSummary:
        """Read :meth:`to_json`'s output, of this version or version 1; raises ``ValueError`` saying what is wrong
        (stored data is untrusted)."""
        try:
            body = json.loads(text)
        except RecursionError:
            raise ValueError("the summary nests too deeply") from None
        if not isinstance(body, dict) or body.get("v") not in _READABLE_VERSIONS or type(body.get("v")) is not int:
            raise ValueError(f"not a version-{SCHEMA_VERSION} (or 1) step summary")
        start_ns, median_end_ns, end_ns, collected_ns = times(body.get("t"))
        slowest = None if body.get("slowest") is None else _sample(body["slowest"])
        top = body.get("top", [])
        failed = body.get("failed", [])
        if not (isinstance(top, list) and isinstance(failed, list)):
            raise ValueError("the summary's top or failed samples are not lists")
        staleness = body.get("staleness")
        if staleness is not None and not (isinstance(staleness, list) and len(staleness) == 2):
            raise ValueError("the summary's staleness is malformed")
        step, n = body.get("step"), body.get("n")
        if not (isinstance(step, int) and is_int(step) and isinstance(n, int) and is_int(n) and n >= 0):
            raise ValueError("the summary's step or sample count is not an integer")
        raw_counts = mapping(body.get("counts"), "counts")
        counts = {v: count(raw_counts.get(v, 0), f"{v} count") for v in VERDICTS}
        if counts[OK] + counts[FAILED] + counts[SLOW] != n:  # summarize() counts each collected sample once
            raise ValueError(f"the summary's verdict counts do not add up to its {n} samples")
        metrics = {str(k): finite(v) for k, v in mapping(body.get("metrics"), "metrics").items()}
        for key, value in metrics.items():
            if value < 0 and key.startswith(_PHASE_METRICS):
                raise ValueError(f"the summary's {key[:60]} is negative")
        return cls(
            step=step,
            validate=body.get("validate") is True,
            num_samples=n,
            metrics=metrics,
            phases={str(k): Distribution.of_seconds(v) for k, v in mapping(body.get("phases"), "phases").items()},
            tools={str(k): Distribution.of_seconds(v) for k, v in mapping(body.get("tools"), "tools").items()},
            counts=counts,
            slowest=slowest,
            start_ns=start_ns,
            median_end_ns=median_end_ns,
            end_ns=end_ns,
            collected_ns=collected_ns,
            hung=overdue(body.get("hung")),
            slow=overdue(body.get("slow")),
            staleness_mean=None if staleness is None else finite(staleness[0]),
            staleness_max=None if staleness is None else finite(staleness[1]),
            extra=mapping(body.get("extra"), "extra"),
            engine={str(k): Distribution.from_list(v) for k, v in mapping(body.get("engine"), "engine").items()},
            causes=causes_of(body.get("causes")),
            top=tuple(_sample(raw) for raw in top),
            failed=tuple(sample_key(raw) for raw in failed),
            version=body["v"],
        )


_PHASE_METRICS = tuple(f"{sc.METRIC_PREFIX}/{phase}/" for phase in sc.PHASES)
"""Metrics of phase seconds (``agent_loop/generate_sequences/p50``): a stored one that is negative is garbage."""


def _sample_list(s: SlowestSample) -> list[object]:
    return [
        s.index,
        s.rollout,
        s.trace_id,
        s.generate_s,
        s.tool_s,
        s.score_s,
        s.verdict,
        *([s.cause] if s.cause else []),
    ]


def _sample(raw: object) -> SlowestSample:
    if not isinstance(raw, list) or len(raw) not in (7, 8) or not is_int(raw[0]) or not is_int(raw[1]):
        raise ValueError("a summary's sample is malformed")
    return SlowestSample(
        raw[0],
        raw[1],
        raw[2] if isinstance(raw[2], str) else None,
        seconds(raw[3]),
        seconds(raw[4]),
        seconds(raw[5]),
        _verdict(raw[6]),
        string(raw[7]) if len(raw) == 8 else "",
    )


def _verdict(v: object) -> str:
    if v not in VERDICTS:
        raise ValueError(f"{v!r:.40} is not a verdict")
    return str(v)


def summarize(
    table: PhaseTable,
    metrics: StepMetrics,
    step: int,
    validate: bool = False,
    *,
    tools: Mapping[str, Iterable[float]] | None = None,
    collected_ns: int = 0,
    staleness: npt.ArrayLike | None = None,
) -> StepSummary:
    """The summary of one collected step: ``table`` and ``metrics`` exactly as ``collect()`` computed and returned
    them (its ``hung_samples``/``slow_samples`` give the watchdog's verdicts); ``tools``: each tool's call
    durations in seconds (default: the table's own, :attr:`PhaseTable.tools`); ``staleness``: per-sample
    staleness (async modes)."""
    t = table.canonical()
    slow_keys = {(s.sample_index, s.rollout_n) for s in metrics.slow_samples}
    reported = {(s.sample_index, -1 if s.rollout_n is None else s.rollout_n) for s in metrics.slow_samples}
    i = int(np.argmax(t.total)) if len(t) else -1
    wanted = [(index, -1 if r is None else r) for index, r in slow_keys if index is not None]
    if i >= 0:
        wanted.append(_key_of(t, i))
    top_rows = t.slowest_rows(TOP_STORED)
    top_keys = [_key_of(t, j) for j in top_rows]
    top_causes = sample_causes(t, metrics, [*wanted, *top_keys])  # one pass: the step's percentiles once
    causes = {key: top_causes[key] for key in wanted if key in top_causes}
    start_ns, median_end_ns, end_ns = _times(t)
    stale = None if staleness is None else np.asarray(staleness, dtype=np.float64)
    return StepSummary(
        step=step,
        validate=validate,
        num_samples=len(t),
        metrics={k: float(v) for k, v in metrics.items()},
        phases={
            sc.GENERATE: Distribution.of(t.generate_sequences),
            sc.TOOL_CALLS: Distribution.of(t.tool_calls),
            sc.COMPUTE_SCORE: Distribution.of(t.compute_score),
        },
        tools=_tool_distributions(table.tools if tools is None else tools),
        counts=_counts(t, slow_keys, len(metrics.hung_samples)),
        slowest=_sample_of(t, i, wanted[-1], key_in=slow_keys, causes=causes) if i >= 0 else None,
        start_ns=start_ns,
        median_end_ns=median_end_ns,
        end_ns=end_ns,
        collected_ns=collected_ns,
        hung=tuple(metrics.hung_samples),
        slow=tuple(metrics.slow_samples),
        staleness_mean=float(stale.mean()) if stale is not None and stale.size else None,
        staleness_max=float(stale.max()) if stale is not None and stale.size else None,
        engine={k: Distribution.of(v) for k, v in t.engine.stats().items() if v.size} if len(t.engine) else {},
        causes=causes,
        top=tuple(
            _sample_of(t, j, key, key_in=reported, causes=top_causes) for j, key in zip(top_rows, top_keys, strict=True)
        ),
        failed=tuple(sorted(_key_of(t, int(j)) for j in np.flatnonzero(t.error))[:FAILED_STORED]),
    )


def _key_of(t: PhaseTable, i: int) -> tuple[int, int]:
    return int(t.sample_index[i]), int(t.rollout_n[i])


def _counts(t: PhaseTable, slow_keys: set[tuple[int | None, int | None]], hung: int) -> dict[str, int]:
    """How many samples have each verdict: the collected rows' and the ``hung`` ones the watchdog reported."""
    counts: dict[str, int] = dict.fromkeys(VERDICTS, 0)
    counts[HUNG] = hung
    for i in range(len(t)):
        counts[verdict(error=bool(t.error[i]), reported=_key_of(t, i) in slow_keys, finished=True)] += 1
    return counts


def _sample_of(
    t: PhaseTable,
    i: int,
    key: tuple[int, int],
    *,
    key_in: set[tuple[int | None, int | None]] | set[tuple[int | None, int]],
    causes: Mapping[tuple[int, int], str],
) -> SlowestSample:
    """Row ``i`` of ``t`` (``key``) as a stored sample: reported by the watchdog when ``key`` is in ``key_in``."""
    return SlowestSample(
        key[0],
        key[1],
        t.trace_id_hex(i),
        float(t.generate_sequences[i]),
        float(t.tool_calls[i]),
        float(t.compute_score[i]),
        verdict(error=bool(t.error[i]), reported=key in key_in, finished=True),
        causes.get(key, ""),
    )


def _times(t: PhaseTable) -> tuple[int, int, int]:
    """The first sample's start, the median finished sample's end and the last one's (Unix ns; 0: unknown)."""
    start_ns = median_end_ns = end_ns = 0
    starts, ends = t.start_ns, t.end_ns
    known = ends > 0
    if np.any(known):
        start_ns = int(starts[known & (starts > 0)].min()) if np.any(known & (starts > 0)) else 0
        finished = np.sort(ends[known])
        end_ns = int(finished[-1])
        median_end_ns = int(finished[(len(finished) - 1) // 2])
    return start_ns, median_end_ns, end_ns


def _tool_distributions(tools: Mapping[str, Iterable[float]]) -> dict[str, Distribution]:
    """One distribution per tool name, the :data:`MAX_TOOLS` most called by name; the others pooled
    (:func:`bound_tools`, as :meth:`PhaseTable.concat` merges them). Calls are sorted first, so the sum and
    mean do not depend on the order spans arrived in (a file and Jaeger give the same bits)."""
    calls = {name: np.fromiter(values, dtype=np.float64) for name, values in tools.items()}
    return {name: Distribution.of(np.sort(values)) for name, values in bound_tools(calls).items()}
