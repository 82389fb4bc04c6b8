"""The package's shape: a small top-level API, public sub-namespaces, the import contract, one process state."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import otel_agentloop as oal
from otel_agentloop import testing
from otel_agentloop.core._state import state
from otel_agentloop.core._tracer import current_tracer

ROOT = Path(__file__).resolve().parents[1]
NAMESPACES = ("metrics", "export", "analysis", "health", "testing")


def test_the_top_level_api_is_small_and_every_name_resolves() -> None:
    assert len(oal.__all__) <= 20
    for name in oal.__all__:
        assert getattr(oal, name) is not None


@pytest.mark.parametrize("name", NAMESPACES)
def test_each_public_namespace_exports_what_it_lists(name: str) -> None:
    module = importlib.import_module(f"otel_agentloop.{name}")
    assert module.__all__
    for attr in module.__all__:
        assert getattr(module, attr) is not None, f"otel_agentloop.{name}.{attr}"


def test_the_library_never_imports_the_demo_or_the_cli() -> None:
    code = (
        "import sys, otel_agentloop, " + ", ".join(f"otel_agentloop.{n}" for n in NAMESPACES) + ", "
        "otel_agentloop.integrations.ray, otel_agentloop.integrations.verl\n"
        "print(sorted(m for m in sys.modules if m.startswith(('otel_agentloop.demo', 'otel_agentloop.cli'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_the_import_contract_holds() -> None:
    """Layers point one way and no sibling modules or packages import each other in a cycle (import-linter,
    configured in pyproject.toml; `make lint` runs the same check)."""
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint_imports, "import-linter is in the test extra"
    out = subprocess.run([lint_imports], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 kept, 0 broken" in out.stdout


def test_reset_returns_the_process_to_its_import_time_state() -> None:
    handle = oal.configure("layout", exporters=[], set_global=False, capture_content=True, trace_per="step")
    assert oal.current_handle() is handle and current_tracer() is not None
    assert state.content.enabled and state.defaults.trace_per == "step"
    testing.reset()
    assert handle.closed
    assert oal.current_handle() is None and current_tracer() is None
    assert not state.content.enabled and state.defaults.trace_per == "sample"


def test_capture_configures_an_in_memory_handle_and_shuts_it_down() -> None:
    with testing.capture() as captured:

        @oal.trace_tool("search")
        def search() -> int:
            return 1

        with oal.sample(3):
            search()
        names = {s.name for s in captured.spans()}
    assert {"rl.sample", "execute_tool search"} <= names
    assert captured.handle.closed
