"""A verifiers rollout as a sample, its scoring as the reward, an eval run as a step.

- ``Agent.run`` (one agent run on one task, its retries included) is one ``rl.sample``: index ``task.data.idx``,
  rollout number counted per task within the step (verifiers has none), step from the enclosing step. At its
  end the sample gets verifiers' final reward and turn count.
- ``Rollout.__init__`` maps the rollout's ``trace.id`` (the ``X-Session-ID`` the interception server routes
  by) to the sample's context, so a model call served in the interception server's own request task, and a
  tool server launched for the rollout, continue the sample's trace. The entry goes when the sample ends.
- ``Task.score`` is the ``rl.reward`` span, with the reward verifiers computed so far.
- ``run_eval`` (``vf-eval``'s runner) is one ``rl.step`` (numbered per process from 0), unless a step is
  already open.
"""

from __future__ import annotations

import atexit
import contextvars
import threading
from typing import Any

from opentelemetry import context as otel_context

from ... import semconv as sc
from ...config._fork import renew_lock
from ...core._context import SampleHandle, current_sample, current_step, sample, step
from ...core._guard import internal_error
from ...core._lifecycle import finish
from ...core._phase import PhaseSpec, start
from ...core._scope import span_of
from .._patching import Args, AsyncOriginal, Kwargs, Original, awaited_in
from . import _toolphase

SESSION_ATTR = "verifiers.trace.id"
"""The rollout's verifiers trace id (its ``X-Session-ID``), on the sample span."""
_REWARD = PhaseSpec.build(sc.COMPUTE_SCORE)
_MAX_SESSIONS = 65536

_lock = threading.Lock()
renew_lock(globals(), "_lock")  # a forked child: never a lock held at fork
_sessions: dict[str, tuple[otel_context.Context, SampleHandle]] = {}
_counts: dict[int, int] = {}
_counts_step: list[int | None] = [None]
_eval_runs = [0]
_auto = [False]
"""Configure tracing from the environment at the first eval run or rollout, when nothing did (set by the
``opentelemetry-instrument`` path, :class:`VerifiersInstrumentor`)."""
_IDS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("otel_agentloop_verifiers_ids", default=None)


def auto_configure(on: bool) -> None:
    _auto[0] = on


def ensure_configured() -> None:
    if not _auto[0]:
        return
    try:
        from ...setup import configure, current_handle

        with _lock:
            handle = current_handle()
            if handle is None or handle.closed:
                atexit.register(configure().shutdown, 5.0)
    except Exception:
        internal_error("verifiers.configure")


def session(session_id: object) -> tuple[otel_context.Context, SampleHandle] | None:
    """The context and sample of the rollout whose verifiers trace id is ``session_id``."""
    if not isinstance(session_id, str):
        return None
    return _sessions.get(session_id)


def _rollout_number(index: int) -> int:
    """This task's rollout number within the current step (0, 1, ...)."""
    outer = current_step()
    key = outer.step if outer is not None else None
    with _lock:
        if _counts_step[0] != key:
            _counts.clear()
            _counts_step[0] = key
        n = _counts.get(index, 0)
        _counts[index] = n + 1
        return n


def _task_index(task: Any) -> int:
    index = getattr(getattr(task, "data", None), "idx", None)
    return index if type(index) is int else -1


async def agent_run(original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    """``Agent.run(task, ...)`` as one sample."""
    ensure_configured()
    if current_sample() is not None:  # an agent run inside another's sample (a judge agent): part of it
        return await original(*args, **kwargs)
    task = args[1] if len(args) > 1 else kwargs.get("task")
    index = _task_index(task)
    ids: list[str] = []
    token = _IDS.set(ids)
    try:
        async with sample(index, rollout_n=_rollout_number(index)) as handle:
            trace = await original(*args, **kwargs)
            _record(handle, trace)
            return trace
    finally:
        _IDS.reset(token)
        with _lock:
            for trace_id in ids:
                _sessions.pop(trace_id, None)
        for trace_id in ids:
            _toolphase.close(trace_id)


def _record(handle: SampleHandle, trace: Any) -> None:
    try:
        reward = getattr(trace, "reward", None)
        turns = getattr(trace, "num_turns", None)
        handle.record(
            reward=reward if isinstance(reward, (int, float)) else None,
            turns=turns if type(turns) is int else None,
        )
        if handle.span is not None:
            handle.span.set_attribute(SESSION_ATTR, str(getattr(trace, "id", "")))
    except Exception:
        internal_error("verifiers.sample_record")


def rollout_init(original: Original, args: Args, kwargs: Kwargs) -> object:
    """``Rollout.__init__``: its trace id now routes to the current sample."""
    result = original(*args, **kwargs)
    try:
        handle = current_sample()
        ids = _IDS.get()
        trace_id = getattr(getattr(args[0], "trace", None), "id", None)
        if handle is not None and ids is not None and isinstance(trace_id, str):
            with _lock:
                if len(_sessions) < _MAX_SESSIONS:
                    _sessions[trace_id] = (otel_context.get_current(), handle)
                    ids.append(trace_id)
    except Exception:
        internal_error("verifiers.rollout_init")
    return result


async def task_score(original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    """``Task.score(trace, runtime)`` as the ``rl.reward`` span (none when scoring is deferred)."""
    if current_sample() is None or getattr(args[0], "scoring_deferred", False):
        return await original(*args, **kwargs)
    scope = start(_REWARD)
    if scope is None:
        return await original(*args, **kwargs)
    result = await awaited_in(scope, original, args, kwargs)
    try:
        trace = args[1] if len(args) > 1 else kwargs.get("trace")
        reward = getattr(trace, "reward", None)
        if isinstance(reward, (int, float)):
            span_of(scope).set_attribute(sc.RL_REWARD_SCORE, float(reward))
    except Exception:
        internal_error("verifiers.reward")
    finish(scope)
    return result


async def run_eval(original: AsyncOriginal, args: Args, kwargs: Kwargs) -> object:
    """verifiers' eval runner as one step (unless one is open already)."""
    ensure_configured()
    if current_step() is not None:
        return await original(*args, **kwargs)
    with _lock:
        number = _eval_runs[0]
        _eval_runs[0] += 1
    with step(number):
        return await original(*args, **kwargs)
