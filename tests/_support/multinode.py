"""A real two-node Ray cluster on this machine, as ``ray start`` on two hosts gives: a head and a worker node
(custom resources ``head`` and ``node2``), both started WITHOUT any ``OTEL_*`` variable, in a private temp
dir (so no bare ``ray.init()`` of another process joins it).

The nodes are owned by a separate process (``python tests/_support/multinode.py``) that starts them with
``ray.cluster_utils.Cluster``, prints the address and node ids as one JSON line, and shuts them down with
``Cluster.shutdown()`` when its stdin closes: drivers under test connect to it by address, the way a user's
driver joins a cluster started elsewhere.

``PYTHONPATH`` on the nodes names this checkout (the package installed on every node, as a real cluster
would have it), nothing else of the test's environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
HEAD, NODE2 = "head", "node2"
"""The custom resources of the head and the worker node: ``.options(resources={NODE2: 0.01})`` pins a task."""


@dataclass(frozen=True)
class TwoNodes:
    address: str
    head_node_id: str
    worker_node_id: str
    temp_dir: str

    def node_env(self, python_path: str) -> dict[str, str]:
        return {"PYTHONPATH": python_path}


def clean_env(extra_path: str = "") -> dict[str, str]:
    """This process's environment without any ``OTEL_*`` (and without Ray's address hints)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RAY_ADDRESS"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_path, ROOT) if p)
    return env


@contextlib.contextmanager
def two_nodes(python: str = sys.executable, extra_path: str = "", timeout_s: float = 180) -> Iterator[TwoNodes]:
    """Start the cluster in its own process (environment without ``OTEL_*``); shut it down on exit."""
    temp_dir = tempfile.mkdtemp(prefix="oalmn", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = clean_env(extra_path)
    env["RAY_TMPDIR"] = temp_dir  # Cluster writes ray_current_cluster under it, never under /tmp/ray
    owner = subprocess.Popen(
        [python, os.path.abspath(__file__), temp_dir],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=temp_dir,
    )
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline()
        if not line:
            raise RuntimeError(f"the cluster did not start: {owner.communicate(timeout=30)[1][-4000:]}")
        info = json.loads(line)
        yield TwoNodes(info["address"], info["head"], info["worker"], temp_dir)
    finally:
        try:
            if owner.stdin is not None:
                owner.stdin.close()
            owner.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            owner.kill()  # our own process; its nodes die with their reaper
            owner.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _serve(temp_dir: str) -> None:
    from ray.cluster_utils import Cluster

    assert not any(k.startswith("OTEL_") for k in os.environ), "the nodes must start without OTEL_*"
    ray_dir = os.path.join(temp_dir, "ray")  # where Cluster also writes ray_current_cluster ($RAY_TMPDIR/ray)
    os.makedirs(ray_dir, exist_ok=True)
    common = {"object_store_memory": 80 * 1024 * 1024, "temp_dir": ray_dir, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {HEAD: 1}, **common})
    try:
        worker = cluster.add_node(num_cpus=2, resources={NODE2: 1}, **common)
        print(
            json.dumps({"address": cluster.address, "head": cluster.head_node.node_id, "worker": worker.node_id}),
            flush=True,
        )
        sys.stdin.read()  # until the test closes our stdin
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    _serve(sys.argv[1])
