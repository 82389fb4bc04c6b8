"""``import otel_agentloop`` leaves numpy (``metrics._numpy``) and the SDK's metrics out: imported where first used."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import sys
import otel_agentloop as oal
assert "numpy" not in sys.modules, "import otel_agentloop imported numpy"
assert "opentelemetry.sdk.metrics" not in sys.modules, "import otel_agentloop imported the SDK's metrics"
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
