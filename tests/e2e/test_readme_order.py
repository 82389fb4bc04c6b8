"""The README's commands, in the README's order, in a fresh ``git clone`` (issue 27, "a newcomer's first hour").

The commands come from README.md's fenced bash blocks, so the test breaks when the README changes: ``make run``
(the first block), then what ``make test`` must never do to its traces (a test that configures tracing, run in
the clone, leaves the file ``make run`` wrote unchanged), then every ``$R ...`` line of "The whole run" block,
each with the block's ``R=...``. ``make run``'s output and ``report --step``'s have the lines the README shows
(the metrics table, ``slowest:``, the slowest sample's waterfall header); the files the commands write are all
ignored by git (``git status`` is clean afterwards).

The clone reuses this checkout's ``.venv`` (a symlink, so ``make run`` installs nothing: the venv's stamp names
the checksum of pyproject.toml + constraints.txt, the same in the clone) with ``PYTHONPATH`` set to the clone,
so the clone's code runs, in the driver and in the Ray workers (``simulate`` hands its package root on).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
TRACES = "otel-agentloop-traces"
# tests that configured tracing with no endpoint and no file, and so wrote into ./otel-agentloop-traces
CONFIGURING_TESTS = [
    "tests/config/test_harm_settings.py::test_configure_survives_bad_exporter_variables",
    "tests/core/test_decorators.py::test_internal_errors_are_logged_once_and_swallowed",
]


def _contents(folder: Path) -> dict[str, bytes]:
    """Every file under the trace directory (relative path -> bytes)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _bash_blocks() -> list[list[str]]:
    """Each fenced bash block of the README as its command lines (comments and blank lines dropped)."""
    blocks = re.findall(r"^```bash\n(.*?)^```", README, re.S | re.M)
    return [[c for c in (line.split(" #")[0].strip() for line in b.splitlines()) if c] for b in blocks]


def _shape(line: str) -> str:
    """A regex for lines like ``line``: any number where it has one, any trace id where it has one."""
    parts = []
    for word in line.split():
        if re.fullmatch(r"[0-9a-f]{32}", word):
            parts.append("[0-9a-f]{32}")
        else:
            parts.append(r"\d+(?:\.\d+)?".join(re.escape(p) for p in re.split(r"\d+(?:\.\d+)?", word)))
    return "^" + r"\s+".join(parts) + "$"


def _output_lines() -> list[str]:
    """The lines of the README's sample output that any run prints in the same shape: the metrics table down to
    ``samples:``, and the slowest sample's waterfall header lines (not the bars, which vary)."""
    block = re.search(r"^```\n(== step .*?)^```", README, re.S | re.M)
    assert block, "README: no sample output block starting with '== step'"
    return [line.strip() for line in block.group(1).splitlines() if line.strip() and "|" not in line]


