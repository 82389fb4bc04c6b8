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
import importlib.util
import sys
import threading
from collections.abc import Callable, Collection
from typing import Any

from ...config._fork import renew_lock
from ...core._guard import internal_error, logger
from .._instrumentor import Instrumentor
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
SERVER_PATCHES: tuple[tuple[str, str, str, Callable[[Any], Any]], ...] = (
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
_METHODS: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    ("_generate_and_score_completions", wrap_generate_and_score),
    ("_generate", wrap_generate),
    ("_generate_single_turn", wrap_generate_single_turn),
    ("_calculate_rewards", wrap_calculate_rewards),
    ("compute_loss", wrap_compute_loss),
    ("log", wrap_log),
    ("train", wrap_train),
)
_MISSING = object()
_lock = threading.RLock()
renew_lock(globals(), "_lock")  # a forked child: never a lock held at fork
_originals: list[tuple[Any, str, Any]] = []  # (owner, attribute, what its __dict__ held, or _MISSING)
_server_originals: list[tuple[Any, str, Any]] = []  # the vLLM server's, kept apart: TRL's may be absent there
_hooked: list[bool] = []
_callback: list[type] = []


def is_instrumented() -> bool:
    return switch.active


def instrument() -> bool:
    """Patch TRL's GRPOTrainer (idempotent; now, or when ``trl.trainer.grpo_trainer`` is imported). Returns
    whether TRL is (or will be, once imported) instrumented: ``False`` for an installed TRL outside
    :data:`SUPPORTED`, with a warning."""
    with _lock:
        if switch.active:
            return True
        try:
            version = importlib.metadata.version("trl")
        except importlib.metadata.PackageNotFoundError:
            version = None
        if version is not None and not version.startswith(SUPPORTED):
            logger.warning("otel_agentloop: trl %s is not supported (supported: 1.16.x); not instrumenting", version)
            return False
        switch.active = True
        module = sys.modules.get(MODULE)
        if module is not None:
            _apply(module)
        for name, *_ in SERVER_PATCHES:
            if name in sys.modules:
                _apply_server(sys.modules[name])
        if not _hooked:
            import wrapt

            _hooked.append(True)
            wrapt.register_post_import_hook(_apply, MODULE)
            for name, *_ in SERVER_PATCHES:
                wrapt.register_post_import_hook(_apply_server, name)
        return True


def uninstrument() -> None:
    """Put back the very same objects (idempotent); trainers built meanwhile keep our callback, inert."""
    with _lock:
        switch.active = False
        uninstrument_patches()
        while _server_originals:
            owner, attr, original = _server_originals.pop()
            setattr(owner, attr, original)


def _apply(module: Any) -> None:
    with _lock:
        if not switch.active or _originals:
            return
        try:
            cls = module.GRPOTrainer
            if not _callback:
                transformers = importlib.import_module("transformers")  # imported by TRL already
                _callback.append(callback_class(transformers.TrainerCallback))
            for attr, wrap in _METHODS:
                _patch(cls, attr, wrap(getattr(cls, attr)))
            _patch(cls, "__init__", wrap_init(cls.__dict__["__init__"], lambda: _callback[0]))
            _patch(module, "profiling_context", wrap_profiling_context(module.profiling_context))
            generation = sys.modules.get(VLLM_GENERATION)  # imported by grpo_trainer; LLM only with vLLM
            if generation is not None and "LLM" in vars(generation):
                _patch(generation, "LLM", wrap_llm(generation.LLM))
        except Exception:
            internal_error("trl.patch")
            uninstrument_patches()


def _apply_server(module: Any) -> None:
    with _lock:
        for name, cls_name, attr, wrap in SERVER_PATCHES:
            if name != module.__name__ or not switch.active:
                continue
            try:
                cls = getattr(module, cls_name)
                if not any(owner is cls and a == attr for owner, a, _ in _server_originals):
                    _server_originals.append((cls, attr, cls.__dict__[attr]))
                    setattr(cls, attr, wrap(cls.__dict__[attr]))
            except Exception:
                internal_error("trl.patch.server")


def _patch(owner: Any, attr: str, wrapper: Any) -> None:
    _originals.append((owner, attr, vars(owner).get(attr, _MISSING)))
    setattr(owner, attr, wrapper)


def uninstrument_patches() -> None:
    """Put back what was patched, leaving the switch as it is (a failed patch leaves TRL as it was)."""
    while _originals:
        owner, attr, original = _originals.pop()
        if original is _MISSING:
            delattr(owner, attr)
        else:
            setattr(owner, attr, original)


class TrlInstrumentor(Instrumentor):
    """OpenTelemetry instrumentor for TRL (entry point ``trl``): :func:`instrument` / :func:`uninstrument`."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _INSTRUMENTS

    def _instrument(self, **kwargs: Any) -> None:
        if importlib.util.find_spec("trl") is None:  # opentelemetry-instrument loads every entry point
            return
        instrument()

    def _uninstrument(self, **kwargs: Any) -> None:
        uninstrument()
