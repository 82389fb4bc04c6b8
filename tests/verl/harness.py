"""Run real verl 0.9.1 agent-loop code on CPU: ToolAgentLoop with real tools, the real LLMServerClient in front
of a fake LLM server, the worker's postprocess and _compute_score, and verl's own metric formula.

Nothing is downloaded: the tokenizer is built here (byte-level BPE with no merges: every byte a token, exact
round trip) with a ChatML chat template that renders tools and tool calls. The fake server answers with hermes
``<tool_call>`` blocks on the first turn (two in parallel for even samples) and a final answer after.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np
from omegaconf import OmegaConf

IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|endoftext|>"

CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}<|im_end|>\n"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant\n{% if m.content %}{{ m.content }}{% endif %}"
    "{%- if m.tool_calls %}{% for tc in m.tool_calls %}"
    '\n<tool_call>\n{"name": "{{ tc.function.name }}", "arguments": '
    "{{ (tc.function.arguments | tojson) if tc.function.arguments is mapping else tc.function.arguments }}}"
    "\n</tool_call>{% endfor %}{% endif %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=IM_END, pad_token=PAD, additional_special_tokens=[IM_START]
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


class _Remote:
    """Stands in for a Ray actor method: ``.remote(...)`` returns an awaitable (or None: fire and forget)."""

    def __init__(self, fn: Callable[..., Any], awaited: bool = True) -> None:
        self.fn, self.awaited = fn, awaited

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        result = self.fn(*args, **kwargs)
        if not self.awaited:
            return None
        if asyncio.iscoroutine(result):
            return result

        async def value() -> Any:
            return result

        return value()


class FakeServer:
    """The LLM behind verl's LLMServerClient. Turn k of sample i (request ``det-i``) sleeps ``gen_delay(i, k)``."""

    def __init__(self, tokenizer: Any, gen_delay: Callable[[int, int], float], preempted: Callable[[int, int], Any]):
        self.tokenizer = tokenizer
        self.gen_delay = gen_delay
        self.preempted = preempted
        self.turns: dict[str, int] = {}
        self.version = 0  # the weight version (trainer step) it serves, reported like verl's servers do
        self.engine_numbers = False  # answer the carrier with engine numbers, as the instrumented server does

        async def generate(
            request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any
        ) -> Any:
            from verl.workers.rollout.replica import TokenOutput

            sample = _sample_of(request_id, self.tokenizer.decode(prompt_ids))
            turn = self.turns.get(request_id, 0)
            self.turns[request_id] = turn + 1
            await asyncio.sleep(self.gen_delay(sample, turn))
            if turn == 0 and sample % 3 != 2:  # samples 2, 5, ... answer at once: no tool call
                calls = [("add", {"a": sample, "b": 1})]
                if sample % 2 == 0:
                    calls.append(("lookup", {"key": f"k{sample}"}))  # two parallel calls
                text = "Let me use tools." + "".join(
                    f'\n<tool_call>\n{{"name": "{n}", "arguments": {json.dumps(a)}}}\n</tool_call>' for n, a in calls
                )
            else:
                text = f"The answer is {sample + 1}."
            ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
            extra: dict[str, Any] = {"global_steps": self.version}
            if self.engine_numbers and kwargs.get(ENGINE_KEY) is not None:
                extra[ENGINE_KEY] = engine_numbers(sample, turn, len(ids))
            return TokenOutput(
                token_ids=ids,
                stop_reason="completed",
                num_preempted=self.preempted(sample, turn),
                extra_fields=extra,
            )

        self.generate = _Remote(generate)


ENGINE_KEY = "otel_agentloop_engine"  # integrations.verl._engine_path.ENGINE_KEY (not imported: pickled by value)


def engine_numbers(sample: int, turn: int, tokens: int) -> dict[str, Any]:
    """What the instrumented server sends back for one request (``_engine_path._send_back``): known numbers."""
    return {
        "rl.engine.name": "vllm",
        "rl.engine.queue_s": 0.001 * (sample + 1),
        "rl.engine.time_to_first_token_s": 0.002 * (sample + 1) + 0.001 * turn,
        "rl.engine.prefill_s": 0.001,
        "rl.engine.decode_s": 0.01 * (turn + 1),
        "gen_ai.usage.output_tokens": tokens,
    }


