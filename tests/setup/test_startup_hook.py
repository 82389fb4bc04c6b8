"""The setup-hook flag as the one switch (otel_agentloop_startup.pth + otel_agentloop_startup): a Python whose
command line names our Ray setup hook wraps ``ray.init`` once Ray is imported; any other Python never imports
otel_agentloop at startup. Each case is a fresh interpreter that processes this checkout's .pth file the way
site does for site-packages (``site.addsitedir`` on a scratch dir holding only that file)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests._support import REPO_ROOT

ROOT = REPO_ROOT
PTH = ROOT / "otel_agentloop_startup.pth"
FLAG = "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=otel_agentloop.integrations.verl.setup_worker"

PROBE = """
import json, site, sys
site.addsitedir(sys.argv.pop(1))
before = sorted(m for m in sys.modules if m.startswith("otel_agentloop"))
import ray
from otel_agentloop.integrations import ray as oal_ray
after = sorted(m for m in ("otel_agentloop", "otel_agentloop_startup") if m in sys.modules)
print(json.dumps({"before": before, "wrapped": ray.init is oal_ray._init.wrapper and ray.init is not None,
                  "name": ray.init.__name__, "instrumented": oal_ray.is_instrumented()}))
"""


def _probe(tmp_path: Path, *argv: str, env: dict[str, str] | None = None, code: str = PROBE) -> dict:
    return _start(tmp_path, *argv, env=env, code=code)[0]


def _start(tmp_path: Path, *argv: str, env: dict[str, str] | None = None, code: str = PROBE) -> tuple[dict, str]:
    """A fresh interpreter with this checkout's .pth: (the probe's JSON line, its stderr)."""
    site_dir = tmp_path / "site"
    site_dir.mkdir(exist_ok=True)
    shutil.copy(PTH, site_dir / PTH.name)
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    base["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", code, str(site_dir), *argv],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.mark.e2e  # a subprocess
@pytest.mark.parametrize(
    "flag",
    [
        FLAG,
        FLAG.lstrip("+"),
        "+" + FLAG,
        "ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=otel_agentloop.integrations.ray.setup_worker",
    ],
)
def test_the_hook_flag_wraps_ray_init_once_ray_is_imported(tmp_path, flag):
    got = _probe(tmp_path, "trainer.n_gpus_per_node=0", flag)
    assert got["before"] == ["otel_agentloop_startup", "otel_agentloop_switch"], got  # the two tiny modules only
    assert got["wrapped"] and got["instrumented"] and got["name"] == "init", got


@pytest.mark.e2e  # a subprocess
def test_without_the_flag_nothing_of_ours_is_imported_at_startup_nor_with_ray(tmp_path):
    code = """
import json, site, sys
site.addsitedir(sys.argv.pop(1))
import ray
print(json.dumps({"ours": sorted(m for m in sys.modules if m.startswith("otel_agentloop")),
                  "finders": [type(f).__name__ for f in sys.meta_path]}))
"""
    other = "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=mypkg.setup"
    got = _probe(tmp_path, "trainer.n_gpus_per_node=0", other, code=code)
    assert got["ours"] == [] and "_RayFinder" not in got["finders"], got


@pytest.mark.e2e  # a subprocess
@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_AGENTLOOP_STARTUP_HOOK": "false"},
        {"OTEL_SDK_DISABLED": "true"},
        {"OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "requests, ray"},
    ],
)
def test_opt_out_leaves_ray_init_alone(tmp_path, env):
    got = _probe(tmp_path, FLAG, env=env)
    assert not got["wrapped"] and not got["instrumented"], got


STARTUP = "OTEL_AGENTLOOP_STARTUP_HOOK"


@pytest.mark.e2e  # a subprocess
@pytest.mark.parametrize("value", ["disable", "none", "off", "0", "false", "no", " Disabled ", "NONE"])
def test_every_off_word_leaves_ray_init_alone_without_a_word(tmp_path, value):
    """What a careful user writes to turn it off turns it off, at interpreter start; nothing is said (and the
    library, imported later in that process, does not warn about the value either)."""
    got, stderr = _start(tmp_path, FLAG, env={STARTUP: value})
    assert not got["wrapped"] and not got["instrumented"], got
    assert "otel_agentloop" not in stderr, stderr


@pytest.mark.e2e  # a subprocess
@pytest.mark.parametrize("value", ["true", "on", "1", "yes", "enable", "enabled", " "])
def test_on_words_and_an_empty_value_leave_it_on_without_a_word(tmp_path, value):
    got, stderr = _start(tmp_path, FLAG, env={STARTUP: value})
    assert got["wrapped"] and got["instrumented"], got
    assert "otel_agentloop" not in stderr, stderr


@pytest.mark.e2e  # a subprocess
@pytest.mark.parametrize("value", ["maybe", "nope"])
def test_an_unrecognised_value_turns_it_off_with_one_line_naming_the_variable_and_what_it_does(tmp_path, value):
    """Off (the variable exists to turn the hook off: a value set is never overruled), with one line on stderr at
    interpreter start; the library, imported after Ray in the same process, checks the variable again and
    stays quiet (the startup hook rewrote it to ``false``, as the check would)."""
    got, stderr = _start(tmp_path, FLAG, env={STARTUP: value})
    assert not got["wrapped"] and not got["instrumented"], got
    lines = [line for line in stderr.splitlines() if STARTUP in line]
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"otel_agentloop: {STARTUP}={value!r} is not one of false, 0, off, no, disable")
    assert "it wraps ray.init in a driver" in lines[0] and lines[0].endswith("now off; using false"), lines[0]


def test_the_startup_words_are_the_declarations():
    """The declaration (``config._environment``) accepts exactly the words the startup hook reads."""
    import otel_agentloop_switch as startup
    from otel_agentloop.config._environment import LIBRARY_VARIABLES, STARTUP_VARIABLE

    (declared,) = LIBRARY_VARIABLES
    assert declared.name == STARTUP_VARIABLE == startup.OPT_OUT
    for word in (*startup.OFF, *startup.ON):
        assert declared.parse(word.upper()) == word.upper()
    with pytest.raises(ValueError, match="now off") as caught:
        declared.parse("nope")
    assert getattr(caught.value, "value", None) == "false"


@pytest.mark.e2e  # a subprocess
def test_ray_already_imported_is_wrapped_at_once(tmp_path):
    code = """
