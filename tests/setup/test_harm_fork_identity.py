"""A forked child's spans carry the child's identity (issue 26): resource ``process.pid`` and ``rl.worker``.

Real ``os.fork()``: parent and child each trace a sample into the same OTLP-JSON file (tmp_path); the child
exits with ``os._exit``. Both span paths.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

import otel_agentloop as oal
from otel_agentloop import semconv as sc
from otel_agentloop.analysis import read_jsonl

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def _fork_and_trace(path: str, *, reconfigure: bool = False, **options: Any) -> int:
    """Configure, trace sample 0 here, sample 1 in a forked child, then sample 2 here; the child's pid. With
    ``reconfigure`` the child then shuts its handle down and traces sample 3 through a new plain one."""
    handle = oal.configure("fork-identity", file=path, set_global=False, schedule_delay_s=0.05, **options)
    try:
        with oal.sample(0, step=1):
            pass
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                with oal.sample(1, step=1):
                    pass
                code = 0 if handle.force_flush(5) and handle.stats["exported"] >= 1 else 2
                if reconfigure:
                    handle.shutdown(5)  # restores the worker name configure() replaced: the child's own
                    again = oal.configure("fork-identity", file=path, set_global=False)
                    with oal.sample(3, step=1):
                        pass
                    again.shutdown(5)
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        with oal.sample(2, step=1):
            pass
        assert handle.force_flush(5)
    finally:
        handle.shutdown(5)
    return pid


def _samples(path: str) -> dict[int, Any]:
    return {r.attributes[sc.RL_SAMPLE_INDEX]: r for r in read_jsonl(path) if r.name == "rl.sample"}


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "sdk-path"])
def test_a_forked_childs_spans_carry_its_pid_and_worker(tmp_path, fast_path: bool) -> None:
    path = str(tmp_path / "fork.jsonl")
    parent = os.getpid()
    # as a Ray worker's resource says it (integrations.ray): node, pid, actor
    ray_worker = f"node-1:{parent}:actor01"
    child = _fork_and_trace(path, fast_path=fast_path, resource_attributes={sc.RL_WORKER: ray_worker})
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
    child = _fork_and_trace(path, reconfigure=True, worker="rollout-a")
    samples = _samples(path)
    assert samples[0].attributes[sc.RL_WORKER] == samples[2].attributes[sc.RL_WORKER] == "rollout-a"
    assert samples[1].attributes[sc.RL_WORKER] == f"rollout-a:{child}"
    assert samples[3].attributes[sc.RL_WORKER] == f"{socket.gethostname()}:{child}"
    assert samples[3].resource["process.pid"] == child
