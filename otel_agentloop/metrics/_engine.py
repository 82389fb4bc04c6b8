"""The inference engine's facts of a step's generation turns (:class:`EngineTurns`), one sample's summed
(:class:`EngineSample`), and the per-step ``agent_loop/engine/*`` metrics made from them (:func:`engine_metrics`)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from .. import semconv as sc
from ._numpy import LazyNumpy

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
else:
    np = LazyNumpy(globals(), "np")

_PREFIX = sc.METRIC_PREFIX
PERCENTILES = (50, 90, 99)

ENGINE_FLOATS = (
    "queue_s",
    "ttft_s",
    "prefill_s",
    "decode_s",
    "output_tokens",
    "input_tokens",
    "cached_tokens",
    "preemptions",
    "running_max",
    "running_mean",
    "waiting_max",
    "kv_max",
    "segments",
    "aborted",
)
"""The float columns of :class:`EngineTurns`, in the order :class:`~._accumulate.StepRows` records them."""
ENGINE_ATTRIBUTE_OF = (
    sc.RL_ENGINE_QUEUE_S,
    sc.RL_ENGINE_TTFT_S,
    sc.RL_ENGINE_PREFILL_S,
    sc.RL_ENGINE_DECODE_S,
    sc.GEN_AI_USAGE_OUTPUT_TOKENS,
    sc.GEN_AI_USAGE_INPUT_TOKENS,
    sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    sc.RL_ENGINE_PREEMPTIONS,
    sc.RL_ENGINE_BATCH_RUNNING_MAX,
    sc.RL_ENGINE_BATCH_RUNNING_MEAN,
    sc.RL_ENGINE_BATCH_WAITING_MAX,
    sc.RL_ENGINE_KV_CACHE_USAGE_MAX,
    sc.RL_ENGINE_SEGMENTS,
)
"""The turn attribute of each of :data:`ENGINE_FLOATS` but ``aborted`` (from :data:`semconv.RL_ENGINE_FINISH`)."""
ENGINE_MARKERS = frozenset(
    (
        sc.RL_ENGINE_QUEUE_S,
        sc.RL_ENGINE_TTFT_S,
        sc.RL_ENGINE_PREFILL_S,
        sc.RL_ENGINE_DECODE_S,
        sc.RL_ENGINE_BATCH_RUNNING_MAX,
        sc.RL_ENGINE_KV_CACHE_USAGE_MAX,
        sc.RL_ENGINE_SEGMENTS,
        sc.RL_ENGINE_FINISH,
    )
)
"""A generation turn carrying any of these is an engine turn (one row of :class:`EngineTurns`)."""


MAX_ARRAY_CHARS = 1 << 20
"""The longest JSON text :func:`array_value` parses."""


def array_value(value: object) -> list[object] | None:
    """An array attribute's items: a list or tuple as stored, or the JSON array text Jaeger turns it into (its
    model has no array type: api_v3 returns ``"[4,8,6]"``); ``None`` for anything else."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str) and value.startswith("[") and len(value) <= MAX_ARRAY_CHARS:
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            return None
        return parsed if isinstance(parsed, list) else None
    return None


def _empty() -> npt.NDArray[np.float64]:
    return np.empty(0, np.float64)


@dataclass(frozen=True)
class EngineTurns:
    """The inference engine's facts of a step's generation turns: one row per turn span that carries any of
    :data:`ENGINE_MARKERS`, keyed by its sample. Seconds, tokens and load are float64, NaN where the turn does
    not carry the value (``aborted``: 1.0 when ``rl.engine.finish`` is ``aborted``, 0.0 when another value);
    ``policy_versions``: each turn's ``rl.engine.policy_versions`` as a tuple (empty when absent). Not per
    table row (a sample has many turns): :meth:`concat` concatenates them, and every statistic over them is
    order-free."""

    sample_index: npt.NDArray[np.int64] = field(default_factory=lambda: np.empty(0, np.int64))
    rollout_n: npt.NDArray[np.int64] = field(default_factory=lambda: np.empty(0, np.int64))
    queue_s: npt.NDArray[np.float64] = field(default_factory=_empty)
    ttft_s: npt.NDArray[np.float64] = field(default_factory=_empty)
    prefill_s: npt.NDArray[np.float64] = field(default_factory=_empty)
    decode_s: npt.NDArray[np.float64] = field(default_factory=_empty)
    output_tokens: npt.NDArray[np.float64] = field(default_factory=_empty)
    input_tokens: npt.NDArray[np.float64] | None = None
    cached_tokens: npt.NDArray[np.float64] | None = None
    preemptions: npt.NDArray[np.float64] | None = None
    running_max: npt.NDArray[np.float64] | None = None
    running_mean: npt.NDArray[np.float64] | None = None
    waiting_max: npt.NDArray[np.float64] | None = None
    kv_max: npt.NDArray[np.float64] | None = None
    segments: npt.NDArray[np.float64] | None = None
    aborted: npt.NDArray[np.float64] | None = None
    policy_versions: npt.NDArray[np.object_] | None = None

    def __post_init__(self) -> None:  # the load columns default to NaN (tables built before issue 36)
        n = len(self)
        for name in ENGINE_FLOATS[5:]:
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.full(n, np.nan))
        if self.policy_versions is None:
            versions = np.empty(n, np.object_)
            versions[:] = [()] * n
            object.__setattr__(self, "policy_versions", versions)

    def __len__(self) -> int:
        return int(self.sample_index.shape[0])

    def col(self, name: str) -> npt.NDArray[np.float64]:
        """Float column ``name`` of :data:`ENGINE_FLOATS`."""
        out: npt.NDArray[np.float64] = getattr(self, name)
        return out

    @classmethod
    def concat(cls, parts: Iterable[EngineTurns]) -> EngineTurns:
        parts = [p for p in parts if len(p)]
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls()
        return cls(**{name: np.concatenate([getattr(p, name) for p in parts]) for name in _ENGINE_COLUMNS})

    def tokens_per_s(self) -> npt.NDArray[np.float64]:
        """Each turn's output tokens / decode seconds (NaN without both, or without decode time)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            tps = self.output_tokens / self.decode_s
        return np.where(np.isfinite(tps) & (self.decode_s > 0), tps, np.nan)

    def stats(self) -> dict[str, npt.NDArray[np.float64]]:
        """Each statistic of ``semconv.ENGINE_STATS`` -> the known values over the turns (sorted)."""
        columns = (self.queue_s, self.ttft_s, self.decode_s, self.output_tokens, self.tokens_per_s())
        return {name: np.sort(col[~np.isnan(col)]) for name, col in zip(sc.ENGINE_STATS, columns, strict=True)}

    def tokens_per_sample(self) -> npt.NDArray[np.float64]:
        """Each sample's output tokens summed over its turns (one value per sample with engine turns)."""
        if not len(self):
            return np.empty(0, np.float64)
        keys = np.stack((self.sample_index, self.rollout_n), axis=1)
        _, inverse = np.unique(keys, axis=0, return_inverse=True)
        return np.bincount(inverse.ravel(), weights=np.nan_to_num(self.output_tokens)).astype(np.float64)

    def median(self, name: str) -> float | None:
        """The median over the turns that carry float column ``name`` (``None`` when none does)."""
        values = self.col(name)
        values = values[~np.isnan(values)]
        return float(np.median(values)) if values.size else None

    def of_sample(self, key: tuple[int, int]) -> EngineSample | None:
        """Sample ``key``'s turns summed (``None`` when none of its turns carries engine facts)."""
        mine = (self.sample_index == key[0]) & (self.rollout_n == key[1])
        if not np.any(mine):
            return None
        out, dec = self.output_tokens[mine], self.decode_s[mine]
        both = ~np.isnan(out) & ~np.isnan(dec) & (dec > 0)

        def known(name: str) -> npt.NDArray[np.float64]:
            values = self.col(name)[mine]
            found: npt.NDArray[np.float64] = values[~np.isnan(values)]
            return found

        kv, running, cached = known("kv_max"), known("running_mean"), self.col("cached_tokens")[mine]
        inputs = self.col("input_tokens")[mine]
        missed = (cached == 0) & ~np.isnan(inputs)  # turns with no prefix-cache hit at all
        segments, aborted = np.nan_to_num(self.col("segments")[mine], nan=1.0), self.col("aborted")[mine]
        aborts = np.maximum(segments - 1, 0) + (aborted == 1.0)  # attempts resumed, and a final abort
        versions: list[int] = []
        for turn in self.policy_versions[mine]:  # type: ignore[index]
            versions.extend(v for v in turn if v not in versions)
        return EngineSample(
            turns=int(np.count_nonzero(mine)),
            queue_s=float(np.nansum(self.queue_s[mine])),
            output_tokens=int(np.nansum(out)),
            decode_s=float(dec[both].sum()),
            decoded_tokens=int(out[both].sum()),
            preemptions=int(np.nansum(self.col("preemptions")[mine])),
            kv_max=float(kv.max()) if kv.size else None,
            running_mean=float(running.mean()) if running.size else None,
            missed_prompt_tokens=int(inputs[missed].sum()) if np.any(missed) else 0,
            aborts=int(aborts.sum()),
            policy_versions=tuple(versions),
        )


