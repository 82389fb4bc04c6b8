"""TRL's vLLM server mode (``vllm_mode="server"``): each sample's engine request gets its row's turn.

TRL 1.16's ``trl vllm-serve`` runs vLLM's own OpenAI server (``vllm serve``); the trainer's ``VLLMClient.generate``
posts one ``/v1/completions`` request for the whole batch: the unique prompts (``prompts[::n]``) with
``n = num_generations``. vLLM takes one ``traceparent`` per HTTP request, and fans each prompt with ``n > 1`` out
into ``n`` child engine requests (``ParentRequest``), each traced as its own ``llm_request`` span. So:

- trainer side, :class:`PostFeed`: for one ``_generate_single_turn`` call, the client session's ``post`` (an
  instance attribute set for the call, removed after it) adds to that request two headers, its JSON body
  untouched: ``traceparent`` of the call's ``rl.generate.batch`` span (what a vLLM server with tracing on and
  without our patch nests every ``llm_request`` under), and :data:`ROWS_HEADER`, every row's turn
  ``traceparent`` in TRL's order (prompt-major: prompt ``i``'s ``j``-th completion is row ``i*n + j``). Only when
  the body's prompts are the call's ``prompt_ids[::n]`` and ``len(prompts) * n`` its row count (one process).
- server side (the ``vllm serve`` process under ``opentelemetry-instrument``, where our ``trl`` entry point loads
  too): :func:`wrap_create_completion` holds the parsed rows for the request (a context variable, which the
  engine tasks the endpoint starts inherit), and :func:`wrap_add_request` (``OutputProcessor.add_request``,
  called once per child before the engine gets it) gives the engine request of prompt ``i`` (its id ends in
  ``-i``) and child ``j`` the ``traceparent`` of row ``i*n + j``, only when vLLM already gave it trace headers
  (its tracing is on and the HTTP request carried a ``traceparent``). Nothing else about any request changes.
"""

from __future__ import annotations

import contextvars
import functools
import re
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol, cast

from ...core._guard import internal_error
from ...core._scope import OpenSpan, span_of
from .._engine import trace_headers
from .._patching import put_back
from ._vllm import vllm_part

ROWS_HEADER = "x-otel-agentloop-rows"
MAX_ROWS = 65536  # a header longer than this many traceparents is ignored
_TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_rows: contextvars.ContextVar[tuple[list[str], int] | None] = contextvars.ContextVar("otel_agentloop_trl_rows")


# -- trainer side ------------------------------------------------------------------------------------------------


class Session(Protocol):
    """What we use of a ``requests.Session``."""

    post: Callable[..., object]


class _EngineRequest(Protocol):
    """What we use of vLLM's ``EngineCoreRequest``."""

    trace_headers: Mapping[str, str] | None
    external_req_id: object


class _ParentRequest(Protocol):
    """What we use of vLLM's ``ParentRequest`` (a request with ``n`` > 1)."""

    n: int


def server_session(trainer: object) -> Session | None:
    """The ``requests.Session`` of the trainer's vLLM server client (one process), else ``None``."""
    return vllm_part(
        trainer,
        "server",
        lambda generation: getattr(trainer, "accelerator").num_processes == 1,  # noqa: B009
        lambda generation: cast("Session", getattr(generation, "vllm_client").session),  # noqa: B009
    )


class PostFeed:
    """The rows' turn headers added to the one ``/v1/completions`` request a generation call posts."""

    __slots__ = ("batch", "installed", "live", "previous", "prompts", "rows", "session", "thread")

    def __init__(
        self,
        session: Session,
        prompts: Sequence[Sequence[int]],
        scopes: Sequence[OpenSpan | None],
        batch: OpenSpan | None,
    ) -> None:
        self.session = session
        self.prompts = prompts
        self.rows = [trace_headers(span_of(s)).get("traceparent", "") if s is not None else "" for s in scopes]
        self.batch = trace_headers(span_of(batch)).get("traceparent") if batch is not None else None
        self.live = True
        self.thread = threading.get_ident()
        self.previous = vars(session).get("post")
        self.installed = _posting(self, session.post)
        session.post = self.installed

    def headers(self, url: object, body: object) -> dict[str, str] | None:
        """Our headers for a post of ``body`` to ``url`` (``None``: not the call's completion request; after the
        first completion request, none)."""
        if not self.live or not isinstance(url, str) or not url.endswith("/v1/completions"):
            return None
        self.live = False
        if not isinstance(body, dict) or not any(self.rows):
            return None
        prompts, n = body.get("prompt"), body.get("n", 1)
        if not isinstance(prompts, list) or type(n) is not int or n < 1 or len(prompts) * n != len(self.rows):
            return None
        for i, prompt in enumerate(prompts):
            if not isinstance(prompt, list) or list(prompt) != list(self.prompts[i * n]):
                return None
        headers = {ROWS_HEADER: ",".join(self.rows)}
        if self.batch:
            headers["traceparent"] = self.batch
        return headers

    def close(self) -> None:
        """Put the session's ``post`` back (when it is still ours). Never raises."""
        put_back(self.session, "post", self.installed, self.previous, "trl.vllm_server.feed.close")


