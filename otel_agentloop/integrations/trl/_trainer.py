"""The wrappers ``instrument()`` puts on ``trl.trainer.grpo_trainer`` (GRPOTrainer's methods, its module's
``profiling_context``) and the TrainerCallback that opens each step.

Each wrapper calls straight through when the switch is off, in eval mode, or when the trainer is not ours to
trace, and otherwise hands TRL the very same arguments and returns TRL's very result.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, MutableMapping, Sequence, Sized
from typing import Any, Protocol

from ...core._context import step
from ...core._guard import internal_error
from ...core._trainer import trainer_phase
from ._phases import GenerationCall, RewardBlock, Tools, end_rewards, generation_rows, record_totals, wrap_tools
from ._rows import Batch
from ._state import TrainerState, peek, state_of, switch
from ._steps import close_step, merge_metrics
from ._vllm import open_feed
from ._vllm_server import open_post_feed

F = Callable[..., Any]
"""A GRPOTrainer method. Any: TRL's own; what it returns is read below as TRL 1.16 returns it."""


class _Model(Protocol):
    training: bool
    config: object


class Trainer(Protocol):
    """What the wrappers read of a ``GRPOTrainer`` directly (the rest by ``getattr``, with defaults)."""

    model: _Model

    def add_callback(self, callback: object) -> None: ...


class _TrainerState(Protocol):
    """What the callback reads of transformers' ``TrainerState``."""

    global_step: int


def _update(wrapper: F, original: F) -> F:
    functools.update_wrapper(wrapper, original, assigned=("__name__", "__qualname__", "__doc__"), updated=())
    return wrapper


def _training(trainer: Trainer) -> bool:
    try:
        return bool(trainer.model.training)
    except Exception:
        return False


def wrap_generate_and_score(original: F) -> F:
    """``_generate_and_score_completions``: a ``rl.train.gen`` phase, and a sample per row until it returns."""

    def _generate_and_score_completions(self: Trainer, inputs: Sized, *args: object, **kwargs: object) -> object:
        if not switch.active or not _training(self):
            return original(self, inputs, *args, **kwargs)
        st = state_of(self)
        batch = _open_batch(self, st, inputs)
        with trainer_phase("gen"):
            try:
                result = original(self, inputs, *args, **kwargs)
            except BaseException as exc:
                _close_batch(st, batch, exc)
                raise
            _close_batch(st, batch, None)
            return result

    return _update(_generate_and_score_completions, original)


