"""Trace sampling that never changes the metrics.

:class:`MetricsSampler` wraps every sampler ``configure()`` installs. A span the metrics read (a step, a
sample, a phase: :func:`metrics_span`) that the sampler would DROP (below an unsampled remote parent, a root a
ratio sampler rejects) is RECORD_ONLY instead, so it still reaches the metrics processor while the export
processors skip it: exported traces follow the parent's (and the sampler's) decision, the metrics count every
sample. Any other span (a user's own SDK span) gets the sampler's answer unchanged.

With a budget it also decides per *sample* (at the ``rl.sample`` root) whether its trace is exported, and never
answers DROP for spans of a sample: an over-budget sample is RECORD_ONLY, so every span still reaches the
metrics processor (``collect()`` stays exact under any budget or ratio) while the export processors skip it.
The wrapped sampler still decides first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import DEFAULT_ON, Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, get_current_span
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from .. import semconv as sc
from ..config._fork import after_fork_in_child


def metrics_span(name: str, attributes: Attributes) -> bool:
    """Whether a span is one the metrics read: a step or sample span, or one that carries ``rl.phase`` or a
    sample's identity (every phase span the library starts does)."""
    if name == sc.SAMPLE_SPAN or name == sc.STEP_SPAN:
        return True
    if not attributes:
        return False
    return sc.RL_PHASE in attributes or sc.RL_SAMPLE_INDEX in attributes


class MetricsSampler(Sampler):
    """``inner`` (``OTEL_TRACES_SAMPLER`` or the user's sampler), except that the metrics never lose a span.

    - A span the metrics read (:func:`metrics_span`) that ``inner`` would DROP is RECORD_ONLY instead.
    - With ``max_samples_per_step``, at most that many samples per (step, validate) in this process are exported,
      whole prompts: a prompt (``rl.sample.index``) is admitted while fewer samples were admitted this step, and
      every rollout of an admitted prompt is admitted (the budget is rounded up to whole prompts). ``None``: no
      budget. State: the admitted prompts of the last ``max_steps`` steps.
    - ``selective`` (a budget, or an ``inner`` other than the default ``ParentBased(ALWAYS_ON)``): some samples
      are recorded but not exported. Then a span below a local parent follows it without asking ``inner``, and is
      never dropped (a record-only sample's phases must be recorded); and the fast path asks for every new root
      (``asks_roots``), which it need not for the default sampler.
    """

    def __init__(self, inner: Sampler, max_samples_per_step: int | None = None, *, max_steps: int = 8) -> None:
        if max_samples_per_step is not None and max_samples_per_step < 0:
            raise ValueError(f"max_samples_per_step must be >= 0 or None, not {max_samples_per_step}")
        self.inner = inner
        self.budget = max_samples_per_step
        self.max_steps = max_steps
        self.selective = self.asks_roots = (
            max_samples_per_step is not None or inner.get_description() != DEFAULT_ON.get_description()
        )
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
        # NB: the SDK gives the span the *result's* attributes (a DROP carries none): each result made here
        # carries the span's own.
        a_sample = name == sc.SAMPLE_SPAN and bool(attributes)
        if self.selective and not a_sample:
            parent = get_current_span(parent_context).get_span_context()
            if parent.is_valid and not parent.is_remote:
                decision = Decision.RECORD_AND_SAMPLE if parent.trace_flags.sampled else Decision.RECORD_ONLY
                return SamplingResult(decision, attributes, parent.trace_state)
        result = self.inner.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)
        if result.decision is Decision.DROP and metrics_span(name, attributes):
            result = SamplingResult(Decision.RECORD_ONLY, attributes, result.trace_state)
        if self.selective and a_sample and not (result.decision.is_sampled() and self._admit(attributes)):
            return SamplingResult(Decision.RECORD_ONLY, attributes, result.trace_state)
        return result

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
        budget = "" if self.budget is None else f"{self.budget},"
        return f"MetricsSampler{{{budget}{self.inner.get_description()}}}"
