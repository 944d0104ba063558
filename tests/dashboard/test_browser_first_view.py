"""The run page's first view in headless Chromium at 1500 × 1000: the five headline charts
start above the fold on load; config and backtest are folded and open on a click."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.browser import (
    charts,
    console_errors,
    screenshot,
    set_viewport,
    text_of,
    wait_until,
)
from tests.support.toy_runs import HEADLINE, LiveRun, toy_values

pytestmark = [
    pytest.mark.browser,
    pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
]

WIDTH, HEIGHT = 1500, 1000

TOPS_JS = """
return {
  scroll: window.scrollY,
  viewport: window.innerHeight,
  charts: Array.from(document.querySelectorAll('#run-charts .chart-card[data-key]')).map(function (c) {
    return {key: c.getAttribute('data-key'), top: c.getBoundingClientRect().top};
  }),
  folds: ['run-config-fold', 'backtest-fold'].map(function (id) {
    var e = document.getElementById(id);
    return e ? {id: id, tag: e.tagName, open: e.open} : null;
  }),
};
"""


def _rows(steps: int) -> list[dict[str, Any]]:
    rows = [{"step": s, "values": toy_values(s, 0)} for s in range(steps)]
    rows[steps // 2]["values"]["mismatch/kl"] = "nan"  # an alert in the alerts panel
    return rows


def test_the_headline_charts_are_in_the_first_view_at_1500_by_1000(server, browser, artifacts) -> None:
    set_viewport(browser, WIDTH, HEIGHT)
    run = LiveRun(server, "first-view", "cispo", config={"lr": 1e-6, "notes": "x" * 40, **{f"k{i}": i for i in range(30)}})
    run.send(_rows(120))
    browser.get(f"{server.url}/runs/{run.id}")
    wait_until(lambda: "non-finite" in text_of(browser, "run-alerts"), 30, message="the alert")

    def headline_drawn() -> set[str] | None:
        drawn = {c["key"] for c in charts(browser) if c["render"]}
        return drawn if set(HEADLINE) <= drawn else None

    wait_until(headline_drawn, 30, message="the headline charts drawn")
    view = browser.execute_script(TOPS_JS)
    screenshot(browser, artifacts / "run-first-view.png", full_page=False)
    assert view["scroll"] == 0 and view["viewport"] == HEIGHT
    tops = {c["key"]: c["top"] for c in view["charts"]}
    assert set(HEADLINE) <= tops.keys(), tops
    for key in HEADLINE:
        assert 0 < tops[key] < HEIGHT - 100, (key, tops)  # its plot shows, not only its edge
    # Config and backtest are folds, closed on load; their contents keep their ids.
    assert view["folds"] == [
        {"id": "run-config-fold", "tag": "DETAILS", "open": False},
        {"id": "backtest-fold", "tag": "DETAILS", "open": False},
    ]
    assert not browser.find_element("id", "backtest-rules").is_displayed()
    summary = browser.find_element("css selector", "#backtest-fold > summary")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", summary)
    summary.click()
    wait_until(lambda: browser.find_element("id", "backtest-rules").is_displayed(), message="the backtest fold open")
    browser.find_element("css selector", "#run-config-fold > summary").click()
    wait_until(lambda: '"lr": 1e-06' in text_of(browser, "run-config"), message="the config")
    assert console_errors(browser) == []
    run.close()


def test_plotly_is_fetched_from_the_start_and_once(server, browser) -> None:
    """A page of charts asks for plotly.js as it starts (a preload its head adds), not once its
    first chart mounts after Dash's scripts, layout and first callbacks; the chart then takes
    that very fetch: one request for the bundle, made by the preload. The runs list, which draws
    no chart, asks for none."""
    run = LiveRun(server, "plotly-once", "cispo")
    run.send(_rows(50))
    browser.get(f"{server.url}/runs/{run.id}")
    wait_until(lambda: set(HEADLINE) <= {c["key"] for c in charts(browser) if c["render"]}, 30, message="the headline charts drawn")
    fetched = browser.execute_script(
        "return performance.getEntriesByType('resource').filter(e => e.name.endsWith('/plotly/package_data/plotly.min.js'))"
        ".map(e => [e.initiatorType, e.startTime])"
    )
    first_script = browser.execute_script(
        "return Math.min.apply(null, performance.getEntriesByType('resource').filter(e => e.name.indexOf('/_dash-layout') >= 0).map(e => e.startTime))"
    )
    assert [kind for kind, _ in fetched] == ["link"], fetched
    assert fetched[0][1] < first_script  # asked for before Dash asked for its layout
    assert console_errors(browser) == []
    # The runs list draws no chart: it does not fetch plotly.js at all.
    browser.get(f"{server.url}/")
    wait_until(lambda: browser.execute_script("return document.querySelectorAll('#runs-grid .ag-row').length") > 0, 30, message="the runs table")
    assert browser.execute_script(
        "return performance.getEntriesByType('resource').filter(e => e.name.endsWith('/plotly/package_data/plotly.min.js')).length"
    ) == 0
    run.close()