def carrier_signature(server: FakeServer) -> None:
    """The fake server takes the carrier keyword, as a server made remote from verl's patched class does
    (``_engine_path.accepts_carrier`` reads the handle's method signatures)."""
    import inspect

    server.engine_numbers = True
    param = inspect.Parameter(ENGINE_KEY, inspect.Parameter.KEYWORD_ONLY, default=None)
    server._ray_method_signatures = {"generate": [param]}  # type: ignore[attr-defined]


def _sample_of(request_id: str, prompt: str) -> int:
    """The sample number: from ``det-<priority>`` request ids, else from the prompt text ("What is <i> + 1?")."""
    tail = request_id.rsplit("-", 1)[-1]
    if request_id.startswith("det-") and tail.isdigit():
        return int(tail)
    found = re.findall(r"What is (\d+) \+ 1\?", prompt)
    return int(found[-1]) if found else 0


class FakeLoadBalancer:
    def __init__(self, server: FakeServer) -> None:
        self.require_acquire_fields = _Remote(lambda: [])
        self.require_release_fields = _Remote(lambda: [])
        self.acquire_server = _Remote(lambda request_id, **_: ("server-0", server))
        self.release_server = _Remote(lambda **_: None, awaited=False)


_TOOL_DELAY: list[Callable[[str, int], float]] = [lambda name, x: 0.0]


def make_tools(tool_delay: Callable[[str, int], float]) -> list[Any]:
    """Real verl FunctionTools (schema from type hints and docstring), registered once per process; they sleep
    ``tool_delay(name, x)`` of the latest call (a test module running after another gets its own delays)."""
    from verl.tools.function_tool import FUNCTION_TOOL_REGISTRY, function_tool

    _TOOL_DELAY[0] = tool_delay

    if "add" not in FUNCTION_TOOL_REGISTRY:

        @function_tool("add")
        async def add(a: int, b: int) -> str:
            """Add two integers.

            Args:
                a: first number.
                b: second number.
            """
            await asyncio.sleep(_TOOL_DELAY[0]("add", a))
            return str(a + b)

        @function_tool("lookup")
        async def lookup(key: str) -> str:
            """Look a key up.

            Args:
                key: the key.
            """
            await asyncio.sleep(_TOOL_DELAY[0]("lookup", int(key[1:])))
            return f"value of {key}"

    return [FUNCTION_TOOL_REGISTRY["add"], FUNCTION_TOOL_REGISTRY["lookup"]]


class FakeRewardWorker:
    """Stands in for the RewardLoopWorker actor: verl's real _compute_score builds the DataProto and awaits this."""

    def __init__(self, score_delay: Callable[[int], float]) -> None:
        async def compute_score(data: Any) -> dict[str, Any]:
            index = int(data.non_tensor_batch["index"][0])
            await asyncio.sleep(score_delay(index))
            return {"reward_score": float(index % 2), "reward_extra_info": {"acc": float(index % 2)}}

        self.compute_score = _Remote(compute_score)


def make_config(full_determinism: bool = True, n: int = 1) -> Any:
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "name": "vllm",
                    "prompt_length": 2048,
                    "response_length": 1024,
                    "full_determinism": full_determinism,
                    "n": n,
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "top_k": -1,
                    "calculate_log_probs": False,
                    "val_kwargs": {"top_p": 1.0, "top_k": -1, "temperature": 0.0, "n": 1},
                    "agent": {"default_agent_loop": "tool_agent"},
                    "multi_turn": {
                        "format": "hermes",
                        "max_user_turns": 4,
                        "max_assistant_turns": 4,
                        "max_parallel_calls": 4,
                        "max_tool_response_length": 256,
                        "tool_response_truncate_side": "middle",
                    },
                }
            },
            "data": {"apply_chat_template_kwargs": {}, "mm_processor_kwargs": {}},
        }
    )


