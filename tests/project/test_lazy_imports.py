"""``import otel_agentloop`` leaves numpy (``metrics._numpy``), the SDK's metrics and the OTLP exporters of the
protocols not configured out: imported where first used."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e  # the CLI or Python in subprocesses

_PROBE = """
import sys
import otel_agentloop as oal
assert "numpy" not in sys.modules, "import otel_agentloop imported numpy"
assert "opentelemetry.sdk.metrics" not in sys.modules, "import otel_agentloop imported the SDK's metrics"
for name in ("_grpc", "_http_proto", "_otlp_proto"):
    assert "otel_agentloop.export." + name not in sys.modules, "import otel_agentloop imported export." + name
from otel_agentloop import testing
assert "numpy" not in sys.modules, "import otel_agentloop.testing imported numpy"
with testing.capture() as captured:
    with oal.step(1):
        with oal.sample(0):
            pass
    assert "numpy" not in sys.modules, "a step's spans imported numpy"
    metrics = captured.handle.metrics.collect(1)
assert "numpy" in sys.modules and "numpy.ma" in sys.modules
print(len(metrics))
"""


def test_import_leaves_numpy_out_until_collect(tmp_path: object) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, cwd=str(tmp_path), check=False
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip()) > 0


_FORK_PROBE = """
import os, threading, time
from otel_agentloop.metrics import _numpy

held, order = threading.Event(), []

def holder():
    with _numpy._lock:  # as a thread importing numpy holds it
        held.set()
        time.sleep(0.3)
        order.append("import done")

thread = threading.Thread(target=holder)
thread.start()
held.wait()
pid = os.fork()
if pid == 0:
    os._exit(0 if _numpy.load_numpy().arange(3).sum() == 3 else 1)  # the child imports numpy itself
order.append("forked")
_, status = os.waitpid(pid, 0)
thread.join()
print(order, os.waitstatus_to_exitcode(status))
"""


def test_a_fork_waits_for_a_lazy_numpy_import_in_flight(tmp_path: object) -> None:
    """A child forked while another thread imports numpy would inherit that import's lock, held by a thread it
    does not have: ``os.fork`` waits for the import (``metrics._numpy``), and the child can import numpy."""
    done = subprocess.run(
        [sys.executable, "-c", _FORK_PROBE], capture_output=True, text=True, timeout=120, cwd=str(tmp_path), check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['import done', 'forked'] 0"
