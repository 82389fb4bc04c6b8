"""The TRL stage: real TRL 1.16 GRPOTrainer runs on CPU (the venv scripts/trl_env.sh builds: ``make test-trl``).

Kept out of the main venv's ``make test``: where TRL is not installed nothing here is collected (the coordinator's
``--ignore=tests/trl`` in pyproject's addopts does the same). tests/conftest.py applies too: each test runs in its
tmp_path and the session fails when a test wrote into the repository's working tree."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

collect_ignore_glob = [] if importlib.util.find_spec("trl") is not None else ["test_*.py"]


def pytest_configure(config: pytest.Config) -> None:
    """The TRL venv holds a non-editable copy of the package: these tests must run this checkout's code
    (``make test-trl`` sets PYTHONPATH to it), never a copy built from another clone."""
    import otel_agentloop

    repo = Path(__file__).resolve().parents[2]
    used = Path(otel_agentloop.__file__).resolve().parents[1]
    if not collect_ignore_glob and used != repo:
        raise pytest.UsageError(
            f"otel_agentloop is imported from {used}, not this checkout {repo}: set PYTHONPATH={repo}"
        )


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The tiny models, made once: plain, and with the tool-call tokens and TRL's Qwen3 template."""
    import grpo_run

    root = tmp_path_factory.mktemp("models")
    yield {
        "plain": grpo_run.make_model(root / "plain", tools=False),
        "tools": grpo_run.make_model(root / "tools", tools=True),
    }