import json, site, sys
site_dir = sys.argv.pop(1)
import ray
site.addsitedir(site_dir)
from otel_agentloop.integrations import ray as oal_ray
print(json.dumps({"wrapped": ray.init is oal_ray._init.wrapper}))
"""
    assert _probe(tmp_path, FLAG, code=code)["wrapped"]


def test_the_pth_is_one_line_that_matches_the_module():
    import otel_agentloop_startup as startup

    lines = PTH.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("import sys;")
    assert all(f'"{hook}"' in lines[0] for hook in startup.HOOKS)
    assert startup.wanted(["-m", "verl.trainer.main_ppo", FLAG]) and not startup.wanted(["-m", "x", "a=b"])


def _installed_pth() -> Path | None:
    """This interpreter's own otel_agentloop_startup.pth, when the package is installed from this checkout."""
    import importlib.metadata
    import site

    dists = importlib.metadata.distributions(name="otel-agentloop", path=site.getsitepackages())
    urls = [json.loads(d.read_text("direct_url.json") or "{}").get("url") for d in dists]
    if ROOT.as_uri() not in urls:
        return None
    return next((Path(d) / PTH.name for d in site.getsitepackages() if (Path(d) / PTH.name).exists()), Path())


@pytest.mark.e2e  # a subprocess
def test_the_install_of_this_checkout_puts_the_pth_in_site_packages_and_startup_runs_it():
    """``make install`` (``pip install -e .``): the file is at the root of site-packages, and a plain start of
    this interpreter, with no help, imports the tiny module only when the flag is on its command line."""
    pth = _installed_pth()
    if pth is None:
        pytest.skip("otel-agentloop is not installed from this checkout in this interpreter")
    assert pth.is_file() and pth.read_text() == PTH.read_text(), pth
    probe = "import json, sys; print(json.dumps(sorted(m for m in sys.modules if m.startswith('otel_agentloop'))))"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != "PYTHONPATH"}

    def start(*argv: str) -> list[str]:
        out = subprocess.run([sys.executable, "-c", probe, *argv], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    assert start("a=b") == []
    assert start(FLAG) == ["otel_agentloop_startup", "otel_agentloop_switch"]


@pytest.mark.e2e  # a subprocess
def test_with_opentelemetry_instrument_too_ray_init_is_wrapped_once():
    """Both switches on one command line (the flag, and the prefix): one wrap, around Ray's own ``ray.init``."""
    if not _installed_pth():
        pytest.skip("otel-agentloop is not installed from this checkout in this interpreter")
    code = """
import json, ray
from otel_agentloop.integrations import ray as oal_ray
original = oal_ray._init.original
print(json.dumps({"wrapped": ray.init is oal_ray._init.wrapper,
                  "once": original.__code__ is not oal_ray._init.wrapper.__code__,
                  "ray_own": original.__module__.startswith("ray.")}))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != "PYTHONPATH"}
    env.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none")
    instrument = str(Path(sys.executable).parent / "opentelemetry-instrument")
    out = subprocess.run(
        [instrument, sys.executable, "-c", code, FLAG], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"wrapped": True, "once": True, "ray_own": True}
