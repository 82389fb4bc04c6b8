"""The verl stage: real verl 0.9.1 code on CPU (run with the venv scripts/verl_env.sh builds: make test-verl).

tests/conftest.py applies here too: each test runs in its tmp_path (verl's relative outputs, such as
``trainer.default_local_dir`` and the default trace file, land there) and the session fails when a test wrote into
the repository's working tree."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import verl  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    if os.environ.get("CI"):
        raise RuntimeError(f"the verl stage needs verl installed (scripts/verl_env.sh): {exc}") from exc
    pytest.skip(f"verl is not installed here ({exc}); run `make test-verl`", allow_module_level=True)


@pytest.fixture(autouse=True)
def _no_outer_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)


@pytest.fixture(autouse=True)
def _fresh_arrival_order() -> None:
    """Each test's fit restarts at step 1 in this one process: forget the previous fit's positions per
    step (a real run's steps only grow), or a prompt of step 1 would be numbered after the last fit's."""
    from otel_agentloop.integrations.verl import _identity, _v1

    _v1._dispatched.clear()  # the dispatching process's positions per step
    _identity._arrivals.clear()  # a worker's arrival order, where the position did not come
    _identity._released_before.clear()