def _open_batch(trainer: object, st: TrainerState, inputs: Sized) -> Batch | None:
    try:
        n = len(inputs)
        group = int(getattr(trainer, "num_generations", 1) or 1)
        process = int(getattr(getattr(trainer, "accelerator", None), "process_index", 0) or 0)
        st.batch = Batch(n, group, process * (n // max(group, 1)))
        st.first_prompt_ids = None
        st.tool_rows.clear()
        st.rewards = {}
        return st.batch
    except Exception:
        internal_error("trl.batch.open")
        return None


def _close_batch(st: TrainerState, batch: Batch | None, exc: BaseException | None) -> None:
    st.batch = None
    st.first_prompt_ids = None
    if batch is not None:
        batch.close(exc)


def wrap_generate(original: F) -> F:
    """``_generate``: each row's tools traced for this batch, and each sample's prompt and response lengths."""

    def _generate(self: object, *args: object, **kwargs: object) -> object:
        st = peek(self) if switch.active else None
        if st is None or st.batch is None:
            return original(self, *args, **kwargs)
        undo: list[tuple[Tools, str, Callable[..., object]]] = []
        try:
            if getattr(self, "tools", None):
                undo = wrap_tools(st, getattr(self, "_sync_tool_dicts", ()), False)
                undo += wrap_tools(st, getattr(self, "_async_tool_dicts", ()), True)
        except Exception:
            internal_error("trl.tools.wrap")
        try:
            result = original(self, *args, **kwargs)
        finally:
            for tools, name, fn in undo:
                tools[name] = fn
        _record_lengths(st, result)
        return result

    return _update(_generate, original)


def _record_lengths(st: TrainerState, result: Sequence[Sequence[Sized]]) -> None:
    batch = st.batch
    try:
        prompt_ids, completion_ids = result[0], result[1]
        if batch is not None and len(prompt_ids) == len(batch.rows) == len(completion_ids):
            for row, p, c in zip(batch.rows, prompt_ids, completion_ids, strict=True):
                row.handle.record(prompt_length=len(p), response_length=len(c))
    except Exception:
        internal_error("trl.sample.lengths")


def wrap_generate_single_turn(original: F) -> F:
    """``_generate_single_turn``: one batched generation call (``rl.generate.batch``) and its samples' turns;
    with vLLM, each request the turn of its row (colocated: ``_vllm.RequestFeed``; server:
    ``_vllm_server.PostFeed``)."""

    def _generate_single_turn(
        self: Trainer, prompt_ids: Sequence[Sequence[int]], *args: object, **kwargs: object
    ) -> object:
        st = peek(self) if switch.active else None
        call = None
        if st is not None and st.batch is not None:
            try:
                rows = generation_rows(st, prompt_ids)
                if rows is not None:
                    call = GenerationCall(st.batch, rows, _model_name(self))
            except Exception:
                internal_error("trl.generate.open")
        if call is None:
            return original(self, prompt_ids, *args, **kwargs)
        feed = open_feed(self, prompt_ids, call.scopes) or open_post_feed(
            self, prompt_ids, call.scopes, call.batch_scope
        )
        try:
            result = original(self, prompt_ids, *args, **kwargs)
        except BaseException as exc:
            call.end(exc, prompt_ids, None)
            raise
        finally:
            if feed is not None:
                feed.close()
        call.end(None, prompt_ids, _completions(result))
        return result

    return _update(_generate_single_turn, original)


def _completions(result: Sequence[Sequence[Sequence[int]]]) -> Sequence[Sequence[int]] | None:
    try:
        return result[0]
    except Exception:
        return None


def _model_name(trainer: Trainer) -> str | None:
    try:
        name = getattr(trainer.model.config, "_name_or_path", None)
        return str(name).rstrip("/").rsplit("/", 1)[-1] or None if name else None
    except Exception:
        return None


def wrap_calculate_rewards(original: F) -> F:
    """``_calculate_rewards``: each reward function's spans end with each row's value (see ``RewardBlock``)."""

    def _calculate_rewards(self: object, *args: object, **kwargs: object) -> object:
        st = peek(self) if switch.active else None
        batch = st.batch if st is not None else None
        if st is None or batch is None:
            return original(self, *args, **kwargs)
        st.scoring = True
        try:
            result = original(self, *args, **kwargs)
        except BaseException as exc:
            st.scoring = False
            end_rewards(st, list(getattr(self, "reward_func_names", ())), None, exc)
            raise
        st.scoring = False
        table = end_rewards(st, list(getattr(self, "reward_func_names", ())), result, None)
        record_totals(batch, table, getattr(self, "reward_weights", None))
        return result

    return _update(_calculate_rewards, original)


def wrap_profiling_context(original: F) -> F:
    """``grpo_trainer.profiling_context``: a reward function's block gets its reward spans."""

    def profiling_context(trainer: object, name: str, *args: object, **kwargs: object) -> object:
        inner = original(trainer, name, *args, **kwargs)
        st = peek(trainer) if switch.active else None
        if st is None or not st.scoring or st.batch is None:
            return inner
        try:
            if name in getattr(trainer, "reward_func_names", ()):
                return RewardBlock(inner, st, name)
        except Exception:
            internal_error("trl.reward.block")
        return inner

    return _update(profiling_context, original)


def wrap_compute_loss(original: F) -> F:
    """``compute_loss``: the ``rl.train.loss`` phase (forward and loss of one micro-batch)."""

    def compute_loss(self: object, *args: object, **kwargs: object) -> object:
        if not switch.active or peek(self) is None:
            return original(self, *args, **kwargs)
        with trainer_phase("loss"):
            return original(self, *args, **kwargs)

    return _update(compute_loss, original)


def wrap_log(original: F) -> F:
    """``log``: our collected steps' metrics (``agent_loop/...``) join TRL's logged dict, training logs only."""

    def log(self: Trainer, logs: MutableMapping[str, object], *args: object, **kwargs: object) -> object:
        st = peek(self) if switch.active else None
        if st is not None and st.pending and _training(self):
            merge_metrics(st, logs)
        return original(self, logs, *args, **kwargs)

    return _update(log, original)


def wrap_init(original: F, callback: Callable[[], Callable[[Trainer], object]]) -> F:
    """``__init__``: our callback joins the trainer's (``callback()``: its class), tracing configured if not yet."""

    def __init__(self: Trainer, *args: object, **kwargs: object) -> None:  # noqa: N807 - the method it replaces
        original(self, *args, **kwargs)
        if not switch.active:
            return
        try:
            from ...setup import configure, current_handle

            if current_handle() is None:  # opentelemetry-instrument with no code change: from the environment
                configure()
            state_of(self)
            self.add_callback(callback()(self))
        except Exception:
            internal_error("trl.trainer.init")

    return _update(__init__, original)


def wrap_train(original: F) -> F:
    """``train``: a step left open by an exception is ended with it."""

    def train(self: object, *args: object, **kwargs: object) -> object:
        try:
            return original(self, *args, **kwargs)
        except BaseException as exc:
            st = peek(self)
            if st is not None:
                close_step(st, exc, collect=False)
            raise

    return _update(train, original)


def callback_class(base: type) -> type:
    """Our ``TrainerCallback`` subclass (``base``: transformers' class, imported by TRL already); an instance
    serves one trainer (held weakly)."""

    class OtelAgentloopCallback(base):  # type: ignore[misc]
        """Opens each optimizer step's ``rl.step`` and ``rl.train.optimizer_step``; collects the step's metrics."""

        def __init__(self, trainer: Trainer) -> None:
            self._trainer = weakref.ref(trainer)

        def _state(self) -> TrainerState | None:
            trainer = self._trainer() if switch.active else None
            return peek(trainer) if trainer is not None else None

        def on_step_begin(self, args: object, state: _TrainerState, control: object, **kwargs: object) -> None:
            st = self._state()
            if st is None or st.step is not None:
                return
            try:
                block = step(int(state.global_step) + 1)
                block.__enter__()
                st.step, st.step_no = block, int(state.global_step) + 1
            except Exception:
                internal_error("trl.step.open")

        def on_pre_optimizer_step(self, args: object, state: _TrainerState, control: object, **kwargs: object) -> None:
            st = self._state()
            if st is not None and st.step is not None and st.optimizer is None:
                phase = trainer_phase("optimizer_step")
                phase.__enter__()
                st.optimizer = phase

        def on_optimizer_step(self, args: object, state: _TrainerState, control: object, **kwargs: object) -> None:
            st = self._state()
            if st is not None and st.optimizer is not None:
                phase, st.optimizer = st.optimizer, None
                phase.__exit__(None, None, None)

        def on_step_end(self, args: object, state: _TrainerState, control: object, **kwargs: object) -> None:
            st = self._state()
            if st is not None:
                close_step(st, None, collect=True)

        def on_train_end(self, args: object, state: _TrainerState, control: object, **kwargs: object) -> None:
            st = self._state()
            if st is not None:
                close_step(st, None, collect=True)

    return OtelAgentloopCallback
