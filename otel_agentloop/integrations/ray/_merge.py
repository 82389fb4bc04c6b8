"""The driver's view of its workers: their per-step tables and watchdog verdicts merged into verl's metric dict
(and the step's summary), and their running samples gathered."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...core._guard import internal_error, logger
from ...core._inflight import InflightSample
from ...metrics._table import PhaseTable, StepMetrics, compute_metrics
from ...metrics._verdicts import Verdict
from ...setup import write_step_summary
from ._common import own_handle, ray_module
from ._worker import setup_worker


def worker_table(step: int | None, validate: bool = False, *, flush_timeout_s: float = 5.0) -> PhaseTable:
    """This worker's per-sample table of ``step`` (releasing it). Its spans are flushed first, waiting (at most
    ``flush_timeout_s``) only while the backend answers quickly: the table never depends on export, and a dead
    or hung backend must not add the timeout to every step (see :meth:`Handle.request_flush`)."""
    handle = setup_worker()
    handle.request_flush(flush_timeout_s)
    return handle.metrics.take(step, validate)


def merge_metrics(
    tables: Iterable[PhaseTable],
    verdicts: Iterable[Verdict] | None = None,
    *,
    step: int | None = None,
    validate: bool | None = None,
    log: bool = True,
) -> StepMetrics:
    """verl's metric dict over all workers' tables: the same code as single-process ``collect()``.

    ``verdicts``: the workers' watchdog verdicts (:func:`worker_verdict`), merged in as :func:`add_verdicts`
    does (``log``: its driver warning line). Then the step's ``rl.step.summary`` span is written here (the
    driver), from the merged table and verdicts: the step is ``step``/``validate`` when given, else the one
    the tables were taken for (:func:`worker_table`); no summary when the tables disagree or say none. Pass
    the verdicts here rather than to :func:`add_verdicts` afterwards, so the summary holds them."""
    table = PhaseTable.concat(tables)
    metrics = compute_metrics(table)
    if verdicts is not None:
        add_verdicts(metrics, verdicts, step=step, log=log)
    key = table.step_key
    if step is not None or key is not None:
        summary_step = step if step is not None or key is None else key[0]
        summary_validate = validate if validate is not None else key is not None and key[1]
        write_step_summary(table, metrics, summary_step, summary_validate, handle=own_handle())
    return metrics


# -- in-flight samples across workers --------------------------------------------------------------
def inflight(limit: int | None = None) -> list[InflightSample]:
    """This process's running samples (``InflightSample``, oldest first); ``[]`` before ``configure``."""
    handle = own_handle()
    return handle.inflight(limit) if handle is not None else []


def _inflight_in_actor(actor: object, limit: int | None) -> list[InflightSample]:
    return inflight(limit)


def gather_inflight(
    actors: Iterable[Any], *, limit: int | None = None, timeout_s: float = 5.0
) -> list[InflightSample]:  # Any: Ray actor handles (their methods are made at runtime)
    """Running samples of every actor's process, oldest first (driver side; at most ``limit`` per actor).

    Runs a function in each actor through Ray's ``__ray_call__``: an async actor (verl's agent-loop workers)
    answers at once even while its samples run; a sync actor answers between calls. Actors that do not
    answer within ``timeout_s`` (in total) are left out. Nothing is added to the actor class.
    """
    ray = ray_module()
    refs = [actor.__ray_call__.remote(_inflight_in_actor, limit) for actor in actors]
    if not refs:
        return []
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    out: dict[tuple[int, str], InflightSample] = {}
    for ref in ready:
        try:
            for item in ray.get(ref):
                out[(item.pid, item.span_id)] = item  # two actors in one process report it once
        except Exception:  # an actor that died or failed: its samples are not running anywhere we can see
            continue
    return sorted(out.values(), key=lambda s: -s.sample_age_s)


def worker_verdict(step: int | None, validate: bool = False) -> Verdict:
    """This worker's watchdog verdict for ``step`` (call after :func:`worker_table`, which classifies)."""
    handle = own_handle()
    live = handle.live if handle is not None else None
    if live is None:
        return Verdict()
    return live.verdict(step, validate)


def add_verdicts(
    metrics: StepMetrics, verdicts: Iterable[Verdict], *, step: int | None = None, log: bool = True
) -> StepMetrics:
    """``agent_loop/watchdog/{slow,hung}`` and their trace ids over all workers' verdicts, into ``metrics``;
    when the watchdog reported samples (and ``log``), one warning line in this process (the driver) names them
    (at most :data:`MAX_LISTED`): Ray folds similar lines from different workers into one
    (``[repeated Nx across cluster]``), so the merged verdict is said where nothing folds it. Pass
    ``log=False`` when the caller prints the verdict itself."""
    from ...metrics._verdicts import apply_verdicts

    verdicts = list(verdicts)
    apply_verdicts(metrics, verdicts)
    try:
        if log:
            _log_verdict(metrics, len(verdicts), step)
    except Exception:
        internal_error("ray.add_verdicts")
    return metrics


MAX_LISTED = 20
"""Samples named in the driver's verdict line (the metrics carry every trace id)."""


def _log_verdict(metrics: StepMetrics, workers: int, step: int | None) -> None:
    slow, hung = metrics.slow_samples, metrics.hung_samples
    if not (slow or hung):
        return
    listed = [(s, "hung") for s in hung] + [(s, "slow") for s in slow]
    names = "; ".join(
        f"sample {s.sample_index}{'' if s.rollout_n is None else f'/{s.rollout_n}'} {kind} in {s.phase}"
        f"{f' (tool {s.tool})' if s.tool else ''}, trace {s.trace_id}"
        for s, kind in listed[:MAX_LISTED]
    )
    more = f"; and {len(listed) - MAX_LISTED} more" if len(listed) > MAX_LISTED else ""
    logger.warning(
        "otel_agentloop: watchdog verdict%s over %d workers: %d hung, %d slow: %s%s",
        "" if step is None else f" for step {step}",
        workers,
        len(hung),
        len(slow),
        names,
        more,
    )
