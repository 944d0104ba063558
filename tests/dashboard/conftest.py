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


def _start_chromium():  # type: ignore[no-untyped-def]
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=chromium_options())
    driver.set_page_load_timeout(30)
    instrument(driver)
    return driver


def _leave_page(driver) -> None:  # type: ignore[no-untyped-def]
    """What a test leaves behind goes: the page's storage (its origin's), every cookie, the
    page itself (its sockets to a server about to stop), the console's messages."""
    if driver.current_url.startswith("http"):
        driver.execute_script("window.localStorage.clear(); window.sessionStorage.clear();")
    driver.get("about:blank")
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})
    driver.get_log("browser")


class _Chromium:
    """One headless Chromium for a test module, restarted after a test that leaves it unusable."""

    def __init__(self) -> None:
        self.driver = None

    def fresh(self):  # type: ignore[no-untyped-def]
        if self.driver is None:
            self.driver = _start_chromium()
        set_viewport(self.driver, 1280, 800)
        self.driver.get_log("browser")  # no message from before this test
        return self.driver

    def release(self) -> None:
        if self.driver is None:
            return
        try:
            if len(self.driver.window_handles) != 1:
                raise RuntimeError("a test left windows open")
            _leave_page(self.driver)
        except Exception:
            self.quit()

    def quit(self) -> None:
        if self.driver is not None:
            driver, self.driver = self.driver, None
            driver.quit()


def _chromium_or_skip() -> None:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.path.exists(path)]
    if missing:
        message = f"Chromium not installed ({', '.join(missing)}): apt-get install -y chromium chromium-driver"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="module")
def _chromium() -> Iterator[_Chromium]:
    chromium = _Chromium()
    try:
        yield chromium
    finally:
        chromium.quit()


@pytest.fixture
def browser(_chromium: _Chromium) -> Iterator[object]:
    """A headless Chromium at 1280×800 with nothing from an earlier test: no page, cookie,
    storage or console message (one Chromium serves a module's tests: starting one per test
    cost seconds each). Fails (not skips) in CI when Chromium is missing."""
    _chromium_or_skip()
    try:
        yield _chromium.fresh()
    finally:
        _chromium.release()


@pytest.fixture
def artifacts() -> Path:
    """Where screenshots go (artifacts/ is git-ignored; CI can keep it)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
