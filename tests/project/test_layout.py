"""The package's shape: a small top-level API, public sub-namespaces, the import contract, one process state."""

from __future__ import annotations

import ast
import fnmatch
import importlib
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import otel_agentloop as oal
from otel_agentloop import testing
from otel_agentloop.config import _values as config_values
from otel_agentloop.core import _guard as guard
from otel_agentloop.core._state import state
from otel_agentloop.core._tracer import current_tracer
from tests._support import REPO_ROOT

ROOT = REPO_ROOT
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


@pytest.mark.e2e  # a subprocess
def test_the_library_never_imports_the_demo_or_the_cli() -> None:
    code = (
        "import sys, otel_agentloop, " + ", ".join(f"otel_agentloop.{n}" for n in NAMESPACES) + ", "
        "otel_agentloop.integrations.ray, otel_agentloop.integrations.verl\n"
        "print(sorted(m for m in sys.modules if m.startswith(('otel_agentloop.demo', 'otel_agentloop.cli'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.e2e  # a subprocess
def test_the_import_contract_holds() -> None:
    """Layers point one way and no sibling modules or packages import each other in a cycle (import-linter,
    configured in pyproject.toml; `make lint` runs the same check)."""
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint_imports, "import-linter is in the test extra"
    out = subprocess.run([lint_imports, "--no-cache"], capture_output=True, text=True, cwd=ROOT)  # no cache dir in ROOT
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 kept, 0 broken" in out.stdout


def test_the_pages_assets_are_package_data() -> None:
    """The pages' CSS and JavaScript are files a wheel must carry: each file in ``analysis/_rendering/assets`` is
    matched by a package-data glob in pyproject.toml, and the renderers read exactly those files."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    folder = ROOT / "otel_agentloop" / "analysis" / "_rendering"
    files = sorted(p.relative_to(folder).as_posix() for p in (folder / "assets").iterdir())
    globs = package_data["otel_agentloop.analysis._rendering"]
    assert files and all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files)
    used = {m for p in folder.glob("*.py") for m in re.findall(r'asset\("([^"]+)"\)', p.read_text())}
    assert sorted(used) == [f.removeprefix("assets/") for f in files]


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


def test_one_warn_once_registry_that_isolated_and_reset_forget(caplog: pytest.LogCaptureFixture) -> None:
    """A config warning and an internal error share one registry (``core._guard`` re-exports ``config``'s):
    each is logged once, and ``testing.isolated``/``testing.reset`` make both warn again."""
    assert guard.warn_once is config_values.warn_once

    def warn_both() -> int:
        caplog.clear()
        config_values.warn_once("layout:config", "layout config warning")
        try:
            raise RuntimeError("layout")
        except RuntimeError:
            guard.internal_error("layout")
        return len([r for r in caplog.records if "layout" in r.getMessage()])

    with caplog.at_level(logging.WARNING, logger="otel_agentloop"):
        assert warn_both() == 2
        assert warn_both() == 0
        with testing.isolated():
            assert warn_both() == 2
        assert warn_both() == 0
        testing.reset()
        assert warn_both() == 2


# -- code limits and where the environment is read ------------------------------------------------------
PACKAGE = ROOT / "otel_agentloop"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


def over_the_limits(folder: Path) -> list[str]:
    """Modules over :data:`MAX_MODULE_LINES` lines and functions (methods, nested functions) over
    :data:`MAX_FUNCTION_LINES` lines (decorators to the last line, docstring included) under ``folder``."""
    found: list[str] = []
    for path in sorted(folder.rglob("*.py")):
        text = path.read_text()
        name = path.relative_to(folder.parent)
        if len(text.splitlines()) > MAX_MODULE_LINES:
            found.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                length = (node.end_lineno or node.lineno) - first + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{name}:{node.lineno} {node.name}(): {length} lines")
    return found


ROOMS = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("__"))


@pytest.mark.parametrize("room", ROOMS)
def test_every_room_keeps_the_code_limits(room: str) -> None:
    assert over_the_limits(PACKAGE / room) == []


def test_the_top_level_modules_keep_the_code_limits() -> None:
    found = [f for f in over_the_limits(PACKAGE) if "/" not in f.split(":")[0].removeprefix("otel_agentloop/")]
    assert found == []


def misplaced_class_docstrings(folder: Path) -> list[str]:
    """Classes under ``folder`` with a string statement in their body but none first: the class docstring was
    written after an attribute (it then documents the attribute and the class's ``__doc__`` is ``None``)."""
    found: list[str] = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                strings = [
                    i
                    for i, stmt in enumerate(node.body)
                    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                    if isinstance(stmt.value.value, str)
                ]
                if strings and strings[0] != 0:
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    return found


@pytest.mark.parametrize("room", ROOMS)
def test_every_class_docstring_comes_first(room: str) -> None:
    assert misplaced_class_docstrings(PACKAGE / room) == []
    from otel_agentloop.metrics import PhaseMetricsProcessor

    assert (PhaseMetricsProcessor.__doc__ or "").startswith("Accumulates, per step")


def test_the_limits_check_sees_long_modules_and_functions(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"@decorator\ndef short():\n    pass\n\n\nasync def long():\n{body}\n")
    (tmp_path / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    found = over_the_limits(tmp_path)
    assert len(found) == 2, found
    assert f"long(): {MAX_FUNCTION_LINES + 1} lines" in found[1] and f"{MAX_MODULE_LINES + 1} lines" in found[0]


ENVIRONMENT_READERS = {
    "integrations/ray/_handover.py": "hands the driver's OTEL_* variables to Ray workers and applies them there",
    "testing.py": "isolates a test's OTEL_* variables (saves, clears, restores)",
    "analysis/_rendering/_terminal.py": "NO_COLOR / FORCE_COLOR of the terminal, not settings",
    "integrations/vllm/_wrappers.py": "gives a vLLM engine's processes OTEL_SERVICE_NAME (vLLM reads only that)",
    "integrations/verl/_engine_path.py": "the same, for the engine verl's server actor spawns",
}
"""Modules outside ``config/`` that touch ``os.environ`` on purpose, with the reason."""


def environment_reads(path: Path) -> list[str]:
    """Where ``path`` touches the process environment itself: ``os.environ``, ``os.getenv``, ``os.putenv`` or
    ``config._values.env_str``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        name = None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os":
            name = f"os.{node.attr}" if node.attr in ("environ", "environb", "getenv", "putenv") else None
        elif isinstance(node, ast.Name) and node.id in ("env_str", "environ", "getenv"):
            name = node.id
        elif isinstance(node, ast.ImportFrom) and any(a.name in ("env_str", "environ", "getenv") for a in node.names):
            name = f"import from {node.module}"
        if name is not None:
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {name}")
    return found


def test_the_environment_is_read_only_through_the_declaration() -> None:
    """Outside ``config/`` (which declares every variable: ``Settings`` and ``SDK_VARIABLES``), the library
    reads variables through ``config._environment.variable`` or resolved settings (``Settings``, ``config._otlp``)."""
    found = [
        read
        for path in sorted(PACKAGE.rglob("*.py"))
        if "config" not in path.relative_to(PACKAGE).parts
        and path.relative_to(PACKAGE).as_posix() not in ENVIRONMENT_READERS
        for read in environment_reads(path)
    ]
    assert found == []
    assert all((PACKAGE / name).exists() for name in ENVIRONMENT_READERS)


def _otlp_reads(path: Path) -> list[str]:
    """Calls in ``path`` that read an ``OTEL_EXPORTER_OTLP_*`` variable: ``variable``/``env_str``/``getenv``/``get``
    of a name written there, or ``otlp_variable``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        texts = [
            part.value
            for arg in node.args[:1]
            for part in ([arg] if isinstance(arg, ast.Constant) else getattr(arg, "values", []))
            if isinstance(part, ast.Constant) and isinstance(part.value, str)
        ]
        named = name in ("variable", "env_str", "getenv", "get") and any("OTEL_EXPORTER_OTLP" in t for t in texts)
        if named or name == "otlp_variable":
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {name}")
    return found


def test_only_config_otlp_reads_the_otlp_exporter_variables() -> None:
    """Every exporter reads its resolved ``OtlpTarget``: the ``OTEL_EXPORTER_OTLP_*`` variables are read in
    ``config/_otlp.py`` alone (``Settings`` declares some, ``_environment`` checks them all)."""
    found = [
        read
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).as_posix() != "config/_otlp.py"
        for read in _otlp_reads(path)
    ]
    assert found == []


def test_the_package_registers_with_the_os_at_fork_once() -> None:
    """One ``os.register_at_fork`` call in the package, in ``config/_fork`` (the fork helper): every other module
    registers with that helper, which keeps their order (``tests/config/test_fork_helper.py``)."""
    calls = []
    for path in sorted((ROOT / "otel_agentloop").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            func = node.func if isinstance(node, ast.Call) else None
            if isinstance(func, ast.Attribute) and func.attr == "register_at_fork":
                calls.append(path.relative_to(ROOT).as_posix())
    assert calls == ["otel_agentloop/config/_fork.py"]
