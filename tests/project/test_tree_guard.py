"""Tests never touch the user's traces (issue 27): each test runs in its tmp_path, where the default trace file
then lands, and the session check (tests/_support/tree_guard.py) sees any file written into the repository's tree."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import otel_agentloop as oal
from otel_agentloop.config._settings import DEFAULT_FILE
from tests._support import tree_guard


def test_a_test_configured_with_no_endpoint_writes_its_trace_file_into_its_tmp_path(tmp_path: Path) -> None:
    """What test_configure_survives_bad_exporter_variables and test_internal_errors_are_logged_once_and_swallowed
    did: configure() with no endpoint and no file, from a test, wrote into ./otel-agentloop-traces."""
    before = tree_guard.snapshot()
    assert Path.cwd() == tmp_path

    @oal.trace_tool("probe")
    def probe() -> int:
        return 1

    handle = oal.configure("tree-guard", watchdog=False, schedule_delay_s=0.05)
    try:
        assert handle.description == f"file {DEFAULT_FILE}"
        assert probe() == 1
        assert handle.force_flush(10)
    finally:
        handle.shutdown(5)
    written = sorted((tmp_path / DEFAULT_FILE).rglob("*.jsonl"))
    assert any('"tree-guard"' in p.read_text() for p in written), written
    assert tree_guard.changed(before, tree_guard.snapshot()) == []


@pytest.mark.e2e  # a subprocess
def test_the_snapshot_sees_new_appended_and_removed_untracked_files_but_not_tracked_ones(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "init", "-q", str(repo)], check=True, env=env)
    (repo / "tracked.py").write_text("x = 1\n")
    (repo / ".gitignore").write_text("*.jsonl\n")
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True, env=env)
    traces = repo / "otel-agentloop-traces"
    traces.mkdir()
    (traces / "index.jsonl").write_text("{}\n")  # what `make run` left: ignored by git
    (repo / "old.txt").write_text("old")
    for skipped in (".venv", "__pycache__", ".pytest_cache", "pkg.egg-info"):
        (repo / skipped).mkdir()
    before = tree_guard.snapshot(repo)
    assert set(before) == {"otel-agentloop-traces/index.jsonl", "old.txt"}

    with (traces / "index.jsonl").open("a") as f:
        f.write("{}\n")  # a test's spans appended to the user's traces
    (repo / "step3.json").write_text("[]")
    (repo / "old.txt").unlink()
    (repo / "tracked.py").write_text("x = 2\n")  # the developer's edit: not ours to judge
    for skipped in (".venv", "__pycache__", ".pytest_cache", "pkg.egg-info"):
        (repo / skipped / "f").write_text("cache")
    changes = tree_guard.changed(before, tree_guard.snapshot(repo))
    assert changes == ["removed old.txt", "changed otel-agentloop-traces/index.jsonl", "new step3.json"]
    assert "new step3.json" in tree_guard.describe(changes, repo)
