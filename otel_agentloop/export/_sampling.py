"""Trace budgets that never change the metrics.

:class:`BudgetSampler` decides per *sample* (at the ``rl.sample`` root) whether its trace is exported, and
never answers DROP for spans of a sample: an over-budget sample is RECORD_ONLY, so every span still reaches
the metrics processor (``collect()`` stays exact under any budget or ratio) while the export processors skip
it. The wrapped sampler (``OTEL_TRACES_SAMPLER`` or the user's) still decides first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, get_current_span
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from .. import semconv as sc
from ..core._guard import after_fork_in_child


class BudgetSampler(Sampler):
    """Export at most ``max_samples_per_step`` samples per (step, validate) in this process, whole prompts.

    A prompt (``rl.sample.index``) is admitted while fewer than ``max_samples_per_step`` samples were admitted
    this step; every rollout of an admitted prompt is admitted, so the budget is rounded up to whole prompts.
    ``None`` means no budget (only the wrapped sampler decides). State: the admitted prompts of the last
    ``max_steps`` steps.
    """

    def __init__(self, inner: Sampler, max_samples_per_step: int | None = None, *, max_steps: int = 8) -> None:
        if max_samples_per_step is not None and max_samples_per_step < 0:
            raise ValueError(f"max_samples_per_step must be >= 0 or None, not {max_samples_per_step}")
        self.inner = inner
        self.budget = max_samples_per_step
        self.max_steps = max_steps
        self._admitted: OrderedDict[tuple[object, bool], tuple[set[int], list[int]]] = OrderedDict()
        self._lock = threading.Lock()
        after_fork_in_child(self, "_after_fork")

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        # NB: the SDK gives the span the *result's* attributes, so every result below carries them.
        if name == sc.SAMPLE_SPAN and attributes:
            result = self.inner.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)
            if result.decision.is_sampled() and self._admit(attributes):
                return result
            return SamplingResult(Decision.RECORD_ONLY, attributes, result.trace_state)
        parent = get_current_span(parent_context).get_span_context()
        if parent.is_valid and not parent.is_remote:
            # Below a local parent, follow it, but never drop: a record-only sample's phases must be recorded.
            decision = Decision.RECORD_AND_SAMPLE if parent.trace_flags.sampled else Decision.RECORD_ONLY
            return SamplingResult(decision, attributes, parent.trace_state)
        return self.inner.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def _admit(self, attributes: Attributes) -> bool:
        if self.budget is None:
            return True
        assert attributes is not None
        index = attributes.get(sc.RL_SAMPLE_INDEX)
        key = sc.step_key(attributes)
        with self._lock:
            entry = self._admitted.get(key)
            if entry is None:
                while len(self._admitted) >= self.max_steps:
                    self._admitted.popitem(last=False)
                entry = self._admitted[key] = (set(), [0])
            prompts, count = entry
            if index in prompts:
                count[0] += 1
                return True
            if count[0] >= self.budget:
                return False
            prompts.add(index)  # type: ignore[arg-type]
            count[0] += 1
            return True

    def get_description(self) -> str:
        return f"BudgetSampler{{{self.budget},{self.inner.get_description()}}}"
