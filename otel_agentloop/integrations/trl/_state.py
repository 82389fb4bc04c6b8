"""What the TRL integration keeps per trainer, and the switch its wrappers read."""

from __future__ import annotations

import threading
import weakref

from ...config._fork import renew_lock
from ...core._context import step
from ...core._scope import OpenSpan
from ...core._trainer import trainer_phase
from .._patching import Switch
from ._rows import Batch, Ending

switch = Switch()


class RewardRun:
    """One reward function's call over the batch: its per-row spans, and when and how it ended."""

    __slots__ = ("ending", "error", "scopes")

    def __init__(self, scopes: list[OpenSpan | None]) -> None:
        self.scopes = scopes
        self.ending: Ending | None = None
        self.error: BaseException | None = None


class TrainerState:
    """One GRPOTrainer's open step, optimizer phase, generation batch and metrics not yet logged."""

    __slots__ = (
        "__weakref__",
        "batch",
        "first_prompt_ids",
        "optimizer",
        "pending",
        "rewards",
        "scoring",
        "step",
        "step_no",
        "tool_rows",
    )

    def __init__(self) -> None:
        self.step: step | None = None
        self.step_no: int | None = None
        self.optimizer: trainer_phase | None = None
        self.batch: Batch | None = None
        self.first_prompt_ids: list[list[int]] | None = None
        """Each row's first-turn prompt ids: which rows a tool-loop generation call holds."""
        self.tool_rows: set[int] = set()
        """Rows whose tools ran since the last generation call."""
        self.scoring = False
        self.rewards: dict[str, RewardRun] = {}
        self.pending: list[dict[str, float]] = []
        """Collected steps' metrics, merged into TRL's next logged dict."""


_states: weakref.WeakKeyDictionary[object, TrainerState] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
renew_lock(globals(), "_lock")  # a forked child: never a lock held at fork


def state_of(trainer: object) -> TrainerState:
    """The trainer's state (made on first use)."""
    found = _states.get(trainer)
    if found is None:
        with _lock:
            found = _states.get(trainer)
            if found is None:
                found = _states[trainer] = TrainerState()
    return found


def peek(trainer: object) -> TrainerState | None:
    """The trainer's state if it has one."""
    try:
        return _states.get(trainer)
    except TypeError:
        return None
