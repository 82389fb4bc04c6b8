"""The install line of docs/cluster.md into a real verl 0.9.1 environment (this stage's venv: verl, torch, Ray):
pip, asked for what it would do, changes none of verl, torch or Ray (a bound in our requirements would make it
upgrade, downgrade or refuse them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
USERS_OWN = {"verl", "torch", "ray"}


def test_installing_into_a_verl_environment_changes_none_of_verl_torch_or_ray(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report), f"{ROOT}[verl]"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    would_install = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert "otel-agentloop" in would_install
    assert not would_install & USERS_OWN, would_install