def make_worker(
    tokenizer: Any,
    server: FakeServer,
    tools: list[Any],
    reward: FakeRewardWorker,
    *,
    worker: Any = None,
    config: Any = None,
    client_cls: Any = None,
) -> Any:
    """An AgentLoopWorker built without __init__ (which would start model and dataset machinery); or, given
    ``worker`` (e.g. a real actor's ``self``), its fields set the same way."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.utils.dataset.rl_dataset import RLHFDataset
    from verl.workers.rollout.llm_server import LLMServerClient

    config = config if config is not None else make_config()
    worker = worker if worker is not None else AgentLoopWorker.__new__(AgentLoopWorker)
    worker.config = config
    worker.llm_client = (client_cls or LLMServerClient)(config, FakeLoadBalancer(server))
    worker.teacher_client = None
    worker.reward_loop_worker_handles = [reward]
    worker.rollout_config = config.actor_rollout_ref.rollout
    worker.dataset_cls = RLHFDataset
    worker.tokenizer = tokenizer
    worker.processor = None
    worker.hf_model_type = "qwen2"
    worker.mm_processor_kwargs = {}
    worker.distillation_enabled = False
    worker.tools = tools
    return worker


def make_batch(n: int, step: int, validate: bool = False) -> Any:
    from verl import DataProto

    prompts = np.empty(n, dtype=object)
    for i in range(n):
        prompts[i] = [{"role": "user", "content": f"What is {i} + 1? Use the tools."}]
    return DataProto.from_dict(
        non_tensors={
            "raw_prompt": prompts,
            "index": np.arange(n) // 2,
            "agent_name": np.array(["tool_agent"] * n),
            "priority": np.arange(n, dtype=np.int64),
            "data_source": np.array(["sim"] * n),
        },
        meta_info={"global_steps": step, "validate": validate},
    )


# -- real Ray actors ----------------------------------------------------------------------------------------
def default_gen_delay(sample: int, turn: int) -> float:
    return (0.04, 0.02, 0.09, 0.03)[sample % 4] if turn == 0 else 0.01 + 0.005 * (sample % 3)


def default_tool_delay(name: str, x: int) -> float:
    return 0.03 if name == "add" else 0.05


def setup_actor(worker: Any, *, v1: bool, n: int = 1, fully_async: bool = False, engine: bool = False) -> Any:
    """Give a real agent-loop worker actor (``self``) the harness's fake server, tools and reward worker in
    place of its model machinery. Run inside the actor (``actor.__ray_call__.remote(setup_actor, ...)``).
    ``engine``: the server answers the engine carrier with engine numbers (:func:`engine_numbers`)."""
    tok = build_tokenizer()
    server = FakeServer(tok, default_gen_delay, lambda i, k: (i % 3) if k == 0 else None)
    if engine:
        carrier_signature(server)
    make_worker(
        tok,
        server,
        make_tools(default_tool_delay),
        FakeRewardWorker(lambda i: 0.01 + 0.004 * i),
        worker=worker,
        config=make_config(full_determinism=not (v1 or fully_async), n=n),
        client_cls=_fully_async_client() if fully_async else None,
    )
    worker.harness_server = server
    if v1:
        import transfer_queue as tq

        tq.init()
        worker.background_tasks = set()
    return True


def _fully_async_client() -> Any:
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

    return FullyAsyncLLMServerClient


def light_init(self: Any, *args: Any, **kwargs: Any) -> None:
    """Stands in for the agent-loop worker's ``__init__`` (models, datasets): :func:`setup_actor` fills it."""


def make_v1_batch(n: int, step: int, validate: bool = False, first: int = 0) -> Any:
    """A V1 dispatch batch as ``PPOTrainer`` builds it: uids, raw prompts, dataset index (all 0: not unique),
    ``global_steps`` (and ``validate``) as NonTensorData."""
    import uuid

    from verl.utils import tensordict_utils as tu

    prompts = np.empty(n, dtype=object)
    for i in range(n):
        prompts[i] = [{"role": "user", "content": f"What is {first + i} + 1? Use the tools."}]
    batch = tu.get_tensordict(
        {
            "raw_prompt": prompts,
            "uid": np.array([str(uuid.uuid4()) for _ in range(n)], dtype=object),
            "index": np.zeros(n, dtype=object),
            "agent_name": np.array(["tool_agent"] * n, dtype=object),
            "data_source": np.array(["sim"] * n, dtype=object),
        }
    )
    tu.assign_non_tensor_data(batch, "global_steps", step)
    if validate:
        tu.assign_non_tensor_data(batch, "validate", True)
    return batch


def set_weight_version(worker: Any, version: int) -> None:
    """Run inside the actor: the weights it serves are now those of trainer step ``version``."""
    worker.harness_server.version = int(version)
