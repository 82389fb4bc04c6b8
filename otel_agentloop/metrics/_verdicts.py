"""Each sample's one verdict (:func:`verdict`), and the watchdog's step verdicts as data: what ``collect()`` adds
to verl's dict, and what ``report`` reads back.

Each sample has one verdict, the same in the live view, ``collect()``, ``report``, the pages and the PNGs:
``hung`` (the watchdog reported it and it was still running when its step was collected), else ``failed`` (its
sample span ended with an error), else ``slow`` (the watchdog reported it and it finished before the collect),
else ``ok``. The step summary (``_summary``) stores them. Here too: the per-process record of the samples
the watchdog reported in a step (:class:`Verdict`, made when the step is collected), the keys it adds to the
metrics (:func:`apply_verdicts`, also over several Ray workers), and the same facts for a stored step
(:class:`StepVerdicts`), so the live side and ``report`` decide hung/slow/failed the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .. import semconv as sc
from ._table import OverdueSample, StepMetrics

SampleKey = tuple[int, int]

OK: str = "ok"
FAILED: str = "failed"
SLOW: str = "slow"
HUNG: str = "hung"
VERDICTS: tuple[str, ...] = (OK, FAILED, SLOW, HUNG)
"""Every verdict, mildest first."""


def verdict(*, error: bool, reported: bool, finished: bool) -> str:
    """The one verdict of a sample (see the module docstring). ``reported``: the watchdog reported it during its
    step; ``finished``: its sample span ended before the step was collected."""
    if reported and not finished:
        return HUNG
    if error:
        return FAILED
    return SLOW if reported else OK


@dataclass(frozen=True)
class Verdict:
    """One step's reported samples: ``slow`` finished before collection, ``hung`` did not."""

    slow: tuple[OverdueSample, ...] = ()
    hung: tuple[OverdueSample, ...] = ()


def classify_reported(*, finished: bool) -> str:
    """``HUNG`` or ``SLOW`` for a sample the watchdog reported, by :func:`verdict` (``finished``: its sample
    span ended before its step was collected). The watchdog's keys count reported samples by this alone; a
    reported sample that finished with an error is ``slow`` there and ``failed`` as a sample."""
    return HUNG if verdict(error=False, reported=True, finished=finished) == HUNG else SLOW


def apply_verdicts(metrics: StepMetrics, verdicts: Sequence[Verdict]) -> None:
    """Add ``agent_loop/watchdog/{slow,hung}`` and ``slow_trace_ids``/``hung_trace_ids`` to ``metrics``, merging
    the verdicts of several processes (Ray workers); nothing when no sample was reported."""
    slow = tuple(s for v in verdicts for s in v.slow)
    hung = tuple(s for v in verdicts for s in v.hung)
    if not (slow or hung):  # like slowest/prompt_length: only when there is something to say
        return
    metrics[f"{sc.METRIC_PREFIX}/{sc.WATCHDOG_SLOW}"] = float(len(slow))
    metrics[f"{sc.METRIC_PREFIX}/{sc.WATCHDOG_HUNG}"] = float(len(hung))
    metrics.slow_trace_ids = tuple(s.trace_id for s in slow)
    metrics.hung_trace_ids = tuple(s.trace_id for s in hung)
    metrics.slow_samples = slow
    metrics.hung_samples = hung


def sample_key(item: OverdueSample) -> SampleKey | None:
    """(sample_index, rollout_n) of a reported sample (rollout -1 when unknown), ``None`` without an index."""
    if item.sample_index is None:
        return None
    return (item.sample_index, item.rollout_n if item.rollout_n is not None else -1)


@dataclass(frozen=True)
class StepVerdicts:
    """The watchdog's classification of one step, keyed by sample, and where it came from.

    ``source`` is ``"summary"`` (the step's ``rl.step.summary`` record, written at collect: exact) or
    ``"snapshots"`` (rebuilt from the watchdog's snapshot spans, see ``analysis._report.step_verdicts``).
    """

    hung: Mapping[SampleKey, OverdueSample]
    slow: Mapping[SampleKey, OverdueSample]
    source: str

    @classmethod
    def of(cls, verdict_: Verdict, source: str) -> StepVerdicts:
        hung = {k: s for s in verdict_.hung if (k := sample_key(s)) is not None}
        slow = {k: s for s in verdict_.slow if (k := sample_key(s)) is not None and k not in hung}
        return cls(hung, slow, source)

    def of_sample(self, key: SampleKey, *, error: bool) -> str:
        """The verdict of sample ``key`` (``error``: its sample span ended with an error)."""
        reported = key in self.hung or key in self.slow
        return verdict(error=error, reported=reported, finished=key not in self.hung)

    def as_verdict(self) -> Verdict:
        return Verdict(tuple(self.slow.values()), tuple(self.hung.values()))


def count_verdicts(verdicts: Iterable[str]) -> dict[str, int]:
    """How many of each verdict (every one of :data:`VERDICTS`, mildest first, zeros included)."""
    counts = dict.fromkeys(VERDICTS, 0)
    for v in verdicts:
        counts[v] += 1
    return counts


__all__ = [
    "FAILED",
    "HUNG",
    "OK",
    "SLOW",
    "StepVerdicts",
    "Verdict",
    "apply_verdicts",
    "classify_reported",
    "count_verdicts",
    "sample_key",
]
