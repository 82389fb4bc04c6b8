"""Issue 20: the recording fast path against a bare SDK span, side by side in one process (numbers, not tests).

For each wrapper kind (a sync, an async and a generator ``@otel_agentloop.phase("tool_calls")`` function,
called inside ``sample(i)`` inside ``step(s)``), interleaved rounds of:

- ``fast``: the decorated phase, ``configure(file=..., set_global=False, fast_path=True)`` (OTLP-JSON file);
- ``sdk``: the same with ``fast_path=False`` (every span through the OpenTelemetry SDK, as before issue 20);
- ``bare``: a bare SDK span with the same name and attributes (read back from an exported phase span, and
  checked equal on the first round), ``tracer.start_span(...)``/``span.end()`` around the same undecorated
  function, through an SDK ``TracerProvider`` whose only processor is our ``ExportProcessor`` (same queue and
  batch settings) on the same ``OTLPJsonFileExporter``, as a child of bare step and sample spans;
- ``disabled``: the decorated phase with ``configure(enabled=False)``;
- ``plain``: the undecorated function.

Each traced round uses a fresh handle (or provider) and file, makes at least ``--calls`` calls and as many as
last ``--round-s`` seconds (calibrated on the warm-up, so the export thread runs during the calls whatever its
wake-up rule), and measures per call: wall time on the training thread while the export thread runs (its GIL
share included, as far as it exported during the calls: reported), the wall until ``force_flush`` returned, the
training thread's CPU (``time.thread_time_ns``), and process CPU per span (``time.process_time_ns``, every
thread) from before the scopes open until ``force_flush`` returned, i.e. every span materialised, encoded and
written. Spans exported and dropped are counted (expected: calls + one sample and one step span per round).
Medians over the rounds; ratios are ratios of the medians, and for the key ones also the median of the
per-round ratios. On a tree without the fast path the ``fast`` and ``sdk`` configurations are the same code
(the section says so). With ``--step-pairs``, ``step_overhead.measure`` then runs off, fast and SDK processes.

Run: .venv/bin/python bench/fast_path.py [--calls N] [--rounds R] [--round-s S] [--step-pairs P]
[--step-prompts P] [--write bench/RESULTS.md]
(``--write`` replaces the "Fast path (issue 20)" section of that file, or appends it.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_overhead
from machine import machine
from paths import configure_on, has_fast_path, path_used

import otel_agentloop as oal
from otel_agentloop.analysis import read_jsonl
from otel_agentloop.export._file import OTLPJsonFileExporter
from otel_agentloop.export._processor import ExportProcessor

SECTION = "## Fast path (issue 20)"
KINDS = ("sync", "async", "generator")
TRACED = ("fast", "sdk", "bare")
CONFIGS = (*TRACED, "disabled", "plain")
EXPORT = {"max_queue_size": 1 << 21, "max_export_batch_size": 512, "schedule_delay_s": 0.2}
STEP, SAMPLE = 7, 3
UNTRACED_FACTOR = 10  # the disabled path and the plain call are ~100x cheaper: more calls per round


# -- the functions measured ---------------------------------------------------------------------------
def plain_sync() -> None:
    return None


async def plain_async() -> None:
    return None


def plain_generator() -> Generator[None, None, None]:
    yield None


PLAIN: dict[str, Callable[[], Any]] = {"sync": plain_sync, "async": plain_async, "generator": plain_generator}
DECORATED: dict[str, Callable[[], Any]] = {kind: oal.phase("tool_calls")(fn) for kind, fn in PLAIN.items()}


# -- the loops: one per kind, each call through ``call`` --------------------------------------------------
def _loop_sync(call: Callable[[], Any], n: int) -> tuple[int, int]:
    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    for _ in range(n):
        call()
    return time.perf_counter_ns() - t0, time.thread_time_ns() - c0


async def _loop_async(call: Callable[[], Any], n: int) -> tuple[int, int]:
    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    for _ in range(n):
        await call()
    return time.perf_counter_ns() - t0, time.thread_time_ns() - c0


def _loop_generator(call: Callable[[], Any], n: int) -> tuple[int, int]:
    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    for _ in range(n):
        for _ in call():
            pass
    return time.perf_counter_ns() - t0, time.thread_time_ns() - c0


_EVENT_LOOP = asyncio.new_event_loop()


def drive(kind: str, call: Callable[[], Any], n: int, scopes: Callable[[], Any]) -> tuple[int, int]:
    """(wall ns, training-thread CPU ns) of ``n`` calls of ``call`` inside ``scopes()`` (a context manager
    entered and left outside the timed loop; inside the coroutine for the async kind)."""
    if kind == "async":

        async def run() -> tuple[int, int]:
            with scopes():
                return await _loop_async(call, n)

        return _EVENT_LOOP.run_until_complete(run())
    loop = _loop_generator if kind == "generator" else _loop_sync
    with scopes():
        return loop(call, n)


@contextlib.contextmanager
def our_scopes() -> Generator[None, None, None]:
    with oal.step(STEP), oal.sample(SAMPLE):
        yield


# -- the bare SDK baseline ------------------------------------------------------------------------------
@dataclass
class Shape:
    """Name and attributes of one exported phase span, and of its sample and step spans."""

    name: str
    attributes: dict[str, Any]
    sample_attributes: dict[str, Any]
    step_attributes: dict[str, Any]


def read_shapes(path: str) -> dict[str, Shape]:
    """Each phase span name in ``path`` -> its shape (the sample and step spans it sits in)."""
    records = list(read_jsonl(path))
    by_name = {r.name: r for r in records}
    sample, step = by_name.get("rl.sample"), by_name.get("rl.step")
    out = {}
    for r in records:
        if r.attributes.get("rl.phase") == "tool_calls":
            out[r.name] = Shape(
                r.name,
                dict(r.attributes),
                dict(sample.attributes) if sample else {},
                dict(step.attributes) if step else {},
            )
    return out


def bare_calls(kind: str, tracer: trace.Tracer, shape: Shape) -> Callable[[], Any]:
    """A call of the undecorated function inside a bare SDK span of ``shape``."""
    name, attrs, fn = shape.name, shape.attributes, PLAIN[kind]
    start = tracer.start_span
    if kind == "async":

        async def bare_async() -> None:
            span = start(name, attributes=attrs)
            await fn()
            span.end()

        return bare_async
    if kind == "generator":

        def bare_generator() -> Generator[None, None, None]:
            span = start(name, attributes=attrs)
            yield from fn()
            span.end()

        return bare_generator

    def bare_sync() -> None:
        span = start(name, attributes=attrs)
        fn()
        span.end()

    return bare_sync


def bare_provider(path: str) -> tuple[TracerProvider, ExportProcessor]:
    provider = TracerProvider(resource=Resource.create({"service.name": "bench-bare"}), shutdown_on_exit=False)
    export = ExportProcessor(OTLPJsonFileExporter(path), export_timeout_s=30, name="bench-bare", **EXPORT)  # type: ignore[arg-type]
    provider.add_span_processor(export)
    return provider, export


def bare_scopes(tracer: trace.Tracer, shape: Shape) -> Callable[[], Any]:
    @contextlib.contextmanager
    def scopes() -> Generator[None, None, None]:
        with (
            tracer.start_as_current_span("rl.step", attributes=shape.step_attributes),
            tracer.start_as_current_span("rl.sample", attributes=shape.sample_attributes),
        ):
            yield

    return scopes


# -- one measurement ------------------------------------------------------------------------------------
@dataclass
class Result:
    wall_us: float
    thread_us: float
    process_us: float = float("nan")
    exported: int = 0
    dropped: int = 0
    expected: int = 0
    path: str = ""
    during: float = float("nan")  # share of the spans already exported when the loop and scopes ended
    flushed_us: float = float("nan")  # wall per span from before the scopes open until force_flush returned
    calls: int = 0


def measure(kind: str, config: str, n: int, tmp: str, shapes: dict[str, Shape]) -> tuple[Result, str]:
    """One round of ``config`` for ``kind``: the result, and the file written (empty when untraced)."""
    path = os.path.join(tmp, f"{kind}-{config}.jsonl")
    gc.collect()
    if config in ("disabled", "plain"):
        calls = n * UNTRACED_FACTOR
        handle = oal.configure("bench-off", enabled=False) if config == "disabled" else None
        call = DECORATED[kind] if config == "disabled" else PLAIN[kind]
        scopes = our_scopes if config == "disabled" else contextlib.nullcontext
        wall, cpu = drive(kind, call, calls, scopes)
        if handle is not None:
            handle.shutdown(5)
        return Result(wall / calls / 1e3, cpu / calls / 1e3, path="off"), ""
    p0, w0 = time.process_time_ns(), time.perf_counter_ns()
    if config == "bare":
        shape = shapes[f"execute_tool {PLAIN[kind].__name__}"]
        provider, export = bare_provider(path)
        tracer = provider.get_tracer("bench")
        wall, cpu = drive(kind, bare_calls(kind, tracer, shape), n, bare_scopes(tracer, shape))
        during = export.stats["exported"] / (n + 2)
        provider.force_flush(600_000)
        p1, w1 = time.process_time_ns(), time.perf_counter_ns()
        stats, used = export.stats, "SDK span"
        provider.shutdown()
    else:
        handle = configure_on(config, service_name="bench-fast", file=path, set_global=False, **EXPORT)
        wall, cpu = drive(kind, DECORATED[kind], n, our_scopes)
        during = handle.stats["exported"] / (n + 2)
        handle.force_flush(600)
        p1, w1 = time.process_time_ns(), time.perf_counter_ns()
        stats, used = handle.stats, path_used(handle)
        handle.shutdown(30)
    result = Result(
        wall / n / 1e3,
        cpu / n / 1e3,
        (p1 - p0) / n / 1e3,
        stats["exported"],
        stats["dropped"],
        n + 2,  # the phase spans, the sample span and the step span
        used,
        during,
        (w1 - w0) / n / 1e3,
        n,
    )
    return result, path


def check_same_shape(path: str, ours: dict[str, Shape], what: str) -> list[str]:
    """Differences between the phase spans in ``path`` and ``ours`` (name, attributes, parentage): none
    expected. ``what`` names the spans of ``path`` in the messages."""
    problems = []
    theirs = read_shapes(path)
    if not theirs:
        problems.append(f"{what}: no phase span exported")
    for name, shape in theirs.items():
        mine = ours.get(name)
        if mine is None:
            problems.append(f"{what}: span {name!r} has no fast-path phase span of that name")
        elif mine.attributes != shape.attributes:
            problems.append(f"{what}: {name}: attributes differ: fast path {mine.attributes}, {shape.attributes}")
    records = list(read_jsonl(path))
    parents = {r.span_id for r in records if r.name == "rl.sample"}
    if any(r.parent_id not in parents for r in records if r.name in theirs):
        problems.append(f"{what}: a phase span is not a child of its sample span")
    return problems


def calibrated(calls: int, round_s: float, wall_us: float) -> int:
    """At least ``calls``, and enough calls to last ``round_s`` at ``wall_us`` per call (thousands)."""
    return max(calls, math.ceil(round_s / (wall_us * 1e-6) / 1000) * 1000)


def bench(calls: int, rounds: int, round_s: float) -> dict[str, Any]:
    """Warm up (read the phase spans' shape, time each configuration), then ``rounds`` interleaved rounds, the
    order of the configurations rotating every round. A traced configuration makes at least ``calls`` calls
    per round, and as many as last ``round_s`` by the warm-up's timing: several export periods, so the export
    thread runs while the calls do (a pipeline that wakes on a timer, or at a fraction of a large queue, would
    otherwise run only in ``force_flush``, after the timed loop)."""
    tmp = tempfile.mkdtemp(prefix="bench-fast-")
    try:
        shapes: dict[str, Shape] = {}
        problems: list[str] = []
        sizes: dict[tuple[str, str], int] = {}
        for kind in KINDS:  # warm-up: every code path once, and the shape of our phase spans
            for config in CONFIGS:
                warm, path = measure(kind, config, 2000, tmp, shapes)
                if config == "fast":
                    shapes.update(read_shapes(path))
                elif config in TRACED:
                    problems += check_same_shape(path, shapes, f"{kind} {config}")
                sizes[kind, config] = calibrated(calls, round_s, warm.wall_us) if config in TRACED else calls
                if path:
                    os.remove(path)
        results: dict[tuple[str, str], list[Result]] = {(k, c): [] for k in KINDS for c in CONFIGS}
        for r in range(rounds):
            for kind in KINDS:
                shift = (r + KINDS.index(kind)) % len(CONFIGS)
                for config in CONFIGS[shift:] + CONFIGS[:shift]:
                    result, path = measure(kind, config, sizes[kind, config], tmp, shapes)
                    results[kind, config].append(result)
                    if path:
                        os.remove(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"results": results, "problems": problems, "shapes": shapes, "sizes": sizes}


# -- the section ----------------------------------------------------------------------------------------
def _median(rs: list[Result], field: str) -> float:
    return float(statistics.median(float(getattr(r, field)) for r in rs))


def _verdict(ratio: float, target: float) -> str:
    return f"target <= {target}x: {'met' if ratio <= target else 'NOT met'}"


def table(results: dict[tuple[str, str], list[Result]]) -> str:
    def row(label: str, cells: Callable[[str], str], note: str = "") -> str:
        return f"| {label} | " + " | ".join(cells(k) for k in KINDS) + f" | {note} |"

    def us(config: str, field: str, digits: int = 2) -> Callable[[str], str]:
        return lambda k: f"{_median(results[k, config], field):.{digits}f} us"

    def ratio(a: str, b: str, field: str) -> Callable[[str], str]:
        return lambda k: f"{_median(results[k, a], field) / _median(results[k, b], field):.2f}x"

    def share(config: str) -> Callable[[str], str]:
        return lambda k: f"{_median(results[k, config], 'during'):.0%}"

    def paired(a: str, field: str) -> Callable[[str], str]:
        """The median of the per-round ratios: each round runs its configurations back to back, so the
        load of the shared machine at that moment cancels out better than in a ratio of medians."""

        def cell(k: str) -> str:
            pairs = zip(results[k, a], results[k, "bare"], strict=True)
            return f"{statistics.median(getattr(x, field) / getattr(y, field) for x, y in pairs):.2f}x"

        return cell

    def sizes(k: str) -> str:
        return " / ".join(f"{results[k, c][0].calls:,}" for c in TRACED)

    def worst(a: str, field: str) -> float:
        return max(_median(results[k, a], field) / _median(results[k, "bare"], field) for k in KINDS)

    rows = [
        "| measure | sync | async | generator | |",
        "|---|---|---|---|---|",
        row("wall per call, fast path", us("fast", "wall_us"), "training thread; export thread running"),
        row("wall per call, SDK path (`fast_path=False`)", us("sdk", "wall_us")),
        row("wall per call, bare SDK span", us("bare", "wall_us"), "same attributes, same export"),
        row("**fast / bare SDK, wall**", ratio("fast", "bare", "wall_us"), _verdict(worst("fast", "wall_us"), 0.25)),
        row("fast / bare SDK, wall, median of per-round ratios", paired("fast", "wall_us"), "rounds back to back"),
        row("SDK path / bare SDK, wall", ratio("sdk", "bare", "wall_us")),
        row("wall per span until flushed, fast path", us("fast", "flushed_us"), "loop + scopes + `force_flush`"),
        row("wall per span until flushed, SDK path", us("sdk", "flushed_us")),
        row("wall per span until flushed, bare SDK span", us("bare", "flushed_us")),
        row("fast / bare SDK, wall until flushed", ratio("fast", "bare", "flushed_us")),
        row("training-thread CPU per call, fast path", us("fast", "thread_us"), "`time.thread_time_ns`"),
        row("training-thread CPU per call, SDK path", us("sdk", "thread_us")),
        row("training-thread CPU per call, bare SDK span", us("bare", "thread_us")),
        row(
            "**fast / bare SDK, training-thread CPU**",
            ratio("fast", "bare", "thread_us"),
            _verdict(worst("fast", "thread_us"), 0.25),
        ),
        row("fast / bare SDK, training-thread CPU, median of per-round ratios", paired("fast", "thread_us")),
        row("process CPU per span, fast path", us("fast", "process_us"), "all threads, until flushed and written"),
        row("process CPU per span, SDK path", us("sdk", "process_us")),
        row("process CPU per span, bare SDK span", us("bare", "process_us")),
        row(
            "**fast / bare SDK, process CPU**",
            ratio("fast", "bare", "process_us"),
            _verdict(worst("fast", "process_us"), 0.5),
        ),
        row("fast / bare SDK, process CPU, median of per-round ratios", paired("fast", "process_us")),
        row("SDK path / bare SDK, process CPU", ratio("sdk", "bare", "process_us")),
        row("calls per round, fast / SDK path / bare", sizes, "calibrated on the warm-up"),
        row("exported while the calls ran, fast path", share("fast"), "the rest waited for `force_flush`"),
        row("exported while the calls ran, SDK path", share("sdk")),
        row("exported while the calls ran, bare SDK span", share("bare")),
        row(
            "disabled (`configure(enabled=False)`), wall",
            us("disabled", "wall_us", 3),
            "must stay as before the fast path",
        ),
        row("disabled, training-thread CPU", us("disabled", "thread_us", 3)),
        row("undecorated call, wall", us("plain", "wall_us", 3)),
    ]
    return "\n".join(rows)


def counts(results: dict[tuple[str, str], list[Result]]) -> str:
    parts = []
    for config in TRACED:
        rs = [r for k in KINDS for r in results[k, config]]
        exported, expected = sum(r.exported for r in rs), sum(r.expected for r in rs)
        dropped = sum(r.dropped for r in rs)
        ok = "" if exported == expected and dropped == 0 else " **MISMATCH**"
        parts.append(f"{config}: {exported:,} exported of {expected:,}, {dropped} dropped{ok}")
    return "; ".join(parts)


def step_table(step: dict[str, Any]) -> str:
    rows = [
        f"| step ({step['samples']:,} samples per process) | median step wall | overhead vs. off | target "
        "| process CPU per step (all threads) |",
        "|---|---|---|---|---|",
    ]
    off = step["median"]["off"]
    rows.append(f"| tracing off | {off:.3f} s | | | {step['cpu']['off']:.3f} s |")
    for path in step["paths"]:
        m = step["median"][path]
        over = (m - off) / off * 100
        label = {"fast": "fast path", "sdk": "SDK path (`fast_path=False`)"}[path]
        verdict = "met" if over < 0.5 else "NOT met"
        rows.append(
            f"| {label} (ran: {step['used'][path]}) | {m:.3f} s | **{over:+.2f}%** | < 0.5%: {verdict} "
            f"| {step['cpu'][path]:.3f} s |"
        )
    return "\n".join(rows)


def _load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def section(calls: int, rounds: int, step_pairs: int, step_prompts: int = 256, round_s: float = 0.5) -> str:
    load_start = _load()
    out = bench(calls, rounds, round_s)
    load_calls = _load()
    results = out["results"]
    used = {c: sorted({r.path for k in KINDS for r in results[k, c]}) for c in ("fast", "sdk")}
    if has_fast_path():
        paths_line = f"Paths used: fast column {used['fast']}, SDK path column {used['sdk']}."
    else:
        paths_line = (
            "**This tree has no fast path**: `fast_path` is not a setting here, so the fast-path and SDK-path "
            "columns run the same code (today's SDK path); they differ only by noise. The lead re-runs this "
            "after the fast path lands."
        )
    shape = out["shapes"].get("execute_tool plain_sync")
    attrs = ", ".join(f"`{k}`" for k in shape.attributes) if shape else "?"
    checked = (
        "; ".join(out["problems"])
        if out["problems"]
        else "checked equal, and equal to the SDK path's, on the warm-up round"
    )
    text = f"""{SECTION}

Machine: {machine()}. `bench/fast_path.py --calls {calls} --rounds {rounds} --round-s {round_s}
--step-pairs {step_pairs} --step-prompts {step_prompts}`. Load average (1 min; the machine is shared):
{load_start} at the start, {load_calls} after the per-call rounds.
{paths_line}

One process; for each kind a `@otel_agentloop.phase("tool_calls")` function inside `sample({SAMPLE})` inside
`step({STEP})`, {rounds} interleaved rounds (order rotating), median. Each traced configuration makes at least
{calls:,} calls per round, and as many as last {round_s} s by the warm-up's timing (several export periods, so
the export thread runs while the calls do; "calls per round" row). Fast and SDK path:
`configure(file=..., set_global=False)` (OTLP-JSON file export), a fresh handle per round. Bare SDK span:
`tracer.start_span(name, attributes=...)`/`span.end()` around the same undecorated function, with the phase
span's attributes ({attrs}; {checked}) as a child of bare sample and step spans, through an SDK
`TracerProvider` whose only processor is our `ExportProcessor` (queue 2^21, batch 512, delay 0.2 s, as ours) on
`OTLPJsonFileExporter`. Wall: the calls' loop, with the export thread running: its GIL share included as far
as it exported while the calls ran (the "exported while the calls ran" rows); "until flushed" adds the wait for
`force_flush` (what is left to materialise and encode after the loop), per span.
Process CPU: every thread, from before the scopes open until `force_flush` returned (materialised, encoded,
written), per span. Disabled and undecorated: {calls * UNTRACED_FACTOR:,} calls per
round. Spans: {counts(results)}.

