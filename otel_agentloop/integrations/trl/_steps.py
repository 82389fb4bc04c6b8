"""A GRPOTrainer step's end: its ``rl.step`` span closed, its metrics collected and kept for TRL's next log.

The step is collected at TRL's ``on_step_end`` (after the optimizer step), with ``handle.metrics.collect``: the
``agent_loop/*`` dict, and the step's ``rl.step.summary`` that ``report --run`` reads. Until TRL logs (every
``logging_steps``), collected steps wait in the trainer's state; the log gets their mean per key (TRL averages
its own metrics over the same steps), and :func:`last_metrics` keeps the latest step's dict.
"""

from __future__ import annotations

from collections.abc import MutableMapping

from ...core._guard import internal_error
from ._state import TrainerState

MAX_PENDING = 256
"""Collected steps kept for the next log at most (a run that never logs keeps only the latest)."""
_last: list[tuple[int, dict[str, float]]] = []


def close_step(st: TrainerState, exc: BaseException | None, *, collect: bool) -> None:
    """End the open optimizer phase and step (with ``exc``); with ``collect``, collect the step. Never raises."""
    phase, st.optimizer = st.optimizer, None
    block, st.step = st.step, None
    number, st.step_no = st.step_no, None
    try:
        if phase is not None:
            phase.__exit__(type(exc) if exc is not None else None, exc, None)
        if block is not None:
            block.__exit__(type(exc) if exc is not None else None, exc, None)
    except Exception:
        internal_error("trl.step.close")
    if not collect or block is None or number is None:
        return
    try:
        from ...setup import current_handle

        handle = current_handle()
        if handle is None:
            return
        metrics = {k: float(v) for k, v in handle.metrics.collect(number).items()}
        st.pending.append(metrics)
        del st.pending[:-MAX_PENDING]
        _last[:] = [(number, metrics)]
    except Exception:
        internal_error("trl.step.collect")


def merge_metrics(st: TrainerState, logs: MutableMapping[str, object]) -> None:
    """Add the pending steps' metrics to ``logs`` (mean per key over the steps that have it); TRL's own keys are
    never replaced. Never raises."""
    pending, st.pending = st.pending, []
    try:
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for metrics in pending:
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value
                counts[key] = counts.get(key, 0) + 1
        for key, total in sums.items():
            if key not in logs:
                logs[key] = total / counts[key]
    except Exception:
        internal_error("trl.log.merge")


def last_metrics() -> tuple[int, dict[str, float]] | None:
    """The latest collected step of this process: ``(step, its agent_loop/* dict)``, or ``None``."""
    return _last[0] if _last else None
