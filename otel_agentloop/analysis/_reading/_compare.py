"""``report --compare A B``: two steps side by side, and what explains the difference in their step time.

Each step is read as its :class:`StepSummary`: the one the live side stored (``rl.step.summary``), else rebuilt
from the step's sample spans by :func:`summary_of` (the code ``collect()`` runs), so every figure here equals the
metrics of ``report --step``. The per-sample rows (the tail's phase mix, the samples that moved) need the sample
spans; with summaries only, the comparison says so and falls back to the slowest sample.

What explains the difference (:func:`explain`): a step waits for its slowest sample, so its time is made at the
slow end. The *tail* of a step is its slowest :data:`TAIL_FRACTION` of samples (by generate + tool + score
seconds, at least one); its *mix* is the mean seconds per tail sample in each phase, and in each tool (the sum of
that sample's calls of the tool). The cause is the phase whose tail time moved most in the direction of the step
time, when it carries at least :data:`MAJORITY` (two thirds) of the tail's movement in that direction; within
``tool_calls``, the tool named by the same rule. No cause is named when the step time moved less than the noise
threshold (:data:`NOISE_REL` of step A's time, at least :data:`NOISE_ABS_S`), when the tail's phases moved less than
:data:`MIN_COVERAGE` of the step-time change (the time went elsewhere: waiting, scheduling), or when no phase
holds the majority (several causes, listed with their shares).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ... import semconv as sc
from ...metrics._records import SpanRecord
from ...metrics._summary import StepSummary
from ...metrics._table import PhaseTable
from ._report import build_report, stored_summaries, summary_of

SampleKey = tuple[int, int]

TAIL_FRACTION = 0.10
"""The tail of a step: its slowest 10% of samples (at least one)."""
NOISE_REL = 0.10
"""A step-time change under 10% of step A's time is noise ..."""
NOISE_ABS_S = 0.05
"""... and so is one under 50 ms."""
MAJORITY = 2 / 3
"""A phase (a tool) is the cause when it carries at least two thirds of the tail's movement: twice as much as all
the others together."""
MIN_COVERAGE = 0.25
"""The tail's phases must move by at least a quarter of the step-time change to explain it."""
STATS = ("p50", "p90", "p99", "max")


# -- the rule -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TailMix:
    """Mean seconds per sample, in each phase and each tool, over a step's slowest samples (``samples`` of them;
    ``basis`` says which: e.g. ``"slowest 10% (7 of 64 samples)"``)."""

    samples: int
    phases: Mapping[str, float]
    tools: Mapping[str, float]
    basis: str


@dataclass(frozen=True)
class Cause:
    """What explains the step-time change from A to B (see the module docstring).

    ``phase``/``tool`` are ``None`` when no cause (no tool) is named; ``phase_deltas``/``tool_deltas`` are the
    tail's B - A seconds per sample; ``phase_share``/``tool_share`` the named one's part of the tail's movement in
    the step's direction (0 when none is named). ``text``: one sentence for people."""

    step_delta_s: float
    threshold_s: float
    phase: str | None
    tool: str | None
    phase_share: float
    tool_share: float
    phase_deltas: Mapping[str, float]
    tool_deltas: Mapping[str, float]
    text: str

    @property
    def clear(self) -> bool:
        return self.phase is not None


def _leader(deltas: Mapping[str, float], sign: float) -> tuple[str | None, float, float]:
    """The key whose delta moved most in the direction ``sign``, its share of the movement in that direction,
    and that movement (the sum of the positive parts); ``(None, 0, 0)`` when nothing moved that way."""
    moved = {k: sign * v for k, v in deltas.items() if sign * v > 0}
    total = sum(moved.values())
    if not moved or total <= 0:
        return None, 0.0, 0.0
    name = max(sorted(moved), key=lambda k: moved[k])
    return name, moved[name] / total, total


def explain(
    step_a_s: float,
    step_b_s: float,
    tail_a: TailMix,
    tail_b: TailMix,
    *,
    noise_rel: float = NOISE_REL,
    noise_abs_s: float = NOISE_ABS_S,
    majority: float = MAJORITY,
    min_coverage: float = MIN_COVERAGE,
) -> Cause:
    """Which phase (and which tool) explains the step time going from ``step_a_s`` to ``step_b_s``, given the
    tails' mixes; pure (see the module docstring for the rule)."""
    delta = step_b_s - step_a_s
    threshold = max(noise_abs_s, noise_rel * max(step_a_s, 0.0))
    phases = {p: tail_b.phases.get(p, 0.0) - tail_a.phases.get(p, 0.0) for p in sc.PHASES}
    tools = {t: tail_b.tools.get(t, 0.0) - tail_a.tools.get(t, 0.0) for t in sorted({*tail_a.tools, *tail_b.tools})}
    verb = "slower" if delta > 0 else "faster"

    def cause(
        text: str, phase: str | None = None, share: float = 0.0, tool: str | None = None, tshare: float = 0.0
    ) -> Cause:
        return Cause(delta, threshold, phase, tool, share, tshare, phases, tools, text)

    if not abs(delta) >= threshold:  # also NaN
        return cause(
            f"no clear cause: the step time changed by {delta:+.3f} s, under the noise threshold of "
            f"{threshold:.3f} s ({noise_rel:.0%} of step A's time, at least {noise_abs_s * 1e3:.0f} ms)"
        )
    sign = 1.0 if delta > 0 else -1.0
    phase, share, moved = _leader(phases, sign)
    if phase is None or moved < min_coverage * abs(delta):
        return cause(
            f"no clear cause: the step got {abs(delta):.3f} s {verb}, but its slowest samples' phase times moved "
            f"by only {moved:.3f} s in that direction (the time went elsewhere: waiting, scheduling, samples "
            "outside the tail)"
        )
    if share < majority:
        parts = ", ".join(f"{p} {d:+.3f} s" for p, d in sorted(phases.items(), key=lambda kv: -sign * kv[1]))
        return cause(f"no single cause: the step got {abs(delta):.3f} s {verb}; the slowest samples moved by {parts}")
    head = (
        f"the step got {abs(delta):.3f} s {verb}; its slowest samples ({tail_b.basis}) spent "
        f"{phases[phase]:+.3f} s in {phase} ({share:.0%} of their phase-time change)"
    )
    if phase != sc.TOOL_CALLS or not tools:
        return cause(f"{phase}: {head}", phase, share)
    tool, tshare, _ = _leader(tools, sign)
    if tool is None or tshare < majority:
        parts = ", ".join(f"{t} {d:+.3f} s" for t, d in sorted(tools.items(), key=lambda kv: -sign * kv[1])[:4])
        return cause(f"{phase} (no single tool): {head}; by tool: {parts}", phase, share)
    text = f"tool {tool} ({phase}): {head}, of which {tool} {tools[tool]:+.3f} s ({tshare:.0%} of the tools' change)"
    return cause(text, phase, share, tool, tshare)


