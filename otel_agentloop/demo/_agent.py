"""A simulated agent loop (no GPU, no model): the main job, and a realistic load for tests and benchmarks.

Per sample: one to ``max_turns`` generation turns with long-tailed latency, tool calls between turns (up to
three in parallel under ``asyncio.gather``), then reward. Latencies come from a generator seeded by
(seed, step, sample, rollout), so a run is reproducible. ``time_scale`` shrinks every sleep.

Misbehaviour for the live view (``simulate --misbehave``): ``hang`` names a sample whose first tool call
never returns by itself (it is left running when the others are done, for the caller to cancel after
collecting the step), ``slow`` one whose first tool call takes ``slow_tool_s`` (unscaled) and then finishes.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..core import _context as ctx
from ..core._phase import trace_generate, trace_reward, trace_tool
from ..health._validation import ValidationCapture

TOOLS = ("search", "calculator", "python")


@dataclass(frozen=True)
class SimConfig:
    """Shape of the simulated workload. Times are seconds before ``time_scale``."""

    prompts: int = 16
    rollout_n: int = 4
    max_turns: int = 3
    gen_median_s: float = 0.12
    gen_sigma: float = 0.5
    straggler_prob: float = 0.03
    straggler_factor: float = 6.0
    tool_prob: float = 0.7
    tool_s: tuple[float, float] = (0.02, 0.15)
    reward_s: tuple[float, float] = (0.01, 0.05)
    tool_fail_prob: float = 0.03
    reward_fail_prob: float = 0.0
    preempt_prob: float = 0.05
    time_scale: float = 1.0
    seed: int = 0
    fail_samples: frozenset[int] = field(default_factory=frozenset)
    """Sample indices whose reward raises (to exercise failure paths)."""
    hang: tuple[int, int] | None = None
    """(sample index, rollout n) whose first tool call hangs until cancelled."""
    hang_grace_s: float = 0.0
    """How long :func:`run_samples` waits for the hung sample after the others finished (unscaled)."""
    slow: tuple[int, int] | None = None
    """(sample index, rollout n) whose first tool call takes ``slow_tool_s`` (unscaled)."""
    slow_tool_s: float = 0.0

    def work(self) -> list[tuple[int, int]]:
        """(sample_index, rollout_n) of one step, in batch order."""
        return [(i, n) for i in range(self.prompts) for n in range(self.rollout_n)]


class ToolError(RuntimeError):
    """A simulated tool failure (the agent loop reports it to the model and goes on)."""


class RewardError(RuntimeError):
    """A simulated reward failure (the sample fails)."""


class StillRunningError(TimeoutError):
    """The outcome :func:`run_samples` gives a sample still running when it stops waiting (not a failure: the
    watchdog's verdict says whether it is hung)."""


def failed(outcome: object) -> bool:
    """Whether a sample's outcome is its failure: an exception that ended its ``rl.sample`` span with an error
    (not :class:`StillRunningError`, and not a cancellation, which the library does not count as an error)."""
    return isinstance(outcome, BaseException) and not isinstance(outcome, (StillRunningError, asyncio.CancelledError))


@trace_generate(model="sim-7b")
async def generate(rng: random.Random, cfg: SimConfig, prompt_tokens: int) -> int:
    """One generation turn; returns the number of tokens generated."""
    delay = rng.lognormvariate(0.0, cfg.gen_sigma) * cfg.gen_median_s
    if rng.random() < cfg.straggler_prob:
        delay *= cfg.straggler_factor
    tokens = max(8, int(delay * 400))
    await asyncio.sleep(delay * cfg.time_scale)
    preempted = 1 if rng.random() < cfg.preempt_prob else 0
    ctx.record_generation(
        input_tokens=prompt_tokens, output_tokens=tokens, finish_reason="stop", num_preempted=preempted
    )
    return tokens


async def _tool(rng: random.Random, cfg: SimConfig) -> str:
    await asyncio.sleep(rng.uniform(*cfg.tool_s) * cfg.time_scale)
    if rng.random() < cfg.tool_fail_prob:
        raise ToolError("tool backend timed out")
    return "ok"


@trace_tool("search")
async def search(rng: random.Random, cfg: SimConfig) -> str:
    return await _tool(rng, cfg)


@trace_tool("calculator")
async def calculator(rng: random.Random, cfg: SimConfig) -> str:
    return await _tool(rng, cfg)


@trace_tool("python")
async def python(rng: random.Random, cfg: SimConfig) -> str:
    return await _tool(rng, cfg)


_TOOL_FUNCS = {"search": search, "calculator": calculator, "python": python}


@trace_tool("sandbox")
async def sandbox(delay: float | None) -> str:
    """A code sandbox that never answers (``delay=None``) or answers late."""
    if delay is None:
        await asyncio.Event().wait()  # until cancelled
    else:
        await asyncio.sleep(delay)
    return "ok"


@trace_reward
async def compute_score(rng: random.Random, cfg: SimConfig, index: int) -> float:
    await asyncio.sleep(rng.uniform(*cfg.reward_s) * cfg.time_scale)
    if index in cfg.fail_samples or rng.random() < cfg.reward_fail_prob:
        raise RewardError(f"reward model failed on sample {index}")
    return rng.random()


def texts(index: int, rollout_n: int, seed: int) -> tuple[str, str]:
    """A simulated prompt and response for a sample (for validation capture)."""
    rng = random.Random(hash((seed, index, rollout_n, "text")) & 0xFFFFFFFF)
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    answer = a * b + (0 if rng.random() < 0.7 else rng.randint(1, 9))
    return f"What is {a} * {b}?", f"<think>{a} * {b} ...</think> The answer is {answer}."


async def run_sample(
    cfg: SimConfig, step: int, index: int, rollout_n: int, capture: ValidationCapture | None = None
) -> float:
    """One sample's agent loop inside its ``sample`` context; returns the reward. With ``capture`` (a
    validation pass), the sample's texts are offered to it."""
    rng = random.Random(hash((cfg.seed, step, index, rollout_n)) & 0xFFFFFFFF)
    async with ctx.sample(index, rollout_n) as handle:
        prompt = rng.randint(64, 512)
        response = 0
        turns = rng.randint(1, cfg.max_turns)
        key = (index, rollout_n)
        for turn in range(turns):
            response += await generate(rng, cfg, prompt + response)
            if turn == 0 and key in (cfg.hang, cfg.slow):
                await sandbox(None if key == cfg.hang else cfg.slow_tool_s)
            if turn < turns - 1 and rng.random() < cfg.tool_prob:
                names = rng.sample(TOOLS, rng.randint(1, 3))
                results = await asyncio.gather(*(_TOOL_FUNCS[n](rng, cfg) for n in names), return_exceptions=True)
                response += 16 * len(results)  # tool responses go back into the context
        handle.record(prompt_length=prompt, response_length=response, turns=turns)
        score = await compute_score(rng, cfg, index)
        if capture is not None:
            capture.offer(*texts(index, rollout_n, cfg.seed), score, sample_index=index, rollout_n=rollout_n, step=step)
        return score


async def run_samples(
    cfg: SimConfig,
    step: int,
    work: Sequence[tuple[int, int]],
    on_done: Callable[[], None] | None = None,
    capture: ValidationCapture | None = None,
    stragglers: list[asyncio.Task[float]] | None = None,
) -> list[float | BaseException]:
    """Run ``work`` concurrently (inside the caller's step context); failed samples come back as exceptions.

    The ``cfg.hang`` sample is awaited at most ``cfg.hang_grace_s`` after the others; if still running it comes
    back as :class:`StillRunningError` and its task is appended to ``stragglers`` (the caller cancels it once the
    step is collected), or cancelled here when ``stragglers`` is ``None``. ``on_done`` is called once per sample
    that finished (succeeded or failed), never for one cancelled: a progress count of finished samples.
    """

    async def one(index: int, rollout_n: int) -> float:
        cancelled = False
        try:
            return await run_sample(cfg, step, index, rollout_n, capture)
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            if on_done is not None and not cancelled:
                on_done()

    tasks = [asyncio.ensure_future(one(i, n)) for i, n in work]
    hung = [t for key, t in zip(work, tasks, strict=True) if key == cfg.hang]
    await asyncio.gather(*(t for t in tasks if t not in hung), return_exceptions=True)
    if hung:
        await asyncio.wait(hung, timeout=cfg.hang_grace_s)
    out: list[float | BaseException] = []
    for task in tasks:
        if not task.done():
            out.append(StillRunningError("sample still running when the step was collected"))
            if stragglers is not None:
                stragglers.append(task)
            else:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        elif task.cancelled():
            out.append(asyncio.CancelledError())
        else:
            exc = task.exception()
            out.append(exc if exc is not None else task.result())
    return out
