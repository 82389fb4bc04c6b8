"""Validation generations: drawn from every batch, deterministic per seed, independent of splits, bounded."""

from __future__ import annotations

import pickle
import random

import pytest

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.health import ValidationCapture


def samples(batches: int = 5, per_batch: int = 40) -> list[tuple[str, str, float, int, int]]:
    rng = random.Random(7)
    out = []
    for b in range(batches):
        for i in range(per_batch):
            index = b * per_batch + i
            out.append((f"question {index}: {rng.random():.6f}", f"answer {index}", rng.random(), index, b))
    return out


def offer_all(cap: ValidationCapture, items) -> ValidationCapture:
    for inp, out, score, index, _ in items:
        cap.offer(inp, out, score, sample_index=index, rollout_n=0, step=3)
    return cap


def reference(items, n: int, seed: int) -> list[tuple[str, str, float]]:
    """Brute force over all samples at once: rank every sample by its key, take the n smallest."""
    cap = ValidationCapture(n, seed)
    ranked = sorted((cap.key(inp, out, (3, index, 0)), inp, out, score) for inp, out, score, index, _ in items)
    return [(inp, out, score) for _, inp, out, score in ranked[:n]]


def test_draws_from_all_batches_and_matches_the_brute_force_selection() -> None:
    items = samples()
    cap = offer_all(ValidationCapture(10, seed=42), items)
    assert cap.result() == reference(items, 10, 42)
    batches = {next(b for inp, _, _, _, b in items if inp == chosen[0]) for chosen in cap.result()}
    assert len(batches) >= 3  # not only the last batch
    assert len(cap) == 10 and cap.offered == 200


@pytest.mark.parametrize("chunks", [1, 2, 7])
def test_same_seed_same_selection_whatever_the_split_and_merge_order(chunks: int) -> None:
    items = samples()
    expected = offer_all(ValidationCapture(10, seed=42), items).result()
    shuffled = items[:]
    random.Random(chunks).shuffle(shuffled)
    parts = [offer_all(ValidationCapture(10, seed=42), shuffled[i::chunks]) for i in range(chunks)]
    merged = ValidationCapture(10, seed=42)
    for part in reversed(parts):
        merged.merge(pickle.loads(pickle.dumps(part.state())))  # as shipped from a Ray worker
    merged.merge(parts[0])  # merging the same sketch twice changes nothing
    assert merged.result() == expected


def test_another_seed_chooses_differently() -> None:
    items = samples()
    first, second = offer_all(ValidationCapture(10, seed=1), items), offer_all(ValidationCapture(10, seed=2), items)
    assert first.result() != second.result()


def test_memory_and_text_are_bounded_and_redacted() -> None:
    cap = ValidationCapture(3, seed=0, max_chars=20, redact=lambda t: t.replace("secret", "[x]"))
    for i in range(1000):
        cap.offer("secret " + "q" * 100, f"a{i}", 0.5, sample_index=i)
        assert len(cap.state()) <= 3
    for inp, out, _ in cap.result():
        assert inp.startswith("[x] q") and len(inp) == 20 and inp.endswith("…[truncated]")
        assert len(out) <= 20


def test_candidates_carry_their_text_on_the_sample_span_only_with_content_capture(tmp_path) -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    for capture in (False, True):
        mem = InMemorySpanExporter()
        handle = oal.configure("val", exporters=[mem], set_global=False, capture_content=capture)
        cap = ValidationCapture(2, seed=5)
        try:
            with oal.step(1, validate=True):
                for i in range(6):
                    with oal.sample(i):
                        cap.offer(f"prompt {i}", f"response {i}", 1.0, sample_index=i, step=1)
            assert handle.force_flush(5)
        finally:
            handle.shutdown(5)
        roots = {s.attributes[sc.RL_SAMPLE_INDEX]: s for s in mem.get_finished_spans() if s.name == "rl.sample"}
        chosen = {identity[1] for identity in cap.chosen()}
        with_text = {i for i, s in roots.items() if sc.RL_RESPONSE_CONTENT in s.attributes}
        if capture:
            assert chosen <= with_text
            assert all(roots[i].attributes[sc.RL_RESPONSE_CONTENT] == f"response {i}" for i in with_text)
        else:
            assert with_text == set()
