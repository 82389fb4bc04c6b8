"""Patches of ``verl.experimental.fully_async_policy`` (legacy agent-loop workers fed one prompt at a time).

- ``FullyAsyncRollouter._process_single_sample_streaming`` (on the class Ray ships): the prompt's batch gets
  ``global_steps`` = the rollouter's current param-sync step (verl leaves it unset: steps were -1) and our
  flag asking the worker for per-trajectory rows (:func:`._agent_loop._fully_async_call`).
- ``assemble_batch_from_rollout_samples`` where ``fully_async_trainer`` uses it: pops the rows column and adds
  ``fully_async/agent_loop/*`` (verl's agent_loop keys and ours, from the spans of exactly the trajectories of
  the batch) and ``fully_async/agent_loop/processing_time/*`` (verl's ``fully_async/processing_time/*`` formula
  on the same samples' span times) to the batch's ``meta_info``, which the trainer logs.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, cast

import numpy as np

from ...core._guard import internal_error
from .._patching import Args, AsyncOriginal, Kwargs
from . import _patching as patching
from ._agent_loop import FULLY_ASYNC_KEY, ROW_COLUMN
from ._objects import DataProto, RolloutSample
from ._rows import TAG

ROLLOUTER = "verl.experimental.fully_async_policy.fully_async_rollouter"
TRAINER = "verl.experimental.fully_async_policy.fully_async_trainer"
PREFIX = "fully_async/"


def apply_rollouter(module: ModuleType) -> None:
    patching.patch(
        module,
        "FullyAsyncRollouter.__ray_metadata__.modified_class",
        "_process_single_sample_streaming",
        _process_single_sample,
    )


def apply_trainer(module: ModuleType) -> None:
    patching.replace(
        module,
        "",
        "assemble_batch_from_rollout_samples",
        _assemble(vars(module)["assemble_batch_from_rollout_samples"]),
    )


async def _process_single_sample(original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    try:
        rollouter, sample = args[0], args[1] if len(args) > 1 else kwargs["rollout_sample"]
        meta = cast(RolloutSample, sample).full_batch.meta_info
        if "global_steps" not in meta:
            meta["global_steps"] = int(getattr(rollouter, "_completed_steps", -1))
        meta[FULLY_ASYNC_KEY] = True
    except Exception:
        internal_error("verl.fully_async.dispatch")
    return await original(*args, **kwargs)


def _assemble(original: Callable[..., DataProto]) -> Callable[..., object]:
    def assemble_batch_from_rollout_samples(*args: object, **kwargs: object) -> object:
        if not patching.state.active:
            return original(*args, **kwargs)
        batch = original(*args, **kwargs)
        try:
            rows = batch.non_tensor_batch.pop(ROW_COLUMN, None)
            if rows is not None:
                batch.meta_info.update(batch_metrics(list(rows), summary=True))
        except Exception:
            internal_error("verl.fully_async.assemble")
        return batch

    assemble_batch_from_rollout_samples.__wrapped__ = original  # type: ignore[attr-defined]
    assemble_batch_from_rollout_samples.__doc__ = original.__doc__
    return assemble_batch_from_rollout_samples


def batch_metrics(rows: list[Any], *, summary: bool = False) -> dict[str, float]:
    """Our keys for one assembled batch: verl's agent_loop formula and ours, and the processing-time statistics
    verl's ``assemble_batch_from_rollout_samples`` computes, all from the span rows, under ``fully_async/``.

    ``summary``: also write the batch's ``rl.step.summary`` (its step: the latest dispatch step among its
    rows, the rollouter's parameter version; the trainer's own step is not known here)."""
    from ._v1 import _step_results, write_summary

    rows = [r for r in rows if isinstance(r, dict)]
    ours, table, _ = _step_results(rows, emit=False)
    out = {PREFIX + key: value for key, value in ours.items()}
    gen = np.array([r[TAG + "generate_sequences"] for r in rows], dtype=np.float64)
    if len(gen):
        stats = {
            "avg": float(np.mean(gen)),
            "max": float(np.max(gen)),
            "min": float(np.min(gen)),
            "tp50": float(np.percentile(gen, 50)),
            "tp99": float(np.percentile(gen, 99)),
            "tp95": float(np.percentile(gen, 95)),
        }
        out.update({f"{PREFIX}agent_loop/processing_time/{k}": v for k, v in stats.items()})
    if summary and rows:
        steps = [r.get(TAG + "step") for r in rows]
        known = [int(s) for s in steps if isinstance(s, (int, float))]
        write_summary(table, out, max(known) if known else None, False, prefix=PREFIX)
    return out