class EngineSample(NamedTuple):
    """One sample's engine turns summed: queue seconds, output tokens, and the tokens and decode seconds of its
    turns that carry both (its decode speed is ``decoded_tokens / decode_s``); its preemptions, the highest KV
    cache usage and the mean running sequences over its turns (``None``: unknown), the prompt tokens of its turns
    that hit no prefix cache at all (cached 0), its aborted attempts and the policy versions it ran under."""

    turns: int
    queue_s: float
    output_tokens: int
    decode_s: float
    decoded_tokens: int
    preemptions: int = 0
    kv_max: float | None = None
    running_mean: float | None = None
    missed_prompt_tokens: int = 0
    aborts: int = 0
    policy_versions: tuple[int, ...] = ()

    @property
    def tokens_per_s(self) -> float | None:
        return self.decoded_tokens / self.decode_s if self.decode_s > 0 else None


_ENGINE_COLUMNS = ("sample_index", "rollout_n", *ENGINE_FLOATS, "policy_versions")


def engine_metrics(turns: EngineTurns) -> dict[str, float]:
    """``agent_loop/engine/<stat>/{p50,p90,p99,max}`` for each statistic of ``semconv.ENGINE_STATS`` that some
    turn carries (percentiles interpolate linearly, as the phases'), and the engine's state under the turns, each
    only when some turn carries it: ``kv_cache_usage/max``, ``batch_running/mean`` (the mean of the turns'
    running mean) and ``batch_running/max``, ``preemptions`` and ``cached_tokens`` (sums), ``segments/max``.
    Empty without engine turns."""
    out: dict[str, float] = {}
    if not len(turns):
        return out
    for stat, values in turns.stats().items():
        if values.size:
            base = f"{_PREFIX}/{sc.ENGINE_METRIC}/{stat}"
            for q, value in zip(PERCENTILES, np.percentile(values, PERCENTILES), strict=True):
                out[f"{base}/p{q}"] = float(value)
            out[f"{base}/max"] = float(values[-1])
    base = f"{_PREFIX}/{sc.ENGINE_METRIC}"
    figures = (
        (f"{sc.ENGINE_KV_CACHE_USAGE}/max", "kv_max", np.max),
        (f"{sc.ENGINE_BATCH_RUNNING}/mean", "running_mean", np.mean),
        (f"{sc.ENGINE_BATCH_RUNNING}/max", "running_max", np.max),
        (sc.ENGINE_PREEMPTIONS, "preemptions", np.sum),
        (sc.ENGINE_CACHED_TOKENS, "cached_tokens", np.sum),
        (f"{sc.ENGINE_SEGMENTS}/max", "segments", np.max),
    )
    for key, name, reduce in figures:
        values = turns.col(name)
        values = values[~np.isnan(values)]
        if values.size:
            out[f"{base}/{key}"] = float(reduce(values))
    return out
