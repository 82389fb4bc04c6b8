"""The cached venvs (scripts/venv_lib.sh, issue 38 item 3): one venv per set of pins, shared by checkouts, each
checkout running its own code through its wrapper; checkouts with other pins get another venv and never remove
this one; old venvs are bounded, never removed while running.

A is this checkout; B is a clone of it (its tracked and unignored files, as they are now) in the test's temp dir.
The cache root is a temp dir (``OTEL_AGENTLOOP_CACHE``). ``tests/venvs/tiny_env.sh`` builds a small venv through
the same head as the four real scripts; the real scripts are run on the path that costs no build: adopting the
previous layout's venv (a stand-in with the stamp that layout wrote for today's pins).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests._support import REPO_ROOT

pytestmark = pytest.mark.e2e  # the CLI or Python in subprocesses

ROOT = REPO_ROOT
ORIGIN = "import importlib.util as u; s = u.find_spec('otel_agentloop'); print(s and s.origin)"


def clone(dest: Path) -> Path:
    """A clone of this checkout with its working-tree content (what `git clone` gives, plus uncommitted edits)."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def env_script(checkout: Path, script: str, cache: Path, **extra: str) -> tuple[str, str]:
    """Run a venv script of ``checkout``: (the last line it printed: the wrapper, its stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "OTEL_AGENTLOOP", "VIRTUAL_ENV"))}
    env.update(OTEL_AGENTLOOP_CACHE=str(cache), **extra)
    proc = subprocess.run(
        ["bash", str(checkout / script)], env=env, capture_output=True, text=True, timeout=600, cwd="/"
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.strip().splitlines()[-1], proc.stderr


def venv_of(stderr: str) -> Path:
    """The venv a script reported (``cached at``, ``building``, ``adopted ... as``)."""
    found = re.findall(r"venv: (?:cached at|building|adopted \S+ \(built for these pins\) as) (\S+)", stderr)
    assert found, stderr
    return Path(found[-1])


def origin(python: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run([python, "-c", ORIGIN], env=env, capture_output=True, text=True, cwd="/", check=True).stdout


def test_checkouts_share_a_venv_per_pins_and_each_runs_its_own_code(tmp_path: Path) -> None:
    cache, tiny = tmp_path / "cache", "tests/venvs/tiny_env.sh"
    b = clone(tmp_path / "b")
    wrapper_a, err = env_script(ROOT, tiny, cache)
    venv = venv_of(err)
    assert "building" in err
    wrapper_b, err = env_script(b, tiny, cache)
    assert venv_of(err) == venv and "cached at" in err, err  # same pins: B reuses A's venv, no build
    assert wrapper_a != wrapper_b
    assert origin(wrapper_a).strip() == str(ROOT / "otel_agentloop" / "__init__.py")
    assert origin(wrapper_b).strip() == str(b / "otel_agentloop" / "__init__.py")
    assert origin(str(venv / "bin" / "python")).strip() == "None"  # the venv itself holds no checkout's code

    # other pins in B: another venv; A's stays, untouched, and A still runs A's code
    with (b / "constraints.txt").open("a") as pins:
        pins.write("# other pins\n")
    stamp_a = (venv / ".key").stat().st_mtime_ns
    wrapper_b2, err = env_script(b, tiny, cache)
    venv_b = venv_of(err)
    assert venv_b != venv and "building" in err, err
    assert "removed" not in err, err
    _, err = env_script(ROOT, tiny, cache)
    assert venv_of(err) == venv and "cached at" in err, err
    assert (venv / ".key").stat().st_mtime_ns == stamp_a
    assert origin(wrapper_a).strip() == str(ROOT / "otel_agentloop" / "__init__.py")
    assert origin(wrapper_b2).strip() == str(b / "otel_agentloop" / "__init__.py")

    # bounded: with one kept, A's venv survives while a process runs it, and goes once none does
    sleeper = subprocess.Popen(
        [wrapper_a, "-c", "import time; print('up', flush=True); time.sleep(120)"], cwd="/", stdout=subprocess.PIPE
    )
    try:
        assert sleeper.stdout is not None and sleeper.stdout.readline() == b"up\n"  # its python runs
        _, err = env_script(b, tiny, cache, OTEL_AGENTLOOP_VENVS_KEEP="1")
        assert "removed" not in err and (venv / "bin" / "python").exists(), err
    finally:
        sleeper.kill()
        sleeper.wait()
    _, err = env_script(b, tiny, cache, OTEL_AGENTLOOP_VENVS_KEEP="1")
    assert f"removed {venv}" in err and not venv.exists(), err
    assert (venv_b / "bin" / "python").exists()


REAL = {
    "engine": ["scripts/engine-constraints.txt"],
    "verl": [],
    "verifiers": [],
    "trl": ["scripts/engine-constraints.txt"],
}


def current_key(name: str) -> str:
    """The key scripts/venv_lib.sh computes for ``scripts/NAME_env.sh`` with today's files."""
    import hashlib

    layout = re.search(r"^VENV_LAYOUT=(\S+)", (ROOT / "scripts" / "venv_lib.sh").read_text(), re.M)
    assert layout is not None
    data = f"layout {layout.group(1)}\n".encode() + (ROOT / f"scripts/{name}_env.sh").read_bytes()
    data += project_pins((ROOT / "pyproject.toml").read_text()).encode()
    data += b"".join((ROOT / f).read_bytes() for f in ["constraints.txt", *REAL[name]])
    return hashlib.sha256(data).hexdigest()[:12]


