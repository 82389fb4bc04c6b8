"""The parts of the vLLM server-mode integration (``integrations.trl._vllm_server``), each on its own: the server's
patches applied when vLLM's modules are imported and put back by ``uninstrument()``; the client feed adding its
headers only to the call's completion request; the server mapping prompt ``i``'s child ``j`` to row ``i*n + j``.
test_vllm_server.py runs them together against a real server."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import otel_agentloop as oal
from otel_agentloop.integrations.trl._vllm_server import (
    ROWS_HEADER,
    PostFeed,
    parse_rows,
    wrap_add_request,
    wrap_create_completion,
)

PROBE = """
import sys
from otel_agentloop.integrations import trl as oal_trl
assert oal_trl.instrument() is True
assert "vllm" not in sys.modules, "instrument() imported vllm"
from vllm.entrypoints.openai.completion import serving
from vllm.v1.engine import output_processor
cls_s, cls_o = serving.OpenAIServingCompletion, output_processor.OutputProcessor
cc, ar = vars(cls_s)["create_completion"], vars(cls_o)["add_request"]
assert cc.__wrapped__ is not None and ar.__wrapped__ is not None
oal_trl.uninstrument()
assert vars(cls_s)["create_completion"] is cc.__wrapped__ and vars(cls_o)["add_request"] is ar.__wrapped__
assert oal_trl.instrument() is True  # imported now: patched at once, once
assert vars(cls_s)["create_completion"].__wrapped__ is cc.__wrapped__
oal_trl.uninstrument()
assert vars(cls_o)["add_request"] is ar.__wrapped__
print("ok")
"""
TP = [f"00-{k + 1:032x}-{k + 1:016x}-01" for k in range(4)]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed here")
def test_server_patches_are_lazy_and_put_back(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(oal.__file__).resolve().parents[1])}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


class _Session:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def post(self, url: str, **kwargs: Any) -> str:
        self.sent.append((url, kwargs))
        return "response"


def _feed(session: _Session, prompts: list[list[int]]) -> PostFeed:
    feed = PostFeed(session, prompts, [None] * len(prompts), None)
    feed.rows = list(TP[: len(prompts)])  # the turns' traceparents (real spans: test_vllm_server.py)
    return feed


def test_feed_heads_only_the_calls_completion_request() -> None:
    session = _Session()
    prompts = [[1, 2], [1, 2], [3], [3]]  # TRL's rows: each prompt num_generations=2 times
    feed = _feed(session, prompts)
    body = {"prompt": [[1, 2], [3]], "n": 2, "max_tokens": 8}
    assert session.post("http://h/v1/models") == "response"
    assert session.post("http://h/v1/completions", json=body, headers={"a": "b"}) == "response"
    session.post("http://h/v1/completions", json=body)  # a second one: not the call's
    feed.close()
    assert "post" not in vars(session)
    (_, first), (_, completion), (_, second) = session.sent
    assert "headers" not in first and "headers" not in second
    assert completion["json"] is body and body == {"prompt": [[1, 2], [3]], "n": 2, "max_tokens": 8}
    assert completion["headers"] == {ROWS_HEADER: ",".join(TP), "a": "b"}


@pytest.mark.parametrize(
    "body",
    [{"prompt": [[1, 2], [4]], "n": 2}, {"prompt": [[1, 2], [3]], "n": 1}, {"prompt": "text", "n": 2}, None],
)
def test_feed_adds_nothing_to_another_batch(body: Any) -> None:
    session = _Session()
    feed = _feed(session, [[1, 2], [1, 2], [3], [3]])
    session.post("http://h/v1/completions", json=body)
    feed.close()
    assert "headers" not in session.sent[0][1]


def test_rows_header_parsing() -> None:
    assert parse_rows(",".join(TP)) == TP
    assert parse_rows(f"{TP[0]},,{TP[1]}") == [TP[0], "", TP[1]]
    assert parse_rows(None) is None and parse_rows("") is None
    assert parse_rows(f"{TP[0]},00-xyz") is None and parse_rows("00-" + "AB" * 16 + "-" + "cd" * 8 + "-01") is None
    assert parse_rows(",".join([TP[0]] * 65537)) is None


class _Request:
    def __init__(self, external: str, headers: dict[str, str] | None) -> None:
        self.external_req_id = external
        self.trace_headers = headers


class _Parent:
    n = 2


def test_server_gives_child_j_of_prompt_i_row_i_n_plus_j() -> None:
    added: list[tuple[str, Any]] = []

    def add_request(self: Any, request: _Request, prompt: Any, parent: Any = None, index: int = 0, queue: Any = None):
        added.append((request.external_req_id, request.trace_headers))

    add = wrap_add_request(add_request)
    vllm_headers = {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}

    async def create(self: Any, request: Any, raw_request: Any = None) -> str:
        for i in (1, 0):  # vLLM adds the prompts' requests from its own tasks, in any order
            for j in (0, 1):
                add(None, _Request(f"cmpl-x-y-{i}", dict(vllm_headers)), None, _Parent(), j)
        add(None, _Request("cmpl-x-y-1", None), None, _Parent(), 0)  # vLLM's tracing off: left alone
        add(None, _Request("cmpl-x-y-7", dict(vllm_headers)), None, _Parent(), 0)  # no such row: left alone
        return "done"

    class Raw:
        headers = {ROWS_HEADER: f"{TP[0]},{TP[1]},,{TP[3]}"}

    class Body:
        n = 2

    assert asyncio.run(wrap_create_completion(create)(None, Body(), Raw())) == "done"
    assert [h for _, h in added] == [
        vllm_headers,  # prompt 1, child 0: row 2 has no turn, the request keeps vLLM's
        {"traceparent": TP[3]},
        {"traceparent": TP[0]},
        {"traceparent": TP[1]},
        None,
        vllm_headers,
    ]
    added.clear()
    add(None, _Request("cmpl-x-y-0", dict(vllm_headers)), None, _Parent(), 0)  # outside a request: vLLM's
    assert added == [("cmpl-x-y-0", vllm_headers)]