def _posting(feed: PostFeed, original: Callable[..., object]) -> Callable[..., object]:
    def post(url: object, *args: object, **kwargs: object) -> object:
        if not args and threading.get_ident() == feed.thread:
            try:
                ours = feed.headers(url, kwargs.get("json"))
                if ours:
                    given = kwargs.get("headers")
                    kwargs["headers"] = {**ours, **given} if isinstance(given, dict) else ours
            except Exception:
                internal_error("trl.vllm_server.feed")
        return original(url, *args, **kwargs)

    return post


def open_post_feed(
    trainer: object, prompts: Sequence[Sequence[int]], scopes: Sequence[OpenSpan | None], batch: OpenSpan | None
) -> PostFeed | None:
    """A :class:`PostFeed` on the trainer's vLLM server client for one call (``None``: not server mode on one
    process, or no turn to hand). Never raises."""
    try:
        session = server_session(trainer)
        if session is None or not any(s is not None for s in scopes) or len(scopes) != len(prompts):
            return None
        return PostFeed(session, prompts, scopes, batch)
    except Exception:
        internal_error("trl.vllm_server.feed.open")
        return None


# -- server side -------------------------------------------------------------------------------------------------


def parse_rows(value: object) -> list[str] | None:
    """The traceparents of :data:`ROWS_HEADER`, ``""`` for a row without a turn (``None``: absent, too long, or
    any entry malformed)."""
    if not isinstance(value, str) or not value:
        return None
    rows = value.split(",")
    if len(rows) > MAX_ROWS or not all(not r or _TRACEPARENT.fullmatch(r) for r in rows):
        return None
    return rows


def wrap_create_completion(original: Callable[..., Awaitable[object]]) -> Callable[..., Awaitable[object]]:
    """``OpenAIServingCompletion.create_completion(request, raw_request)``: the rows of its :data:`ROWS_HEADER`
    held for the call (with the request's ``n``)."""

    async def create_completion(
        self: object, request: object, raw_request: object = None, *args: object, **kwargs: object
    ) -> object:
        token = None
        try:
            headers = getattr(raw_request, "headers", None)
            rows = parse_rows(headers.get(ROWS_HEADER)) if headers is not None else None
            n = getattr(request, "n", 1) or 1
            if rows is not None and type(n) is int and len(rows) % n == 0:
                token = _rows.set((rows, n))
        except Exception:
            internal_error("trl.vllm_server.rows")
        try:
            return await original(self, request, raw_request, *args, **kwargs)
        finally:
            if token is not None:
                _rows.reset(token)

    functools.update_wrapper(create_completion, original, assigned=("__name__", "__qualname__", "__doc__"), updated=())
    return create_completion


def row_headers(request: _EngineRequest, parent: _ParentRequest | None, index: object) -> dict[str, str] | None:
    """The headers of the engine request ``request`` (child ``index`` of ``parent``) from the held rows, else
    ``None`` (the request keeps vLLM's)."""
    held = _rows.get(None)
    if held is None or not request.trace_headers:
        return None
    rows, n = held
    if (parent.n if parent is not None else 1) != n or type(index) is not int or not 0 <= index < n:
        return None
    external = request.external_req_id
    prompt = external.rsplit("-", 1)[-1] if isinstance(external, str) else ""
    if not prompt.isdigit():
        return None
    k = int(prompt) * n + index
    return {"traceparent": rows[k]} if k < len(rows) and rows[k] else None


def wrap_add_request(original: Callable[..., object]) -> Callable[..., object]:
    """``OutputProcessor.add_request(request, prompt, parent_req, request_index, queue)``: the request's row's
    ``traceparent`` as its trace headers (see the module)."""

    def add_request(
        self: object,
        request: _EngineRequest,
        prompt: object,
        parent_req: _ParentRequest | None = None,
        request_index: object = 0,
        *args: object,
        **kwargs: object,
    ) -> object:
        if _rows.get(None) is not None:
            try:
                headers = row_headers(request, parent_req, request_index)
                if headers is not None:
                    request.trace_headers = headers
            except Exception:
                internal_error("trl.vllm_server.request")
        return original(self, request, prompt, parent_req, request_index, *args, **kwargs)

    functools.update_wrapper(add_request, original, assigned=("__name__", "__qualname__", "__doc__"), updated=())
    return add_request
