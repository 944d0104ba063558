"""The page benchmarks' browser: headless Chromium, the "shown" probe, the main thread's busy.

Headless Chromium (/usr/bin/chromium, /usr/bin/chromedriver) on a profile directory of its
own (a fresh one is a cold cache). A page is timed by the probe (probe.js), injected before
any of the page's own scripts (CDP Page.addScriptToEvaluateOnNewDocument): it records
performance.now(), ms from navigation start, the first time the page is "shown".
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

__all__ = [
    "SHOWN_TIMEOUT_S",
    "appended",
    "browser",
    "busy",
    "cold_load",
    "open_page",
    "poll",
    "probe",
]

SHOWN_TIMEOUT_S = 180.0
PROBE_JS = (Path(__file__).parent / "probe.js").read_text(encoding="utf-8")
STATS_JS = "return (window.keelLive && window.keelLive.stats) ? JSON.parse(JSON.stringify(window.keelLive.stats)) : null"


def chrome(profile: Path, window: tuple[int, int]) -> webdriver.Chrome:
    """Headless Chromium on its own profile directory (a fresh one is a cold cache)."""
    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-dev-shm-usage", f"--window-size={window[0]},{window[1]}",
                 f"--user-data-dir={profile}", "--remote-allow-origins=*"):  # fmt: skip
        options.add_argument(flag)
    options.page_load_strategy = "none"  # driver.get returns at once; the probe times the page
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    driver.set_script_timeout(30)
    return driver


@contextmanager
def browser(window: tuple[int, int], profile: Path | None = None) -> Iterator[webdriver.Chrome]:
    """A browser on `profile`, or on a new empty profile (deleted after) when None."""
    directory = profile or Path(tempfile.mkdtemp(prefix="keel-page-profile-"))
    driver = chrome(directory, window)
    try:
        yield driver
    finally:
        with contextlib.suppress(Exception):
            driver.quit()
        if profile is None:
            shutil.rmtree(directory, ignore_errors=True)


def probe(
    kind: str, keys: list[str] | tuple[str, ...] = (), runs: list[str] | tuple[str, ...] = ()
) -> str:
    """The probe's source for a page of `kind` (keel, table, tensorboard, trackio): shown
    once every key in `keys` is drawn for every run in `runs` (probe.js says how, per kind)."""
    spec = json.dumps({"kind": kind, "keys": list(keys), "runs": list(runs)})
    return f"{PROBE_JS}({spec});"


def poll(driver: webdriver.Chrome, script: str, timeout: float, what: str, *args: Any) -> Any:
    """`script` (with `args`) run every 50 ms until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = driver.execute_script(script, *args)
        except WebDriverException:  # the document is not there yet (page_load_strategy none)
            value = None
        if value:
            return value
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def open_page(
    driver: webdriver.Chrome, url: str, source: str, what: str, timeout: float = SHOWN_TIMEOUT_S
) -> float:
    """Navigate to `url` with the probe `source` installed; seconds from navigation start
    until it saw the page shown."""
    identifier = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": source})["identifier"]
    driver.get(url)
    try:
        return float(poll(driver, "return window.__bench && window.__bench.shown", timeout, what)) / 1000
    finally:
        driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": identifier})


def cold_load(url: str, source: str, what: str, window: tuple[int, int]) -> float:
    """`open_page` in a new browser on a fresh profile."""
    with browser(window) as driver:
        return open_page(driver, url, source, what)


def _task_metrics(driver: webdriver.Chrome) -> tuple[float, float]:
    metrics = {m["name"]: m["value"] for m in driver.execute_cdp_cmd("Performance.getMetrics", {})["metrics"]}
    return float(metrics["TaskDuration"]), float(metrics["Timestamp"])


def busy(driver: webdriver.Chrome, seconds: float) -> float:
    """Fraction of wall time the page's main thread ran tasks, over the next `seconds`."""
    driver.execute_cdp_cmd("Performance.enable", {"timeDomain": "timeTicks"})
    task0, wall0 = _task_metrics(driver)
    time.sleep(seconds)
    task1, wall1 = _task_metrics(driver)
    return (task1 - task0) / (wall1 - wall0)


def appended(driver: webdriver.Chrome) -> int | None:
    """Points the live updater has drawn into the page's charts (keelLive.stats); None
    where the page has no instrumented live updater."""
    stats = driver.execute_script(STATS_JS)
    return int(stats["appended"]) if stats and "appended" in stats else None