# -- one step's data --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepSide:
    """One step of the comparison: its summary (``stored``: written by the live side, else rebuilt from spans),
    and, when its sample spans are there, the per-sample table and each sample's seconds per tool."""

    summary: StepSummary
    stored: bool
    table: PhaseTable | None = None
    sample_tools: Mapping[SampleKey, Mapping[str, float]] = field(default_factory=dict)

    @property
    def has_samples(self) -> bool:
        return self.table is not None and len(self.table) > 0

    def tail(self, fraction: float = TAIL_FRACTION, *, summary_only: bool = False) -> TailMix:
        """The mix of this step's slowest ``fraction`` of samples; from the summary (without sample spans, or with
        ``summary_only``), its slowest sample, and each tool's seconds per sample over all samples (per-sample
        tool times need the spans)."""
        if self.table is not None and len(self.table) and not summary_only:
            t = self.table.canonical()
            n = len(t)
            k = max(1, math.ceil(n * fraction))
            top = np.argsort(-t.total, kind="stable")[:k]
            phases = {
                sc.GENERATE: float(t.generate_sequences[top].mean()),
                sc.TOOL_CALLS: float(t.tool_calls[top].mean()),
                sc.COMPUTE_SCORE: float(t.compute_score[top].mean()),
            }
            tools: dict[str, float] = {}
            for i in top:
                for name, seconds in self.sample_tools.get((int(t.sample_index[i]), int(t.rollout_n[i])), {}).items():
                    tools[name] = tools.get(name, 0.0) + seconds / k
            return TailMix(k, phases, tools, f"slowest {fraction:.0%}: {k} of {n} samples")
        s = self.summary
        n = max(s.num_samples, 1)
        tools = {name: d.sum / n for name, d in s.tools.items()}
        if s.slowest is None:
            return TailMix(0, {}, tools, "no samples")
        mix = {sc.GENERATE: s.slowest.generate_s, sc.TOOL_CALLS: s.slowest.tool_s, sc.COMPUTE_SCORE: s.slowest.score_s}
        return TailMix(1, mix, tools, "the slowest sample (summary only; tools over all samples)")


def _sample_spans(records: Iterable[SpanRecord], step: int, validate: bool) -> list[SpanRecord]:
    return [
        r
        for r in records
        if sc.step_key(r.attributes) == (step, validate)
        and not r.attributes.get(sc.RL_SNAPSHOT)
        and r.name != sc.STEP_SUMMARY_SPAN
    ]


def _with_wall_times(summary: StepSummary, spans: Sequence[SpanRecord]) -> StepSummary:
    """``summary`` with its wall times (first start, median and last end of the finished samples) taken from the
    sample spans when it has none."""
    samples = [r for r in spans if r.name == sc.SAMPLE_SPAN and r.end_ns > 0]
    if summary.start_ns or not samples:
        return summary
    ends = sorted(r.end_ns for r in samples)
    starts = [r.start_ns for r in samples if r.start_ns > 0]
    return replace(
        summary, start_ns=min(starts) if starts else 0, median_end_ns=ends[(len(ends) - 1) // 2], end_ns=ends[-1]
    )


def load_step(
    records: Sequence[SpanRecord],
    step: int,
    validate: bool = False,
    stored: Mapping[tuple[int, bool], StepSummary] | None = None,
) -> StepSide | None:
    """Step ``step`` from ``records`` (finished spans of one run); ``None`` when it has neither a stored summary
    nor sample spans. ``stored``: :func:`stored_summaries` of ``records`` (computed when not given)."""
    stored = stored_summaries(records) if stored is None else stored
    spans = _sample_spans(records, step, validate)
    report = build_report(spans, step, validate) if spans else None
    has_rows = report is not None and len(report.table) > 0
    summary = stored.get((step, validate))
    is_stored = summary is not None
    if summary is None:
        if not has_rows:
            return None
        summary = summary_of(spans, step, validate)
    summary = _with_wall_times(summary, spans)
    sample_tools: dict[SampleKey, dict[str, float]] = {}
    for rec in spans:
        name, index = rec.attributes.get(sc.GEN_AI_TOOL_NAME), rec.attributes.get(sc.RL_SAMPLE_INDEX)
        if isinstance(name, str) and isinstance(index, int):
            rollout = rec.attributes.get(sc.RL_ROLLOUT_N)
            per = sample_tools.setdefault((index, rollout if isinstance(rollout, int) else -1), {})
            per[name] = per.get(name, 0.0) + rec.duration_s
    return StepSide(summary, is_stored, report.table if has_rows and report else None, sample_tools)
