"""What the verl integration reads of verl's own objects, as Protocols naming only the attributes used.

verl is never imported here (it is not installed where the package is type-checked). Any marks verl's
free-form containers, whose values are verl's to choose and are checked where they are read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class DataProto(Protocol):
    """A batch (``verl.protocol.DataProto``): its ``meta_info`` and non-tensor columns."""

    meta_info: dict[str, Any]  # Any: verl's free-form metadata (flags, metrics rows, our carrier)
    non_tensor_batch: dict[str, Any]  # Any: numpy arrays, one per column

    def __len__(self) -> int: ...


class RolloutSample(Protocol):
    """fully_async_policy's ``RolloutSample``: the batch it dispatches."""

    full_batch: DataProto


class Trainer(Protocol):
    """The V1 trainer: the step it is on."""

    global_steps: int


class TaggedBatch(Protocol):
    """A TransferQueue batch: each trajectory's tags."""

    tags: Sequence[Mapping[str, Any]]  # Any: verl's tag values, ours among them (see ``_rows``)


class Scored(Protocol):
    """An agent-loop output with its reward."""

    reward_score: float | None
