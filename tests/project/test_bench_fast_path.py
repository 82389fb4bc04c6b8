"""bench/fast_path.py and bench/step_overhead.py (issue 20) run, count every span and name the path they ran on.

No timing is asserted (numbers live in bench/RESULTS.md): these runs are tiny and check only that the
measurements measure what they say, on this tree and on the fast path once it lands.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import paths  # noqa: E402
import step_overhead  # noqa: E402


def _expected_used(path: str) -> str:
    return path if paths.has_fast_path() else "sdk (no fast path in this tree)"


@pytest.mark.parametrize("path", paths.PATHS)
def test_configure_on_records_on_the_path_asked_for(tmp_path: Path, path: str) -> None:
    before = os.environ.get(paths.FAST_PATH_VARIABLE)
    handle = paths.configure_on(path, service_name="t", file=str(tmp_path / "t.jsonl"), set_global=False)
    try:
        assert paths.path_used(handle) == _expected_used(path)
        assert os.environ.get(paths.FAST_PATH_VARIABLE) == before  # the switch leaves the environment as it was
    finally:
        handle.shutdown(5)


@pytest.mark.e2e  # a subprocess
def test_fast_path_section_counts_every_span_and_replaces_its_section(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\n## Fast path (issue 20)\n\nold numbers\n\n## Later section\n\nkept\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    cmd = [sys.executable, str(BENCH / "fast_path.py"), "--calls", "100", "--rounds", "1", "--round-s", "0"]
    cmd += ["--step-pairs", "0"]
    proc = subprocess.run([*cmd, "--write", str(results)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = results.read_text()
    assert text.count("## Fast path (issue 20)") == 1
    assert "old numbers" not in text
    assert text.endswith("## Later section\n\nkept\n")
    # 3 kinds x (100 phase spans + a sample and a step span) per traced configuration, all exported
    for config in ("fast", "sdk", "bare"):
        assert f"{config}: 306 exported of 306, 0 dropped" in text
    assert "MISMATCH" not in text
    assert "checked equal, and equal to the SDK path's, on the warm-up round" in text
    for row in (
        "**fast / bare SDK, wall**",
        "**fast / bare SDK, training-thread CPU**",
        "**fast / bare SDK, process CPU**",
    ):
        assert row in text
    assert "disabled (`configure(enabled=False)`), wall" in text
    if paths.has_fast_path():
        assert "Paths used: fast column ['fast'], SDK path column ['sdk']." in text
    else:
        assert "**This tree has no fast path**" in text


def test_step_overhead_names_the_path_each_process_used() -> None:
    r = step_overhead.measure(pairs=1, steps=1, prompts=2, rollout_n=2, paths=paths.PATHS, time_scale=0.02)
    assert r["used"] == {"off": "off", "fast": _expected_used("fast"), "sdk": _expected_used("sdk")}
    for path in paths.PATHS:
        assert r["stats"][path]["dropped"] == 0
        assert r["stats"][path]["exported"] > 4  # 4 samples, each a sample span and its phases, and the step
    line = step_overhead.summary_line(r)
    assert f"path fast (ran: {_expected_used('fast')})" in line
    assert f"path sdk (ran: {_expected_used('sdk')})" in line
