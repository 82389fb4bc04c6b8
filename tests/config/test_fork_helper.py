"""The one fork helper (``config._fork``): its order contract, and a real child forked while every lock it
renews is held by another thread and our threads run.

Each case runs in a fresh interpreter (hooks registered for the process's life stay out of the test process);
a child that hangs dumps its threads and exits after 10 s, and the run is bounded.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import weakref

import pytest

from otel_agentloop import semconv as sc
from otel_agentloop import testing
from otel_agentloop.analysis import read_jsonl
from otel_agentloop.config import _fork
from otel_agentloop.core._inflight import InflightRegistry

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120)


_ORDER_SCRIPT = textwrap.dedent("""
    import gc, os, sys, threading
    from otel_agentloop.config import _fork

    seen = []
    held = threading.Lock()

    class Owner:
        def __init__(self, name):
            self.name = name

        def renew(self):
            seen.append(self.name)

    def boom():
        raise RuntimeError("boom in a hook")

    _fork.renew_in_child(lambda: seen.append("module"))
    _fork.renew_in_child(boom)
    owner = Owner("owner")
    _fork.after_fork_in_child(owner, "renew")
    gone = Owner("gone")
    _fork.after_fork_in_child(gone, "renew")
    del gone
    gc.collect()
    _fork.renew_in_child(lambda: seen.append("held lock free" if held.acquire(blocking=False) else "held lock HELD"))
    _fork.hold_across_fork(held)
    pid = os.fork()
    if pid == 0:
        print("child:", seen, flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("parent:", seen, held.locked(), os.waitstatus_to_exitcode(status), flush=True)
""")


def test_hooks_run_in_registration_order_and_a_failing_one_stops_none() -> None:
    """In the child: every live hook once, in registration order (module and object hooks alike), a held lock
    already released; a hook that raises is logged and the next still runs; an object that is gone is skipped.
    In the parent: no hook, the held lock released."""
    out = _run(_ORDER_SCRIPT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines() == [
        "child: ['module', 'owner', 'held lock free']",
        "parent: [] False 0",
    ]
    assert "internal error in after_fork" in out.stderr and "RuntimeError: boom in a hook" in out.stderr


_HELD_SCRIPT = textwrap.dedent("""
    import faulthandler, importlib, logging, os, pkgutil, sys, threading, time, weakref
    import otel_agentloop as oal
    from otel_agentloop.config import _fork, _values
    from otel_agentloop.setup._run_id import process_run_id

    LOCKS = (type(threading.Lock()), type(threading.RLock()), threading.Condition)
    handle = oal.configure("fork-held", file=sys.argv[1], set_global=False, schedule_delay_s=0.05)
    from otel_agentloop.integrations.verl._rows import OpenSampleRows
    open_rows = OpenSampleRows()  # verl's open samples' totals: a processor of an integration

    def owners():
        \"\"\"Every registered hook's owner: an object, or a function's module.\"\"\"
        for entry in _fork._hooks:
            hook = entry() if isinstance(entry, weakref.WeakMethod) else entry
            if hook is not None:
                owner = getattr(hook, "__self__", None)  # an object (maybe empty, so falsy) or a module
                yield sys.modules[hook.__module__] if owner is None else owner

    def lock_names(owner):
        names = set(getattr(owner, "__dict__", {}))
        for cls in type(owner).__mro__:
            names.update(getattr(cls, "__slots__", ()))
        return sorted(n for n in names if isinstance(getattr(owner, n, None), LOCKS))

    for info in pkgutil.walk_packages(oal.__path__, "otel_agentloop."):  # every module that imports here
        if not info.name.startswith(("otel_agentloop.cli", "otel_agentloop.demo", "otel_agentloop.__main__")):
            try:
                importlib.import_module(info.name)
            except ImportError:  # an optional framework that is not installed
                pass
    modules = [m for name, m in sorted(sys.modules.items()) if name.startswith("otel_agentloop")]
    owners_ = {id(o): o for o in (*owners(), *modules)}.values()  # every module's locks, registered or not
    renewed = [(owner, name) for owner in owners_ for name in lock_names(owner)]
    renewed = [(o, n) for o, n in renewed if getattr(o, n) not in _fork._held]
    kinds = sorted({getattr(o, "__name__", type(o).__name__) for o, _ in renewed})
    stop, forked, ready = threading.Event(), threading.Event(), threading.Event()

    @oal.trace_generate(model="m")
    def gen():
        return None

    def busy():  # our threads at work: spans, the metrics processor, the export worker
        i = 0
        with oal.step(1):
            while not stop.is_set():
                with oal.sample(i):
                    gen()
                i += 1

    def holder():  # every lock of ours (modules' and registered objects'), and those held across the fork
        locks = [getattr(owner, name) for owner, name in renewed]
        while True:  # all at once or none: a thread at work may hold one while it waits for another
            taken = []
            for lock in locks:
                if not lock.acquire(timeout=0.01):
                    break
                taken.append(lock)
            if len(taken) == len(locks):
                break
            for lock in reversed(taken):
                lock.release()
            time.sleep(0.001)
        for lock in _fork._held:
            lock.acquire()
        ready.set()
        time.sleep(0.3)  # the fork waits for these
        for lock in _fork._held:
            lock.release()
        forked.wait()
        for lock in reversed(taken):
            lock.release()

    threads = [threading.Thread(target=busy, daemon=True), threading.Thread(target=holder, daemon=True)]
    for thread in threads:
        thread.start()
    ready.wait()
    pid = os.fork()
    if pid == 0:
        faulthandler.dump_traceback_later(10, exit=True)
        locks = [(f"{getattr(o, '__name__', type(o).__name__)}.{n}", getattr(o, n)) for o, n in renewed]
        locks += [("held", lock) for lock in _fork._held]
        stuck = [name for name, lock in locks if not lock.acquire(timeout=0.5)]
        for name, lock in locks:
            if name not in stuck:
                lock.release()
        _values.warn_once("fork-held:child", "child %d logs", os.getpid())
        run = process_run_id()
        with oal.step(7), oal.sample(0):
            gen()
        ok = handle.metrics.collect(7)["agent_loop/num_samples"] == 1
        live = handle.live._thread.is_alive()
        flushed = handle.force_flush(5)
        print("child:", stuck, ok, live, flushed, bool(run), flush=True)
        os._exit(0)
    forked.set()
    _, status = os.waitpid(pid, 0)
    stop.set()
    print("kinds:", kinds, flush=True)
    print("parent:", os.waitstatus_to_exitcode(status), flush=True)
    handle.shutdown(5)
""")


_OWNERS = (
    "otel_agentloop.config._environment",
    "otel_agentloop.config._values",
    "otel_agentloop.integrations.verl._patching",
    "otel_agentloop.setup._run_id",
    "otel_agentloop.integrations.ray._worker",
    "otel_agentloop.integrations.ray._instrumentor",
    "ProcessState",
    "TracerState",
    "InflightRegistry",
    "LiveMonitor",
    "PhaseMetricsProcessor",
    "RecordPipeline",
    "ExportProcessor",
    "StepSummaryWriter",
    "OpenSampleRows",
)
"""Some of whose locks were held at the fork (the module's or the object's class name): each module's own, and
every registered object's."""


def test_a_child_forked_while_every_lock_is_held_logs_traces_and_exports(tmp_path) -> None:
    """A thread holds every lock of the package (each importable module's own, cli and demo aside, and those of
    every object registered with the fork helper) and the lock the helper holds across the fork, while another
    traces: the child finds each lock free, logs, reads the run id, traces a sample, collects its metrics, has
    its watchdog thread, and exports its own spans. A module lock that is not renewed is found stuck here."""
    path = str(tmp_path / "fork.jsonl")
    out = _run(_HELD_SCRIPT, path)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert "child: [] True True True True" in lines, out.stdout + out.stderr[-3000:]
    assert "parent: 0" in lines
    kinds = next(line for line in lines if line.startswith("kinds:"))
    for owner in _OWNERS:  # each was held: a lock that is not registered would be missing here
        assert f"'{owner}'" in kinds, kinds
    assert re.search(r"child \d+ logs", out.stderr), out.stderr[-3000:]
    child_samples = [r for r in read_jsonl(path) if r.name == "rl.sample" and r.attributes.get(sc.RL_STEP) == 7]
    assert len(child_samples) == 1


def test_an_objects_hook_is_forgotten_with_it() -> None:
    """Registering per object never grows without bound (the registry keeps dead owners' hooks at most until
    the next prune): 1000 registries made and dropped leave at most ``max(256, 2 * live)`` hooks and one more,
    whatever other tests left alive before."""
    with testing.isolated():
        for _ in range(1000):
            InflightRegistry()
        live = sum(1 for hook in _fork._hooks if not isinstance(hook, weakref.WeakMethod) or hook() is not None)
        assert len(_fork._hooks) <= max(_fork._MAX_DEAD, 2 * (live + 1)) + 1
