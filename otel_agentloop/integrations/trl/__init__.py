"""Drop-in instrumentation of TRL 1.16's ``GRPOTrainer``: ``instrument()`` / ``uninstrument()``, or
:class:`TrlInstrumentor` (``opentelemetry_instrumentor`` entry point ``trl``, so ``opentelemetry-instrument``
loads it with no code change).

While instrumented, each GRPOTrainer optimizer step is a ``rl.step`` (numbered as TRL logs it), each completion
a ``rl.sample`` (prompt index, generation number in its group); each batched generation call a
``rl.generate.batch`` span its samples' generation spans link to; each tool call of TRL's tool loop an
``execute_tool <name>`` span under its sample; each reward function a ``rl.reward <name>`` phase with the
sample's value; ``rl.train.gen``, ``rl.train.loss`` and ``rl.train.optimizer_step`` around the trainer's
phases. Each step is collected at its end; its ``agent_loop/*`` metrics join TRL's next logged dict (what
reaches wandb/trackio and every callback's ``on_log``). With colocated vLLM each request gets its sample's
turn as parent (``_vllm``); with a vLLM server (``vllm_mode="server"``), each engine request of the server
gets its sample's turn when the server runs under our ``trl`` entry point too (``_vllm_server``). See
docs/frameworks.md.

``instrument()`` never imports TRL: ``trl.trainer.grpo_trainer`` is patched when it is imported.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from collections.abc import Callable
from types import ModuleType

from ...core._guard import internal_error, logger
from .._instrumentor import Instrumentor
from .._patching import AsyncOriginal, Integration, Original, Patches
from ._state import switch
from ._steps import last_metrics
from ._trainer import (
    callback_class,
    wrap_calculate_rewards,
    wrap_compute_loss,
    wrap_generate,
    wrap_generate_and_score,
    wrap_generate_single_turn,
    wrap_init,
    wrap_log,
    wrap_profiling_context,
    wrap_train,
)
from ._vllm import wrap_llm
from ._vllm_server import wrap_add_request, wrap_create_completion

__all__ = ["SUPPORTED", "TrlInstrumentor", "instrument", "is_instrumented", "last_metrics", "uninstrument"]

MODULE = "trl.trainer.grpo_trainer"
VLLM_GENERATION = "trl.generation.vllm_generation"
# the vLLM server's pieces (``trl vllm-serve`` runs vLLM's OpenAI server): patched in that process when imported
Wrap = Callable[[Original], Original]
AsyncWrap = Callable[[AsyncOriginal], AsyncOriginal]
SERVER_PATCHES: tuple[tuple[str, str, str, Wrap | AsyncWrap], ...] = (
    (
        "vllm.entrypoints.openai.completion.serving",
        "OpenAIServingCompletion",
        "create_completion",
        wrap_create_completion,
    ),
    ("vllm.v1.engine.output_processor", "OutputProcessor", "add_request", wrap_add_request),
)
SUPPORTED = ("1.16.",)
_INSTRUMENTS = ("trl >= 1.16, < 1.17",)
_METHODS: tuple[tuple[str, Wrap], ...] = (
    ("_generate_and_score_completions", wrap_generate_and_score),
    ("_generate", wrap_generate),
    ("_generate_single_turn", wrap_generate_single_turn),
    ("_calculate_rewards", wrap_calculate_rewards),
    ("compute_loss", wrap_compute_loss),
    ("log", wrap_log),
    ("train", wrap_train),
)
_trl = Integration(switch)
_server_patches = Patches()  # the vLLM server's, kept apart: TRL's may be absent there
_callback: list[type] = []


def is_instrumented() -> bool:
    return switch.active


def instrument() -> bool:
    """Patch TRL's GRPOTrainer (idempotent; now, or when ``trl.trainer.grpo_trainer`` is imported). Returns
    whether TRL is (or will be, once imported) instrumented: ``False`` for an installed TRL outside
    :data:`SUPPORTED`, with a warning."""
    with _trl.lock:
        if switch.active:
            return True
        try:
            version = importlib.metadata.version("trl")
        except importlib.metadata.PackageNotFoundError:
            version = None
        if version is not None and not version.startswith(SUPPORTED):
            logger.warning("otel_agentloop: trl %s is not supported (supported: 1.16.x); not instrumenting", version)
            return False
        _trl.start([(MODULE, _apply), *((name, _apply_server) for name, *_ in SERVER_PATCHES)])
        return True


def uninstrument() -> None:
    """Put back the very same objects (idempotent); trainers built meanwhile keep our callback, inert."""
    with _trl.lock:
        _trl.stop()
        _server_patches.restore()


def _apply(module: ModuleType) -> None:
    patches = _trl.patches
    with _trl.lock:
        if not switch.active or patches:
            return
        try:
            cls = module.GRPOTrainer
            if not _callback:
                transformers = importlib.import_module("transformers")  # imported by TRL already
                _callback.append(callback_class(transformers.TrainerCallback))
            for attr, wrap in _METHODS:
                patches.set(cls, attr, wrap(getattr(cls, attr)))
            patches.set(cls, "__init__", wrap_init(cls.__dict__["__init__"], lambda: _callback[0]))
            patches.set(module, "profiling_context", wrap_profiling_context(module.profiling_context))
            generation = sys.modules.get(VLLM_GENERATION)  # imported by grpo_trainer; LLM only with vLLM
            if generation is not None and "LLM" in vars(generation):
                patches.set(generation, "LLM", wrap_llm(generation.LLM))
        except Exception:
            internal_error("trl.patch")
            patches.restore()  # a failed patch leaves TRL as it was


def _apply_server(module: ModuleType) -> None:
    with _trl.lock:
        for name, cls_name, attr, wrap in SERVER_PATCHES:
            if name != module.__name__ or not switch.active:
                continue
            try:
                cls = getattr(module, cls_name)
                if not _server_patches.holds(cls, attr):
                    _server_patches.set(cls, attr, wrap(vars(cls)[attr]))
            except Exception:
                internal_error("trl.patch.server")


class TrlInstrumentor(Instrumentor):
    """OpenTelemetry instrumentor for TRL (entry point ``trl``): :func:`instrument` / :func:`uninstrument`."""

    package, dependencies = "trl", _INSTRUMENTS
    on, off = staticmethod(instrument), staticmethod(uninstrument)
