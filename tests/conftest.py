"""Shared fixtures: a configured otel_agentloop with an in-memory exporter, isolated per test.

Tests never write into the working directory (where ``make run`` leaves the user's
``otel-agentloop-traces/``) nor anywhere in the repository: every test runs in its own ``tmp_path`` (so the
default trace file, a relative path, lands there, and so does any subprocess that inherits the working
directory), module and session fixtures run in a session temp dir, and the session fails when the repository's
working tree gained or changed a file that git does not track (see :mod:`tests._support.tree_guard`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_agentloop import testing
from tests._support import tree_guard
from tests._support.browser import find_chromium
from tests._support.spans import Traced, span_metrics  # noqa: F401 - span_metrics: some tests import it from here


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[tree_guard.BEFORE] = tree_guard.snapshot()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run (exit 1) when a test wrote into the repository's working tree."""
    before = session.config.stash.get(tree_guard.BEFORE, None)
    if before is None:
        return
    changed = tree_guard.changed(before, tree_guard.snapshot())
    if changed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = tree_guard.describe(changed)
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(message, red=True, bold=True)
        else:  # pragma: no cover - pytest always has one, unless -p no:terminal
            print(message)
        if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def _session_cwd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Session and module fixtures (a Ray cluster, a simulated run) start in a temp dir, not the repository."""
    with pytest.MonkeyPatch.context() as mp:
        cwd = tmp_path_factory.mktemp("cwd")
        mp.chdir(cwd)
        yield cwd


@pytest.fixture(autouse=True)
def _isolate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No OTEL_* from the outer environment; once-only warnings forgotten; process state put back after; the
    test runs in its ``tmp_path``, where the default trace file then goes."""
    monkeypatch.chdir(tmp_path)
    with testing.isolated():
        yield


@pytest.fixture
def traced() -> Iterator[Traced]:
    with testing.capture() as captured:
        yield captured


# -- markers: `make test-fast` runs -m "not e2e and not slow" ------------------------------------------------------
E2E_FIXTURES = frozenset({"browser", "chromium", "cluster", "ray_cluster", "on_ray", "stack"})
"""A test that uses one of these starts a real component (a browser, a local Ray cluster, the Jaeger/Collector
stack): it is ``e2e`` wherever it lives. A test that runs the CLI, a simulated job or Python in a subprocess, or
starts Ray itself, says so (``@pytest.mark.e2e``, or ``pytestmark`` for a whole module); tests/e2e is e2e as a
whole (its conftest). ``slow``: over about 10 s on 2 cores."""


def pytest_configure(config: pytest.Config) -> None:
    """The markers, registered here rather than in pyproject.toml: the framework venvs' keys hash that file, and
    a marker's wording is no reason to rebuild them (--strict-markers is on)."""
    config.addinivalue_line(
        "markers",
        "e2e: runs real processes: the Jaeger/Collector stack, OpenSearch, a Ray cluster, a browser, or the CLI, a "
        "simulated job or Python in a subprocess (all of tests/e2e)",
    )
    config.addinivalue_line("markers", "slow: takes over about 10 s on 2 cores")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)


# -- the browser the page tests drive (tests/analysis, tests/cli, tests/e2e) -----------------------------------------
@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """A real headless Chromium (selenium, Debian's chromium-driver); skips when none is installed, fails under CI."""
    found = find_chromium()  # installed by `make browser`, a step of `make test`: a test never installs it
    if found is None:
        reason = "no chromium + chromedriver on PATH (`make browser` installs Debian's chromium + chromium-driver)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason + " (CI must run the browser test)")
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = found[0]
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1500,1000",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=found[1]), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