{table(results)}
"""
    if step_pairs:
        step = step_overhead.measure(pairs=step_pairs, prompts=step_prompts, paths=("fast", "sdk"))
        text += f"""
Then, in the same run, `bench/step_overhead.py`'s step: {step["samples"]:,} samples per step in one process,
{step_pairs} interleaved triples of fresh processes (off, fast path, SDK path) x {step["steps"]} steps each, file
export; load average {_load()} at the end.

{step_table(step)}

Per-step walls (s): {"; ".join(f"{m} {[round(w, 3) for w in ws]}" for m, ws in step["walls"].items())}.
Start burst (median, all samples started): {", ".join(f"{m} {b:.0f} ms" for m, b in step["burst_ms"].items())}.
"""
    return text


def write_section(path: str, text: str) -> None:
    """Replace the section in ``path`` (up to the next ``## `` heading), or append it."""
    with open(path) as f:
        old = f.read()
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    new = pattern.sub(lambda _: text.rstrip("\n") + "\n\n", old, count=1) if pattern.search(old) else None
    if new is None:
        new = old.rstrip("\n") + "\n\n" + text
    with open(path, "w") as f:
        f.write(new.rstrip("\n") + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--round-s", type=float, default=0.5, help="seconds of calls per traced round, at least")
    ap.add_argument("--step-pairs", type=int, default=3, help="step_overhead triples (0: skip)")
    ap.add_argument("--step-prompts", type=int, default=256, help="prompts per step (x4 samples)")
    ap.add_argument("--write", help="replace (or append) the section in this RESULTS.md")
    args = ap.parse_args()
    text = section(args.calls, args.rounds, args.step_pairs, args.step_prompts, args.round_s)
    print(text)
    if args.write:
        write_section(args.write, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
