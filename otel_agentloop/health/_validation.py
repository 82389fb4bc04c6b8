"""Representative validation generations, drawn from every batch and every worker, in bounded memory.

verl logs N validation samples (input, output, score): it sorts them by input, shuffles with a fixed seed and
takes N, which needs every sample in one place; fully-async mode captured only the last batch. Here every
sample gets a key from a seeded hash of its identity and text, and the N smallest keys are kept: a bottom-N
sketch. The result is a deterministic function of the seed and the *set* of samples (not of batch sizes,
worker counts or arrival order), memory is O(N), and sketches merge exactly (Ray workers ship ``state()``).
"""

from __future__ import annotations

import hashlib
import heapq
import struct
from collections.abc import Callable, Iterable

from opentelemetry import trace

from .. import semconv as sc
from ..core._state import state

Identity = tuple[int | None, int | None, int | None]
"""A sample's identity: ``(step, sample_index, rollout_n)``."""
Entry = tuple[int, str, str, float, Identity]  # (key, input, output, score, identity)
TRUNCATION_MARK = "…[truncated]"


class ValidationCapture:
    """Keep ``n`` validation samples chosen by a seeded hash (see module doc).

    Texts are passed through ``redact`` and truncated to ``max_chars`` before they are stored. When a sample is
    offered inside its ``otel_agentloop.sample(...)`` and is a candidate at that moment, its text is attached
    to the sample span, subject to ``configure(capture_content=True)`` (every finally chosen sample was a
    candidate when offered, so all of them carry it; a few early candidates do too).
    """

    def __init__(
        self, n: int = 10, seed: int = 42, *, max_chars: int = 2048, redact: Callable[[str], str] | None = None
    ) -> None:
        if n < 0 or max_chars < 1:
            raise ValueError("n must be >= 0 and max_chars >= 1")
        self.n, self.seed, self.max_chars, self.redact = n, seed, max_chars, redact
        self._heap: list[tuple[int, int, str, str, float, Identity]] = []  # max-heap on key (negated)
        self.offered = 0

    def _clean(self, text: object) -> str:
        value = text if isinstance(text, str) else str(text)
        if self.redact is not None:
            value = self.redact(value)
        if len(value) > self.max_chars:
            value = value[: max(self.max_chars - len(TRUNCATION_MARK), 0)] + TRUNCATION_MARK
        return value

    def key(self, input_text: str, output_text: str, identity: Identity) -> int:
        """The sample's rank key: stable across processes and runs (blake2b, not ``hash``)."""
        h = hashlib.blake2b(digest_size=8, key=struct.pack("<q", self.seed))
        h.update(repr(identity).encode())
        h.update(b"\0" + input_text.encode("utf-8", "replace") + b"\0" + output_text.encode("utf-8", "replace"))
        return int.from_bytes(h.digest(), "big")

    def offer(
        self,
        input_text: object,
        output_text: object,
        score: float,
        *,
        sample_index: int | None = None,
        rollout_n: int | None = None,
        step: int | None = None,
    ) -> bool:
        """Consider one sample; returns whether it is a candidate now."""
        self.offered += 1
        if self.n == 0:
            return False
        inp, out = self._clean(input_text), self._clean(output_text)
        identity = (step, sample_index, rollout_n)
        k = self.key(inp, out, identity)
        if len(self._heap) >= self.n and -self._heap[0][0] <= k:
            return False
        self._push((k, inp, out, float(score), identity))
        span = trace.get_current_span()
        if span.is_recording() and state.content.enabled:
            for attr, text in ((sc.RL_PROMPT_CONTENT, inp), (sc.RL_RESPONSE_CONTENT, out)):
                cleaned = state.content.clean(text)
                if cleaned is not None:
                    span.set_attribute(attr, cleaned)
        return True

    def _push(self, entry: Entry) -> None:
        k, inp, out, score, identity = entry
        item = (-k, k, inp, out, score, identity)
        if any(e[1] == k and e[5] == identity for e in self._heap):
            return  # the same sample merged twice
        if len(self._heap) < self.n:
            heapq.heappush(self._heap, item)
        elif k < -self._heap[0][0]:
            heapq.heapreplace(self._heap, item)

    def state(self) -> list[Entry]:
        """A compact, picklable copy of the sketch (at most ``n`` entries)."""
        return [(k, inp, out, score, identity) for _, k, inp, out, score, identity in self._heap]

    def merge(self, other: ValidationCapture | Iterable[Entry], offered: int = 0) -> None:
        """Fold another sketch (or its ``state()``, with its ``offered`` count) in; the result is as if all
        samples were offered here."""
        if isinstance(other, ValidationCapture):
            offered = other.offered
        self.offered += offered
        entries = other.state() if isinstance(other, ValidationCapture) else other
        for entry in entries:
            self._push(tuple(entry))  # type: ignore[arg-type]

    def result(self) -> list[tuple[str, str, float]]:
        """The chosen ``(input, output, score)`` triples, in key order (a seeded shuffle), as verl's
        ``ValidationGenerationsLogger`` takes them."""
        return [(inp, out, score) for _, inp, out, score, _ in sorted(self.state())]

    def chosen(self) -> list[Identity]:
        """Identities ``(step, sample_index, rollout_n)`` of the chosen samples, in key order."""
        return [identity for *_, identity in sorted(self.state())]

    def __len__(self) -> int:
        return len(self._heap)
