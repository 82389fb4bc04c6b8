"""What the test session must leave alone: the repository's working tree outside git's tracked files.

A snapshot maps each file that git does not track (new, or ignored such as those in ``otel-agentloop-traces/``)
to its size and modification time; virtual environments, ``.git`` and tool caches are left out. Tracked files are
left out too: a developer may edit the code while the suite runs, and ``git status`` shows those.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests._support import REPO_ROOT

ROOT = REPO_ROOT
SKIPPED_DIRS = frozenset(
    {
        ".git",
        ".venv",
        "__pycache__",
        ".pytest_cache",
        ".ruff_cache",
        ".mypy_cache",
        ".import_linter_cache",
        ".hypothesis",
        "node_modules",
    }
)

Snapshot = dict[str, tuple[int, int]]
BEFORE = pytest.StashKey[Snapshot]()


def _tracked(root: Path) -> frozenset[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True, timeout=60
        ).stdout.decode("utf-8", "surrogateescape")
    except (OSError, subprocess.SubprocessError):
        return frozenset()  # not a git checkout (an unpacked sdist): every file is watched
    return frozenset(p for p in out.split("\0") if p)


def _skipped(dirpath: str, name: str) -> bool:
    return (
        name in SKIPPED_DIRS
        or name.endswith(".egg-info")
        or os.path.exists(os.path.join(dirpath, name, "pyvenv.cfg"))  # any virtual environment
    )


def snapshot(root: Path = ROOT) -> Snapshot:
    """Each untracked file under ``root`` (relative POSIX path) -> (size, mtime in ns)."""
    tracked = _tracked(root)
    files: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not _skipped(dirpath, d)]
        for name in filenames:
            path = os.path.join(dirpath, name)
            rel = Path(path).relative_to(root).as_posix()
            if rel in tracked:
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue  # gone while we looked
            files[rel] = (st.st_size, st.st_mtime_ns)
    return files


def changed(before: Snapshot, after: Snapshot) -> list[str]:
    """``"new PATH"``, ``"changed PATH"`` or ``"removed PATH"`` for each difference, sorted by path."""
    out = []
    for rel in sorted(before.keys() | after.keys()):
        if rel not in before:
            out.append(f"new {rel}")
        elif rel not in after:
            out.append(f"removed {rel}")
        elif before[rel] != after[rel]:
            out.append(f"changed {rel}")
    return out


def describe(changes: list[str], root: Path = ROOT) -> str:
    shown = "\n".join(f"  {c}" for c in changes[:20])
    if len(changes) > 20:
        shown += f"\n  ... {len(changes) - 20} more"
    return (
        f"FAILED: the tests wrote into the working tree {root} (untracked files; a test must write only inside "
        f"its tmp_path, and a subprocess needs cwd= or --file there):\n{shown}"
    )
