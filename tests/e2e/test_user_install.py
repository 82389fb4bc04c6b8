"""Installing into the user's own verl environment (docs/cluster.md, "Install into your verl environment"):
the documented line names only the package's base dependencies and the ``verl`` extra, and neither may name
verl, torch or Ray, whose versions belong to the user (an upper or lower bound would make pip upgrade,
downgrade or refuse them)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
USERS_OWN = {"verl", "torch", "ray"}
INSTALL_LINE = "pip install 'otel-agentloop[verl]'"


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[(]", r.strip(), maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_the_user_env_install_line_never_names_verl_torch_or_ray() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    installed = _names(project["dependencies"]) | _names(extras["verl"])
    assert not installed & USERS_OWN, installed & USERS_OWN
    assert {"wrapt", "opentelemetry-instrumentation"} <= _names(extras["verl"])  # what the integration needs
    # test and demo tools stay out of the line
    assert not _names(extras["verl"]) & (_names(extras["test"]) - {"wrapt"})
    docs = (ROOT / "docs" / "cluster.md").read_text()
    assert INSTALL_LINE in docs
