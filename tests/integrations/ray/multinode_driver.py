"""A user's Ray driver, run as ``__main__`` (its task is pickled by value): joins the cluster at ``argv[1]`` by
address and runs samples with phase spans in tasks on both nodes (each pinned to its
node by the node's custom resource). ``argv[2]`` says how the driver asks for tracing:

- ``plain``: nothing (``opentelemetry-instrument`` in front of the command is the switch);
- ``hook``: only ``worker_process_setup_hook`` in ``ray.init``'s runtime_env (no settings handed over);
- ``file``: ``configure(file=argv[3])`` (no endpoint) + ``runtime_env()``, as handed over by a driver on
  another host, and with a variable the driver did not hand over (what a node's own shell may hold);
- ``watchdog``: ``configure()`` + ``runtime_env()``; each task holds 2 samples in a tool past the watchdog's
  threshold, with the worker's root logger at ERROR (as some libraries set it); the driver merges the
  verdicts.

Prints one JSON line: per task, its node id, pid and what its tracing handle exports to.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time

import ray

import otel_agentloop as oal
from otel_agentloop.integrations import ray as oal_ray

HEAD, NODE2 = "head", "node2"


@ray.remote(num_cpus=0)
def rollout(first: int, mode: str) -> dict:
    handle = oal.current_handle()  # configured by the setup hook, before this task ran
    if mode == "watchdog":
        logging.getLogger().setLevel(logging.ERROR)

    def one(index: int) -> None:
        with oal.step(1), oal.sample(index, 0):
            with oal.span("generate_sequences", model="tiny"):
                time.sleep(0.01)
            with oal.span("tool_calls", tool="search"):
                time.sleep(1.5 if mode == "watchdog" else 0.01)

    threads = [threading.Thread(target=one, args=(first + i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out: dict = {
        "node": ray.get_runtime_context().get_node_id(),
        "pid": os.getpid(),
        "exports": handle.description if handle is not None else None,
        "service": handle.settings.service_name if handle is not None else None,
    }
    if handle is not None:
        handle.force_flush(5)
    if mode == "watchdog":
        out["table"] = oal_ray.worker_table(1)
        out["verdict"] = oal_ray.worker_verdict(1)
    return out


def main() -> None:
    address, mode = sys.argv[1], sys.argv[2]
    if mode == "plain":
        ray.init(address=address)
    elif mode == "file":
        env = oal_ray.runtime_env(oal.configure(file=sys.argv[3]))
        driver = json.loads(env["env_vars"][oal_ray.DRIVER_VARIABLE])
        env["env_vars"][oal_ray.DRIVER_VARIABLE] = json.dumps({**driver, "host": "driver-host-elsewhere"})
        env["env_vars"]["OTEL_TRACES_SAMPLER"] = "always_off"  # not handed over by the driver: ignored
        ray.init(address=address, runtime_env=env)
    elif mode == "hook":
        ray.init(
            address=address, runtime_env={"worker_process_setup_hook": "otel_agentloop.integrations.ray.setup_worker"}
        )
    else:
        ray.init(address=address, runtime_env=oal_ray.runtime_env(oal.configure()))
    on_head, on_node2 = rollout.options(resources={HEAD: 0.01}), rollout.options(resources={NODE2: 0.01})
    results = ray.get([on_head.remote(0, mode), on_node2.remote(10, mode)])
    if mode == "watchdog":
        metrics = oal_ray.merge_metrics([r.pop("table") for r in results], [r.pop("verdict") for r in results])
        for r in results:
            r["hung_or_slow"] = metrics.get("agent_loop/watchdog/slow", 0) + metrics.get("agent_loop/watchdog/hung", 0)
    print(json.dumps(results), flush=True)
    time.sleep(1.0)  # let Ray forward the workers' last lines before the driver leaves
    ray.shutdown()


if __name__ == "__main__":
    main()
