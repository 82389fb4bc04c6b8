"""One GRPOTrainer generation batch as samples: a ``rl.sample`` per row, each in a context of its own.

TRL works on the whole batch at once (one ``generate`` call, one call per reward function), so a row's sample
cannot be the current context of one code path as in an agent loop. Each row gets a :class:`contextvars.Context`
of its own in which its ``otel_agentloop.sample`` is entered; its phase spans are opened there (``Context.run``),
so they carry the row's identity and parent, while TRL's code runs in the trainer's own context unchanged.

Rows are numbered as TRL groups them (its ``RepeatSampler`` repeats each prompt ``num_generations`` times in a
row, and TRL's advantages read ``rewards.view(-1, G)``): row ``r`` is prompt ``r // G``, generation ``r % G``.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from opentelemetry.trace import Link
from opentelemetry.util.types import AttributeValue

from ... import semconv as sc
from ...core._clock import monotonic_ns
from ...core._context import _SAMPLE, SampleHandle, sample
from ...core._guard import internal_error
from ...core._lifecycle import finish
from ...core._phase import PhaseSpec, start
from ...core._scope import OpenSpan, span_of

T = TypeVar("T")


class Row:
    """One completion: its context, its entered ``sample`` block and the handle entering returned."""

    __slots__ = ("block", "context", "handle")

    def __init__(self, context: contextvars.Context, block: sample, handle: SampleHandle) -> None:
        self.context = context
        self.block = block
        self.handle = handle

    def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` in this row's context (its sample current)."""
        return self.context.run(fn, *args)


class Batch:
    """The samples of one ``_generate_and_score_completions`` call; ``close`` ends them all."""

    __slots__ = ("closed", "rows")

    def __init__(self, n_rows: int, group: int, first_prompt: int) -> None:
        self.closed = False
        self.rows: list[Row] = []
        group = max(int(group), 1)
        for r in range(n_rows):
            context = contextvars.copy_context()
            block = sample(first_prompt + r // group, r % group)
            handle = context.run(block.__enter__)
            self.rows.append(Row(context, block, handle))

    def close(self, exc: BaseException | None) -> None:
        """End every row's sample (with ``exc`` when the batch failed). Idempotent; never raises."""
        if self.closed:
            return
        self.closed = True
        for row in self.rows:
            try:
                row.run(row.block._exit, exc)
            except Exception:
                internal_error("trl.sample.close")


def open_phase(
    row: Row, spec: PhaseSpec, extra: dict[str, AttributeValue] | None = None, links: Sequence[Link] | None = None
) -> OpenSpan | None:
    """Open (not enter) ``spec``'s span below ``row``'s sample, with its identity and ``links``. Never raises."""
    return row.run(_open_here, spec, extra, links)


def _open_here(
    spec: PhaseSpec, extra: dict[str, AttributeValue] | None, links: Sequence[Link] | None
) -> OpenSpan | None:
    """``spec``'s span below this context's sample (core's one way to open a phase); ``None`` without one."""
    handle = _SAMPLE.get()
    if handle is None or handle.span is None:
        return None
    return start(spec, attach=False, extra=extra, links=links)


class Ending:
    """A moment read once, to end several spans there: each on its own timeline (``monotonic + offset``)."""

    __slots__ = ("mono", "wall")

    def __init__(self) -> None:
        self.mono = monotonic_ns()
        self.wall = time.time_ns()

    def at(self, scope: OpenSpan) -> int:
        offset = scope.offset
        return self.mono + offset if offset is not None else self.wall


def end_phase(
    scope: OpenSpan | None,
    exc: BaseException | None,
    ending: Ending | None = None,
    attributes: dict[str, AttributeValue] | None = None,
) -> None:
    """Set ``attributes`` on ``scope`` and end it at ``ending`` (``None``: now). Never raises."""
    if scope is None:
        return
    try:
        if attributes:
            span_of(scope).set_attributes(attributes)
        finish(scope, exc, ending.at(scope) if ending is not None else None)
    except Exception:
        internal_error("trl.phase.end")


def generation_spec(model: str | None) -> PhaseSpec:
    """A generation turn's spec (``text_completion <model>``), as ``trace_generate(model=...)`` builds it."""
    return PhaseSpec.build(sc.GENERATE, model=model or None)


def reward_spec(name: str) -> PhaseSpec:
    """One reward function's phase: ``rl.reward <name>``, ``rl.phase`` ``compute_score``."""
    return PhaseSpec(
        sc.COMPUTE_SCORE,
        f"{sc.REWARD_SPAN} {name}",
        {sc.RL_REWARD_FUNCTION: name, sc.RL_PHASE: sc.COMPUTE_SCORE},
    )


def tool_spec(name: str) -> PhaseSpec:
    """One tool call: ``execute_tool <name>``."""
    return PhaseSpec.build(sc.TOOL_CALLS, tool=name)