def project_pins(pyproject: str) -> str:
    """``pyproject.toml`` less its ``[tool.*]`` tables and comment lines, as the key reads it (what puts nothing
    in a venv)."""
    kept, skip = [], False
    for line in pyproject.splitlines(keepends=True):
        if re.match(r"[ \t]*#", line):
            continue
        if re.match(r"\[\[?tool\.", line):
            skip = True
            continue
        if line.startswith("["):
            skip = False
        if not skip:
            kept.append(line)
    return "".join(kept)


def test_a_tool_table_leaves_the_key_as_it_is(tmp_path: Path) -> None:
    """Linters', pytest's and import contracts' settings ([tool.*] in pyproject.toml) and comment lines put
    nothing in a venv: a checkout that changes them gets the same venv (no rebuild); one that changes the
    dependencies gets another."""
    cache = tmp_path / "cache"
    a = clone(tmp_path / "a")
    _, err = env_script(a, "tests/venvs/tiny_env.sh", cache)
    first = venv_of(err)
    pyproject = a / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + '\n[tool.some-linter]\nrule = "new"\n')
    _, err = env_script(a, "tests/venvs/tiny_env.sh", cache)
    assert venv_of(err) == first and "cached at" in err, err
    text = pyproject.read_text()
    assert "dependencies = [" in text
    pyproject.write_text(text.replace("dependencies = [", "dependencies = [\n    # a comment, put nowhere", 1))
    _, err = env_script(a, "tests/venvs/tiny_env.sh", cache)
    assert venv_of(err) == first and "cached at" in err, err
    text = pyproject.read_text()
    assert "dependencies = [" in text
    pyproject.write_text(text.replace("dependencies = [", 'dependencies = [\n    "six",', 1))
    _, err = env_script(a, "tests/venvs/tiny_env.sh", cache)
    assert venv_of(err) != first and "building" in err, err


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_scripts_adopt_the_previous_venv_and_run_the_callers_code(tmp_path: Path, name: str) -> None:
    """Each real script, on a cache holding the previous layout's venv for today's pins (a stand-in: a bare venv
    with the stamp that layout wrote), adopts it without a build and gives each checkout a wrapper running its
    own code; the stand-in is neither removed nor rebuilt, not even when an older key linked to it is pruned."""
    table = re.search(r'VENV_LEGACY="([^"]*)"', (ROOT / "scripts" / "venv_lib.sh").read_text())
    assert table is not None
    entries = {e.split(":")[0]: e.split(":")[1:] for e in table.group(1).split()}
    if name not in entries:
        pytest.skip(f"no previous-layout {name} venv to adopt (VENV_LEGACY)")
    stamp, key = entries[name]
    if key != current_key(name):  # checked first: a mismatch would start a real (long) build
        pytest.fail(f"VENV_LEGACY's {name} entry is for other pins (key {key}, now {current_key(name)}): drop it")
    cache = tmp_path / "cache"
    legacy = cache / f"{name}-venv"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(legacy)], check=True)
    (legacy / ".stamp").write_text(stamp + "\n")
    # the same folder adopted before under another key (a checkout of an earlier key formula), least recently used
    stale = cache / "venvs" / f"{name}-000000000000"
    stale.parent.mkdir(parents=True)
    stale.symlink_to(legacy)
    stale_lock = stale.parent / f"{stale.name}.lock"
    stale_lock.touch()
    os.utime(stale_lock, (1, 1))
    b = clone(tmp_path / "b")
    wrapper_a, err = env_script(ROOT, f"scripts/{name}_env.sh", cache, OTEL_AGENTLOOP_VENVS_KEEP="1")
    assert venv_of(err) == cache / "venvs" / f"{name}-{key}" and "adopted" in err, err
    # pruned: the stale key's link goes, the folder it shares with today's key stays
    assert f"removed {stale}" in err and not stale.is_symlink(), err
    assert (legacy / "bin" / "python").exists(), err
    wrapper_b, err = env_script(b, f"scripts/{name}_env.sh", cache)
    assert venv_of(err) == cache / "venvs" / f"{name}-{key}" and "cached at" in err, err
    assert origin(wrapper_a).strip() == str(ROOT / "otel_agentloop" / "__init__.py")
    assert origin(wrapper_b).strip() == str(b / "otel_agentloop" / "__init__.py")
    assert (legacy / ".stamp").read_text().strip() == stamp and not legacy.is_symlink()
