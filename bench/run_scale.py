"""Issue 29 (1): one step read from a trace output of 2 steps and of a long run, side by side (and ``--run``).

The outputs are written through the public API, as a training job writes them: ``oal.configure(file=PATH)``,
then per step ``oal.step(N)`` around ``oal.trainer_phase("gen")`` (the rollout: ``--samples`` samples under
``asyncio.gather``, each ``oal.sample(i, rollout_n=n)`` with 3 ``@oal.trace_generate`` turns (usage through
``oal.record_generation``), 1-3 parallel ``@oal.trace_tool`` calls after the first turn and one after the second,
1 % of tool calls failing, a ``@oal.trace_reward``, ``handle.record``), ``handle.metrics.collect(step)`` (the
step's real ``rl.step.summary``) and the trainer's phases after it. A few samples per step fail (the reward
raises) and a few are slow (their tool call waits many loop rounds). Time is compressed: phases wait with
``asyncio.sleep(0)`` (the public API takes no explicit times), so a phase lasts a round of the event loop over
the step's samples, and a slow one many rounds.

A path ending ``.jsonl`` is the one-file layout (``before``); any other path the rolled directory of issue 29
(``after``; what the library writes there is the library's business, this script only names the path). Each
output is written once into ``--keep DIR`` and reused by later runs.

Timed, side by side in one run (interleaved rounds, fresh ``otel-agentloop report`` processes, median of
``--rounds``), on the short and the long output of each layout: ``report --step 1``, ``report --step 1
--perfetto OUT``, ``report --compare 1 2``; wall time, and the child's CPU seconds (user + system) and peak RSS
from its own rusage (``os.wait4``): on a shared machine the CPU seconds are the cost, the wall time the wait. With
``--run-steps N`` (default 1000), two directories of N steps, written by the library's rolled-directory exporter:
``run-N-small``, per step a real summary (``summarize`` on bench/run_page.py's synthetic 8,192-row table) and a
small step file (8 samples' spans); ``run-N-real-size``, the same run with step files of a real run's size (steps
1 to ``--long-steps`` the long directory's own files, index and summary lines; the others extended, sparse, to its
mean step file size). Both timed with ``report --runs`` and ``report --run --html`` (by default, and with
``--step-pages 0``); one step of ``run-N-real-size`` with the step commands above.

    .venv/bin/python bench/run_scale.py --keep /tmp/run-scale [--long-steps 24] [--samples 8192] [--rounds 3]
        [--layouts before,after] [--run-steps 1000] [--views step,run] [--write-only]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from machine import machine  # bench/ is on the path when run as a script
from opentelemetry.sdk.resources import Resource
from run_page import _spans, _table

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.export._rolled import RolledDirectoryExporter, run_dir, step_file
from otel_agentloop.metrics._summary import summarize
from otel_agentloop.metrics._table import compute_metrics

TOOLS = ("search", "python", "calculator", "sandbox")
FAILED_PER_STEP = 4
SLOW_PER_STEP = 8
SLOW_ROUNDS = 200
TRAINER_PHASES = ("old_log_prob", "ref", "adv", "update_actor")


class RewardError(RuntimeError):
    """A reward model that failed (the sample fails)."""


class ToolError(RuntimeError):
    """A tool that failed (the agent loop goes on)."""


@oal.trace_generate(model="qwen2.5-7b-instruct")
async def generate(rng: random.Random, prompt: int) -> int:
    await asyncio.sleep(0)
    tokens = int(rng.lognormvariate(5.5, 0.6))
    oal.record_generation(input_tokens=prompt, output_tokens=tokens, finish_reason="stop", num_preempted=0)
    return tokens


async def _tool(rng: random.Random, rounds: int) -> str:
    for _ in range(rounds):
        await asyncio.sleep(0)
    if rng.random() < 0.01:
        raise ToolError("tool backend timed out")
    return "ok"


TOOL_FUNCS = {name: oal.trace_tool(name)(_tool) for name in TOOLS}


@oal.trace_reward
async def compute_score(rng: random.Random, fail: bool) -> float:
    await asyncio.sleep(0)
    if fail:
        raise RewardError("reward model failed")
    return rng.random()


async def one_sample(step: int, k: int, fail: bool, slow: bool) -> float:
    """One sample: 3 turns, 1-3 parallel tool calls after the first, one after the second, a reward."""
    rng = random.Random(step * 1_000_003 + k)
    index, rollout = divmod(k, 16)
    async with oal.sample(index, rollout_n=rollout) as handle:
        prompt = rng.randrange(100, 2000)
        response = 0
        for turn in range(3):
            response += await generate(rng, prompt + response)
            if turn == 2:
                break
            names = rng.sample(TOOLS, rng.randint(1, 3)) if turn == 0 else [rng.choice(TOOLS)]
            rounds = [SLOW_ROUNDS if slow and turn == 0 and j == 0 else 1 for j in range(len(names))]
            calls = (TOOL_FUNCS[name](rng, r) for name, r in zip(names, rounds, strict=True))
            await asyncio.gather(*calls, return_exceptions=True)
            response += 16 * len(names)
        handle.record(prompt_length=prompt, response_length=response, turns=3)
        return await compute_score(rng, fail)


async def rollout(step: int, samples: int) -> list[float | BaseException]:
    rng = random.Random(step)
    picked = rng.sample(range(samples), FAILED_PER_STEP + SLOW_PER_STEP)
    failed, slow = set(picked[:FAILED_PER_STEP]), set(picked[FAILED_PER_STEP:])
    tasks = [one_sample(step, k, k in failed, k in slow) for k in range(samples)]
    return await asyncio.gather(*tasks, return_exceptions=True)


def run_id(steps: int) -> str:
    return f"run-scale-{steps}"


def write_output(path: Path, steps: int, samples: int) -> dict[str, float]:
    """Write ``steps`` steps of ``samples`` samples to ``path`` through the public API; counts and seconds."""
    t0 = time.perf_counter()
    handle = oal.configure(
        "rollout",
        file=str(path),
        run_id=run_id(steps),
        set_global=False,
        max_queue_size=1 << 17,
        max_export_batch_size=512,
        watchdog=False,
    )
    try:
        for step in range(1, steps + 1):
            timing: dict[str, float] = {}
            with oal.step(step):
                with oal.trainer_phase("gen", timing):
                    outcomes = asyncio.run(rollout(step, samples))
                handle.metrics.collect(step)
                for name in TRAINER_PHASES:
                    with oal.trainer_phase(name, timing):
                        pass
            errors = sum(isinstance(o, BaseException) for o in outcomes)
            handle.force_flush(60.0)
            print(f"  {path.name}: step {step}/{steps} written ({errors} failed samples, "
                  f"{time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
        stats = handle.stats
    finally:
        handle.shutdown(60.0)
    facts = {k: float(v) for k, v in stats.items() if k in ("exported", "dropped", "failed", "pending")}
    facts["write_s"] = time.perf_counter() - t0
    return facts


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def output(keep: Path, layout: str, steps: int, samples: int) -> tuple[Path, dict[str, float]]:
    """The output of ``steps`` steps in ``layout`` (``before``: one ``.jsonl`` file, ``after``: a directory),
    written once into ``keep`` (a ``.done`` file beside it holds its facts)."""
    name = f"{layout}-{steps}x{samples}"
    path = keep / (name + ".jsonl" if layout == "before" else name)
    done = keep / (name + ".done")
    if done.exists():
        return path, json.loads(done.read_text())
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    facts = write_output(path, steps, samples)
    facts["bytes"] = size_of(path)
    done.write_text(json.dumps(facts))
    return path, facts


def write_summaries(path: Path, steps: int, samples: int, long: Path) -> dict[str, float]:
    """A directory of ``steps`` steps by the library's rolled-directory exporter: per step its real summary
    (``summarize`` on bench/run_page.py's synthetic ``samples``-row table) and 8 samples' spans (so the index
    lists the step and its step file exists), as the run and attempt of the output ``long`` (same run folder)."""
    t0 = time.perf_counter()
    first = json.loads((long / "index.jsonl").read_text().splitlines()[0])
    identity = {"service.name": first["service"], sc.RL_RUN_ID: first["run"], sc.RL_RUN_ATTEMPT: first["attempt"]}
    resource = Resource.create(identity)
    exporter = RolledDirectoryExporter(path)
    rng = np.random.default_rng(29)
    summary_bytes = 0
    try:
        for step in range(1, steps + 1):
            table = _table(samples, rng, 1_800_000_000 * 10**9 + step * 60 * 10**9, 1.0 + 30.0 * (step % 97 == 0))
            tools = {name: rng.gamma(1.0, 0.3, samples // 2) for name in TOOLS}
            summary = summarize(table, compute_metrics(table), step, tools=tools, staleness=rng.integers(0, 3, samples))
            json_text = summary.to_json()
            summary_bytes += len(json_text)
            exporter.export(_spans(resource, 40, json_text, step))
    finally:
        exporter.shutdown()
    return {"write_s": time.perf_counter() - t0, "summary_json_bytes": summary_bytes / steps, "bytes": size_of(path)}


def real_sized(small: Path, long: Path, into: Path, steps: int, long_steps: int) -> dict[str, float]:
    """A run of ``steps`` steps with step files of a real run's size: steps 1 to ``long_steps`` are the long
    output's (its step files hard-linked, its index and summary lines), the others ``small``'s with their step
    files extended (sparse, NUL bytes) to the long output's mean step file size. Made once (a ``.done`` file)."""
    done = into.with_name(into.name + ".done")
    if done.exists():
        return dict(json.loads(done.read_text()))
    if into.exists():
        shutil.rmtree(into)
    folder = run_dir(run_id(long_steps), "rollout")
    (into / folder).mkdir(parents=True)
    later = [line for line in (small / "index.jsonl").read_text().splitlines() if json.loads(line)["step"] > long_steps]
    (into / "index.jsonl").write_text((long / "index.jsonl").read_text() + "\n".join(later) + "\n")
    summaries = (small / "summaries.jsonl").read_text().splitlines()
    assert len(summaries) == steps, "one summary line per step, in step order"
    (into / "summaries.jsonl").write_text(
        (long / "summaries.jsonl").read_text() + "\n".join(summaries[long_steps:]) + "\n"
    )
    real = [long / folder / step_file(step, False) for step in range(1, long_steps + 1)]
    mean = sum(p.stat().st_size for p in real) // len(real)
    for step in range(1, steps + 1):
        target = into / folder / step_file(step, False)
        if step <= long_steps:
            os.link(real[step - 1], target)
        else:
            shutil.copyfile(small / folder / step_file(step, False), target)
            os.truncate(target, mean)
    apparent = size_of(into)
    used = sum(p.stat().st_blocks * 512 for p in into.rglob("*") if p.is_file())
    facts = {"step_file_bytes": mean, "apparent_bytes": apparent, "disk_bytes": used}
    done.write_text(json.dumps(facts))
    return facts


@dataclass
class Timed:
    wall_s: list[float]
    cpu_s: list[float]
    rss_mb: list[float]

    def cell(self) -> str:
        """Medians: wall seconds (CPU seconds, user + system), peak RSS."""
        wall, cpu, rss = (statistics.median(x) for x in (self.wall_s, self.cpu_s, self.rss_mb))
        return f"{wall:.2f} s ({cpu:.2f} s CPU), {rss:.0f} MB"

    def wall(self) -> float:
        return statistics.median(self.wall_s)


def timed_report(args: list[str], log: Path) -> tuple[float, float, float]:
    """``otel-agentloop report ARGS`` in a fresh process: its wall seconds, CPU seconds (user + system) and peak
    RSS (MB), the last two from its own rusage (``wait4``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    with open(log, "wb") as out:
        begun = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "otel_agentloop", "report", *args], env=env, stdout=out,
                                 stderr=subprocess.STDOUT)  # fmt: skip
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - begun
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"report {' '.join(args)} failed ({child.returncode}):\n{log.read_text()[-3000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


STEP_COMMANDS = ("report --step 1", "report --step 1 --perfetto OUT", "report --compare 1 2")
RUN_COMMANDS = ("report --runs", "report --run --html OUT", "report --run --html OUT --step-pages 0")


def commands(path: Path, work: Path, names: tuple[str, ...]) -> dict[str, list[str]]:
    """The argument lists of the commands ``names`` on ``path`` (outputs go into ``work``)."""
    f = ["--file", str(path)]
    every = {
        "report --step 1": [*f, "--step", "1"],
        "report --step 1 --perfetto OUT": [*f, "--step", "1", "--perfetto", str(work / "step.json")],
        "report --compare 1 2": [*f, "--compare", "1", "2"],
        "report --runs": [*f, "--runs"],
        "report --run --html OUT": [*f, "--run", "--html", str(work / "run.html")],
        "report --run --html OUT --step-pages 0": [*f, "--run", "--html", str(work / "run.html"), "--step-pages", "0"],
    }
    return {name: every[name] for name in names}


def interleaved(cases: dict[tuple[str, str], list[str]], rounds: int, work: Path) -> dict[tuple[str, str], Timed]:
    """Every case once per round, in the same order, ``rounds`` times."""
    timed = {key: Timed([], [], []) for key in cases}
    for r in range(rounds):
        for key, args in cases.items():
            wall, cpu, rss = timed_report(args, work / "report.log")
            timed[key].wall_s.append(wall)
            timed[key].cpu_s.append(cpu)
            timed[key].rss_mb.append(rss)
            print(f"  round {r + 1}: {key[1]} on {key[0]}: {wall:.2f} s, {cpu:.2f} s CPU, {rss:.0f} MB",
                  file=sys.stderr, flush=True)  # fmt: skip
    return timed


def step_table(names: list[str], timed: dict[tuple[str, str], Timed], run: str | None) -> Iterator[str]:
    """Markdown rows: per layout and command, the short and the long output (and for the directory the
    ``run`` directory) side by side, with the ratios to the short one."""
    n = run.split("-")[1] if run is not None else "N"
    yield f"| layout | command | 2 steps | long | long / 2 steps | {n} steps | {n} / 2 steps |"
    yield "|---|---|---|---|---|---|---|"
    for layout in ("before", "after"):
        mine = sorted((n for n in names if n.startswith(layout + "-")), key=lambda n: int(n.split("-")[1]))
        if len(mine) != 2:
            continue
        for command in STEP_COMMANDS:
            short, long = timed[(mine[0], command)], timed[(mine[1], command)]
            row = f"| {layout} | `{command}` | {short.cell()} | {long.cell()} | {long.wall() / short.wall():.2f}x |"
            if layout == "after" and run is not None:
                at_run = timed[(run, command)]
                yield row + f" {at_run.cell()} | {at_run.wall() / short.wall():.2f}x |"
            else:
                yield row + " | |"


def run_table(sizes: dict[str, int], timed: dict[tuple[str, str], Timed]) -> Iterator[str]:
    """Markdown rows: per output, the run view's commands (median wall, peak RSS)."""
    yield "| output | bytes (apparent) | " + " | ".join(f"`{c}`" for c in RUN_COMMANDS) + " |"
    yield "|---|---|" + "---|" * len(RUN_COMMANDS)
    for name, size in sizes.items():
        if all((name, c) in timed for c in RUN_COMMANDS):
            cells = " | ".join(timed[(name, c)].cell() for c in RUN_COMMANDS)
            yield f"| {name} | {size / 2**30:.2f} GiB | {cells} |"


def run_outputs(keep: Path, steps: int, samples: int, long_steps: int) -> dict[str, tuple[Path, dict[str, float]]]:
    """The ``--run`` directories of ``steps`` steps: summaries with small step files, and with real-size ones."""
    small, real = keep / f"run-{steps}-small", keep / f"run-{steps}-real-size"
    long = keep / f"after-{long_steps}x{samples}"
    done = keep / f"run-{steps}-small.done"
    if not done.exists():
        if small.exists():
            shutil.rmtree(small)
        done.write_text(json.dumps(write_summaries(small, steps, samples, long)))
    facts = json.loads(done.read_text())
    return {
        f"run-{steps}-small": (small, facts),
        f"run-{steps}-real-size": (real, real_sized(small, long, real, steps, long_steps)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep", type=Path, required=True, help="folder the outputs are written into once and reused")
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--long-steps", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layouts", default="before,after", help="before (one .jsonl file), after (a directory)")
    ap.add_argument("--run-steps", type=int, default=1000, help="steps of the --run directory (0: none)")
    ap.add_argument("--views", default="step,run", help="step (--step/--perfetto/--compare), run (--run/--runs)")
    ap.add_argument("--write-only", action="store_true", help="write the outputs, time nothing")
    args = ap.parse_args()
    args.keep.mkdir(parents=True, exist_ok=True)
    work = args.keep / f"work-{os.getpid()}"  # the reports' outputs (a run beside this one has its own)
    work.mkdir()
    load_before = os.getloadavg()
    outputs: dict[str, tuple[Path, dict[str, float]]] = {}
    for layout in args.layouts.split(","):
        for steps in (2, args.long_steps):
            outputs[f"{layout}-{steps}"] = output(args.keep, layout, steps, args.samples)
    runs = run_outputs(args.keep, args.run_steps, args.samples, args.long_steps) if args.run_steps else {}
    print(json.dumps({name: {"path": str(p), **f} for name, (p, f) in {**outputs, **runs}.items()}, indent=1))
    if args.write_only:
        return 0
    views = args.views.split(",")
    every = {**outputs, **runs}
    real = next((n for n in runs if n.endswith("real-size")), None)
    cases: dict[tuple[str, str], list[str]] = {}
    if "step" in views:  # one step of each output, and of the real-size run
        stepped = {**outputs, **({real: runs[real]} if real else {})}
        cases.update({(n, c): a for n, (p, _) in stepped.items() for c, a in commands(p, work, STEP_COMMANDS).items()})
    if "run" in views:
        cases.update({(n, c): a for n, (p, _) in every.items() for c, a in commands(p, work, RUN_COMMANDS).items()})
    timed = interleaved(cases, args.rounds, work)
    print(json.dumps({f"{k[0]} | {k[1]}": vars(v) for k, v in timed.items()}, indent=1))
    print(f"\nMachine: {machine()}; load average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f}\n")
    if "step" in views:
        print("\n".join(step_table(list(outputs), timed, real)) + "\n")
    if "run" in views:
        print("\n".join(run_table({n: size_of(p) for n, (p, _) in every.items()}, timed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
