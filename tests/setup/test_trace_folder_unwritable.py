"""An unwritable trace folder (issue 41, item 6): whether ``file=`` names one of the user's files or a read-only
folder, the user's program runs on, and stderr holds one line with the path and what to do: no traceback, no
"internal error". Real processes: each case is a small driver run as a subprocess (without CAP_DAC_OVERRIDE when
the tests run as root, so that a folder's mode binds)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests._support import REPO_ROOT

pytestmark = pytest.mark.e2e  # the CLI or Python in subprocesses

DRIVER = textwrap.dedent(
    """
    import asyncio, sys
    import otel_agentloop as oal

    @oal.trace_generate
    async def generate():
        await asyncio.sleep(0.001)

    async def rollout():
        for step in (1, 2):
            with oal.step(step):
                async with oal.sample(0, 0):
                    await generate()
            handle.metrics.collect(step)
            handle.force_flush(10)

    handle = oal.configure("unwritable", file=sys.argv[1], schedule_delay_s=30, watchdog=False)
    asyncio.run(rollout())
    stats = handle.stats
    handle.shutdown(5)
    print("user code done", stats["exported"], stats["failed"] > 0)
    """
)


PR_CAPBSET_DROP, CAP_DAC_OVERRIDE = 24, 1


def _without_override() -> None:
    """In the child, before exec (tests running as root): drop CAP_DAC_OVERRIDE from the capability bounding
    set, so that the program runs as root but a folder's mode binds it, as it binds any user."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _drive(path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    root = os.geteuid() == 0
    return subprocess.run(
        [sys.executable, "-c", DRIVER, str(path)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_without_override if root else None,  # nothing but prctl before exec
    )


def _one_plain_line(proc: subprocess.CompletedProcess[str], path: Path) -> str:
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "user code done 0 True", proc.stdout  # the user's program ran to its end
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    (line,) = lines
    assert "Traceback" not in proc.stderr and "internal error" not in line, proc.stderr
    assert str(path) in line and "OTEL_AGENTLOOP_FILE" in line and "file=" in line, line
    return line


def test_a_folder_path_that_is_one_of_the_users_files_is_one_plain_line(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.write_text("the user's own file\n")
    line = _one_plain_line(_drive(notes, tmp_path), notes)
    assert "is a file, not a folder" in line, line
    assert notes.read_text() == "the user's own file\n"


def test_a_read_only_folder_is_one_plain_line(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    folder.mkdir(mode=0o555)
    folder.chmod(0o555)
    line = _one_plain_line(_drive(folder, tmp_path), folder)
    assert "Permission denied" in line, line
    assert not list(folder.iterdir())


def test_a_one_file_path_in_a_read_only_folder_is_one_plain_line(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    target = folder / "traces.jsonl"
    line = _one_plain_line(_drive(target, tmp_path), target)
    assert "Permission denied" in line and "a file you can write" in line, line
