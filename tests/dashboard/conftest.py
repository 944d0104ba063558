"""Headless Chromium for the dashboard tests (Debian's chromium + chromium-driver; never downloaded)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.browser import instrument, set_viewport

CHROMIUM = os.environ.get("KEEL_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("KEEL_CHROMEDRIVER", "/usr/bin/chromedriver")
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "dashboard"


def chromium_options(width: int = 1280, height: int = 800):  # type: ignore[no-untyped-def]
    from selenium.webdriver.chrome.options import Options

    options = Options()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return options


@pytest.fixture
def browser() -> Iterator[object]:
    """A fresh headless Chromium at 1280×800. Fails (not skips) in CI when Chromium is missing."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(path)]
    if missing:
        message = f"Chromium not installed ({', '.join(missing)}): apt-get install -y chromium chromium-driver"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=chromium_options())
    driver.set_page_load_timeout(30)
    instrument(driver)
    set_viewport(driver, 1280, 800)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def artifacts() -> Path:
    """Where screenshots go (artifacts/ is git-ignored; CI can keep it)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
