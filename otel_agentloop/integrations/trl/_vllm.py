"""TRL's colocated vLLM (``vllm_mode="colocate"``: an in-process ``vllm.LLM``): each request gets its row's turn.

- :func:`wrap_llm`: the ``LLM`` name in ``trl.generation.vllm_generation``. TRL builds the engine with fixed
  arguments, so a user cannot turn vLLM's tracing on; an engine built while instrumented with no
  ``otlp_traces_endpoint`` gets the configured OTLP/gRPC endpoint (as ``integrations.vllm`` gives an
  ``AsyncLLM``) and its request stats (``disable_log_stats=False``: vLLM's tracing reads them); with no
  ``configure()`` yet, tracing is configured from the environment first (TRL builds the engine inside
  ``GRPOTrainer.__init__``, before ``wrap_init`` would). In-process, vLLM records ``llm_request`` with the
  process's global tracer provider (ours, when ``configure()`` set it first).
- :class:`RequestFeed`: for one ``_generate_single_turn`` call, the engine's ``add_request`` (an instance
  attribute set for the call, removed after it) gives the k-th request vLLM adds on this thread the
  ``traceparent`` of the k-th prompt's turn. TRL colocated with ``tensor_parallel_size == 1`` adds one request
  per prompt, in order (``n=1``: its prompts already repeat each prompt ``num_generations`` times); each
  request's prompt ids are checked against the k-th prompt's, and on the first mismatch (or another layout)
  the feed stops handing headers. Nothing else about the request changes.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar, cast

from ...core._guard import internal_error
from ...core._scope import OpenSpan, span_of
from .._engine import trace_headers
from .._patching import put_back
from ._state import switch

T = TypeVar("T")


def wrap_llm(original: Callable[..., object]) -> Callable[..., object]:
    """``vllm.LLM`` as TRL's colocate mode calls it: with our endpoint when it has none (see the module)."""

    def LLM(*args: object, **kwargs: object) -> object:  # noqa: N802 - the name it replaces
        if switch.active and kwargs.get("otlp_traces_endpoint") is None:
            try:
                from ...setup import configure, current_handle
                from ..vllm import _endpoint

                if current_handle() is None:  # opentelemetry-instrument: as wrap_init would, a moment later
                    configure()
                endpoint = _endpoint()
                if endpoint is not None:
                    kwargs["otlp_traces_endpoint"] = endpoint
                    kwargs.setdefault("disable_log_stats", False)
            except Exception:
                internal_error("trl.vllm.endpoint")
        return original(*args, **kwargs)

    functools.update_wrapper(LLM, original, assigned=("__name__", "__qualname__", "__doc__"), updated=())
    return LLM


class Engine(Protocol):
    """What we use of vLLM's ``LLMEngine``."""

    add_request: Callable[..., object]


def vllm_part(trainer: object, mode: str, usable: Callable[[object], bool], part: Callable[[object], T]) -> T | None:
    """``part(generation)`` of the trainer's ``vllm_generation`` when the trainer generates with vLLM in ``mode``
    (``"colocate"``, ``"server"``) and ``usable(generation)``; else ``None``, also when reading it raises."""
    try:
        generation = getattr(trainer, "vllm_generation", None) if getattr(trainer, "use_vllm", False) else None
        if getattr(generation, "mode", None) != mode or not usable(generation):
            return None
        return part(generation)
    except Exception:
        return None


def colocated_engine(trainer: object) -> Engine | None:
    """The trainer's in-process vLLM engine (``LLMEngine``) when it generates with vLLM colocated on one
    process per engine (``tensor_parallel_size == 1``), else ``None``."""
    return vllm_part(
        trainer,
        "colocate",
        lambda generation: getattr(generation, "tensor_parallel_size", 1) == 1,
        lambda generation: cast("Engine", getattr(generation, "llm").llm_engine),  # noqa: B009
    )


class RequestFeed:
    """The turns' ``traceparent`` headers handed, in order, to the requests one generation call adds."""

    __slots__ = ("at", "engine", "headers", "installed", "live", "previous", "prompts", "thread")

    def __init__(self, engine: Engine, prompts: Sequence[Sequence[int]], scopes: Sequence[OpenSpan | None]) -> None:
        self.engine = engine
        self.prompts = prompts
        self.headers = [trace_headers(span_of(s)) if s is not None else {} for s in scopes]
        self.at = 0
        self.live = True
        self.thread = threading.get_ident()
        self.previous = vars(engine).get("add_request")
        self.installed = _feeding(self, engine.add_request)
        engine.add_request = self.installed

    def next(self, prompt: object) -> dict[str, str] | None:
        """The headers for the request now added with ``prompt`` (``None``: none, and none from now on when
        it is not the prompt expected next)."""
        k = self.at
        self.at += 1
        if not self.live or k >= len(self.headers):
            self.live = False
            return None
        ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else getattr(prompt, "prompt_token_ids", None)
        if ids is None or list(ids) != list(self.prompts[k]):
            self.live = False
            return None
        return self.headers[k] or None

    def close(self) -> None:
        """Put the engine's ``add_request`` back (when it is still ours). Never raises."""
        put_back(self.engine, "add_request", self.installed, self.previous, "trl.vllm.feed.close")


def _feeding(feed: RequestFeed, original: Callable[..., object]) -> Callable[..., object]:
    def add_request(request_id: object, prompt: object, params: object, *args: object, **kwargs: object) -> object:
        if len(args) < 4 and kwargs.get("trace_headers") is None and threading.get_ident() == feed.thread:
            try:  # trace_headers is add_request's 7th parameter: given positionally, it is the caller's
                headers = feed.next(prompt)
                if headers:
                    kwargs["trace_headers"] = headers
            except Exception:
                internal_error("trl.vllm.feed")
        return original(request_id, prompt, params, *args, **kwargs)

    return add_request


def open_feed(
    trainer: object, prompts: Sequence[Sequence[int]], scopes: Sequence[OpenSpan | None]
) -> RequestFeed | None:
    """A :class:`RequestFeed` on the trainer's colocated engine for one call (``None``: not colocated, or no
    turn to hand). Never raises."""
    try:
        engine = colocated_engine(trainer)
        if engine is None or not any(s is not None for s in scopes) or len(scopes) != len(prompts):
            return None
        return RequestFeed(engine, prompts, scopes)
    except Exception:
        internal_error("trl.vllm.feed.open")
        return None
