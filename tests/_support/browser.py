"""The headless Chromium the page tests drive (the fixture ``browser`` is in tests/conftest.py), and what they do
with it: open a page from disk, read the console's errors and the step page's rows, and read a PNG's size."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path


def find_chromium() -> tuple[str, str] | None:
    """Debian's ``chromium`` and ``chromedriver`` on PATH (``make browser`` installs them), or None."""
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def open_page(driver, page: Path) -> None:
    """Open ``page`` from disk and wait until the document is loaded."""
    driver.get(page.resolve().as_uri())
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 10).until(lambda d: d.execute_script("return document.readyState") == "complete")


def severe_console(driver) -> list[str]:
    """The browser console's SEVERE messages so far."""
    return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def step_rows(driver) -> list:
    """The step page's sample rows."""
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, "#rows .row")


def png_size(path: Path) -> tuple[int, int]:
    """A PNG file's (width, height); fails when the file is not a PNG."""
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n"), path
    return struct.unpack(">II", data[16:24])