def _run(cmd: str, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        ["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert out.returncode == 0, f"{cmd!r} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def _has_lines_like(text: str, readme_lines: list[str], what: str) -> None:
    lines = [line.strip() for line in text.splitlines()]
    missing = [r for r in readme_lines if not any(re.match(_shape(r), line) for line in lines)]
    assert not missing, f"{what}: no line like the README's {missing}:\n{text[-4000:]}"


@pytest.fixture
def clone(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    for tool in ("git", "make", "bash"):
        if shutil.which(tool) is None:
            pytest.fail(f"the README's commands need {tool}", pytrace=False)
    venv = ROOT / ".venv"
    if not (venv / "bin" / "otel-agentloop").exists():
        pytest.fail(f"no {venv} with otel-agentloop: run `make install` first", pytrace=False)
    repo = tmp_path / "otel_agentloop"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True, timeout=120)
    (repo / ".venv").symlink_to(venv)
    # as a user's shell: none of our variables, nor the outer make's (`make test ARGS=-q` hands ARGS and its
    # flags to every make below it through the environment)
    outer_make = {"ARGS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"}
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OTEL_", "RAY_ADDRESS", "PYTHONPATH")) and k not in outer_make
    }
    env.update(PYTHONPATH=str(repo), PYTHONUNBUFFERED="1")
    for name in ("pyproject.toml", "constraints.txt"):  # as old as the clone's commit: the venv is current
        os.utime(repo / name, (0, 0))
    dry = subprocess.run(["make", "-n", "run"], cwd=repo, env=env, capture_output=True, text=True, check=True)
    if "pip install" in dry.stdout:
        pytest.fail(
            f"{venv} was not installed from this commit's pyproject.toml + constraints.txt (make install); the "
            f"clone would re-install it:\n{dry.stdout}",
            pytrace=False,
        )
    return repo, env


@pytest.mark.timeout(600)
def test_the_readmes_commands_in_the_readmes_order(clone: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    repo, env = clone
    blocks = _bash_blocks()
    first = blocks[0]
    assert first[0] == "make run" and "make test" in first[1:], first  # the two commands, make run first
    whole_run = next(b for b in blocks if any(c.startswith("R=") for c in b))
    r_line = next(c for c in whole_run if c.startswith("R="))
    reports = [c for c in whole_run if c.startswith("$R ")]
    assert TRACES in r_line and len(reports) >= 4, whole_run

    # make run: the default 3 steps, the output the README shows
    run = _run("make run", repo, env, timeout=360)
    readme_lines = _output_lines()
    assert len(readme_lines) >= 10 and readme_lines[1].startswith("phase (s)"), readme_lines
    _has_lines_like(run.stdout, readme_lines, "make run")
    trace_dir = repo / TRACES
    written = _contents(trace_dir)
    assert any(b'"otel-agentloop-sim"' in data for data in written.values()), sorted(written)

    # make test's tests leave the user's trace file alone
    inner = _run(
        shlex.join([".venv/bin/python", "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "addopts="])
        + f" --basetemp={shlex.quote(str(tmp_path / 'inner'))} "
        + shlex.join(CONFIGURING_TESTS),
        repo,
        env,
        timeout=300,
    )
    assert re.search(r"^\d+ passed", inner.stdout, re.M), inner.stdout
    assert _contents(trace_dir) == written

    # The whole run: each $R line, on what make run wrote
    outputs = {cmd: _run(f"{r_line}\n{cmd}", repo, env, timeout=120).stdout for cmd in reports}
    steps_seen = 0
    for cmd, out in outputs.items():
        args = shlex.split(cmd)[1:]
        if args == ["--runs"]:
            runs = [line for line in out.splitlines() if line.startswith("* ")]
            assert len(runs) == 1 and " 1..3 (3) " in runs[0] and "otel-agentloop-sim" in runs[0], out
        elif args[:1] == ["--run"]:
            page = args[args.index("--html") + 1]
            assert re.search(rf"^run page written to {re.escape(page)} \(4 steps, 4 timeline pages\)$", out, re.M)
            assert (repo / page).stat().st_size > 10_000
            stem = page.rsplit(".", 1)[0]
            pages = {p.name for p in (repo / f"{stem}.steps").iterdir()}
            assert pages == {"step-1.html", "step-2.html", "step-2-validation.html", "step-3.html"}, pages
        elif args[:1] == ["--compare"]:
            a, b = args[1:3]
            assert re.search(rf"^== step {a} -> step {b}: compared from {TRACES}", out, re.M), out
            assert re.search(r"^cause: ", out, re.M), out
        elif args[:1] == ["--step"]:
            steps_seen += 1
            step = args[1]
            assert re.search(rf"^== step {step}: agent_loop metrics rebuilt from {TRACES}$", out, re.M), out
            table = [r for r in readme_lines if not r.startswith(("== step", "slowest sample", "span"))]
            _has_lines_like(out, table, f"report {cmd}")
            if "--perfetto" in args:
                target = args[args.index("--perfetto") + 1]
                assert f"Perfetto trace written to {target}" in out
                events = json.loads((repo / target).read_text())["traceEvents"]
                assert sum(1 for e in events if e.get("ph") == "X" and e.get("name") == "rl.sample") == 64
        else:
            pytest.fail(f"the README's {cmd!r} has no check here: add one")
    assert steps_seen >= 1 and any("--compare" in c for c in reports)

    # nothing the README's commands wrote shows up in git status, and the trace file is still make run's
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True)
    assert status.stdout == "", status.stdout
    assert _contents(trace_dir) == written
