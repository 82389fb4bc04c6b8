"""The real Jaeger v2 and OpenTelemetry Collector, built once and started on free ports on 127.0.0.1.

If Go or the module proxy is missing, the tests FAIL with the reason (they never skip silently in CI).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import stack_lib as stack_mod
import stack_procs  # noqa: F401 - for the tests: from .conftest import stack_procs
import stack_store  # noqa: F401 - for the tests: from .conftest import stack_store

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test here is ``e2e`` (left out of ``make test-fast``); the hook sees the whole session's items."""
    for item in items:
        if HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack_mod.Stack]:
    try:
        running = stack_mod.start(log_dir=tmp_path_factory.mktemp("stack-logs"))
    except stack_mod.StackError as exc:
        pytest.fail(f"cannot run the Jaeger/Collector stack: {exc}", pytrace=False)
    try:
        yield running
    finally:
        running.stop()
