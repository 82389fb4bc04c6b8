"""A forked child's spans carry the child's identity (issue 26): resource ``process.pid`` and ``rl.worker``.

Real ``os.fork()``: parent and child each trace a sample into the same OTLP-JSON file (tmp_path); the child
exits with ``os._exit``. Both span paths.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

from otel_agentloop import semconv as sc
from otel_agentloop.analysis import read_jsonl
from tests._support.fork import fork_and_trace

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def _samples(path: str) -> dict[int, Any]:
    return {r.attributes[sc.RL_SAMPLE_INDEX]: r for r in read_jsonl(path) if r.name == "rl.sample"}


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "sdk-path"])
def test_a_forked_childs_spans_carry_its_pid_and_worker(tmp_path, fast_path: bool) -> None:
    path = str(tmp_path / "fork.jsonl")
    parent = os.getpid()
    # as a Ray worker's resource says it (integrations.ray): node, pid, actor
    ray_worker = f"node-1:{parent}:actor01"
    child = fork_and_trace(path, fast_path=fast_path, resource_attributes={sc.RL_WORKER: ray_worker})
    samples = _samples(path)
    assert sorted(samples) == [0, 1, 2]
    forked = samples[1]
    host = socket.gethostname()
    for mine in (samples[0], samples[2]):  # before and after the fork: the parent's identity is untouched
        assert mine.resource["process.pid"] == parent and mine.resource[sc.RL_WORKER] == ray_worker
        assert mine.attributes[sc.RL_WORKER] == f"{host}:{parent}"
    assert forked.resource["process.pid"] == child
    assert forked.resource[sc.RL_WORKER] == f"node-1:{child}:actor01"
    assert forked.attributes[sc.RL_WORKER] == f"{host}:{child}"
    assert forked.resource["service.name"] == mine.resource["service.name"] == "fork-identity"


def test_a_worker_name_the_user_chose_gets_the_childs_pid(tmp_path) -> None:
    path = str(tmp_path / "fork.jsonl")
    child = fork_and_trace(path, reconfigure=True, worker="rollout-a")
    samples = _samples(path)
    assert samples[0].attributes[sc.RL_WORKER] == samples[2].attributes[sc.RL_WORKER] == "rollout-a"
    assert samples[1].attributes[sc.RL_WORKER] == f"rollout-a:{child}"
    assert samples[3].attributes[sc.RL_WORKER] == f"{socket.gethostname()}:{child}"
    assert samples[3].resource["process.pid"] == child
