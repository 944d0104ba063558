"""What a trainer sends is text on every page: markup planted in a metric key, a run's name,
group, tags and config, a sample's tokens and (through a key) an alert's message shows as the
characters sent, in headless Chromium against a real server, and never becomes an element.

Plotly renders a subset of HTML in chart titles, axis titles, annotations, legend names and
hover text (<a href> a link, <span style> any look, <br> a line break) and fills `%{...}`
in them from the figure: dashboard.text.plot_text turns a trainer's string into text there.
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from tests.support.browser import (
    charts,
    console_errors,
    drawn_charts,
    hazard_chart,
    screenshot,
    text_of,
    wait_until,
)
from tests.support.raw_client import hello, new_run, open_ingest
from tests.support.step_details import sample
from tests.support.toy_runs import HEADLINE, toy_values

pytestmark = [pytest.mark.browser, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]

KEY = 'probe/<a href="https://evil.example/key">key-link</a>'
TEMPLATE_KEY = "probe/%{x} 100%{meta.key}<br>next"
"""Plotly fills %{...} in titles and names from the figure, and breaks lines at <br>."""
ALERT_KEY = 'loss/<a href="https://evil.example/alert">alert-link</a>'
"""A loss key the default "non-finite value" rule watches (loss/*): its message names the key."""
NAME = '<span style="color:red;font-size:40px">run-big</span> & %{y}'
OTHER = "<b>second</b> run"
GROUP = "<a href='https://evil.example/group'>group-link</a>"
TAG = '<a href="https://evil.example/tag">tag-link</a>'
CONFIG = "<a href='https://evil.example/config'>config-link</a>"
TOKEN = '<a href="https://evil.example/token">token-link</a>'
STEPS = 40
NAN_STEP = 10

# Any element the planted markup would make: a link to evil.example, or a 40 px style.
INJECTED_JS = """
var found = [];
document.querySelectorAll('*').forEach(function (e) {
  Array.from(e.attributes).forEach(function (a) {
    var link = a.localName === 'href' && a.value.indexOf('evil.example') >= 0;
    var look = a.localName === 'style' && /font-size:\\s*40px|color:\\s*red/.test(a.value);
    if (link || look) found.push(e.tagName + ' ' + a.name + '=' + a.value);
  });
});
return found;
"""

# The texts a chart shows: its title, axis titles and notes, and the hover labels, as drawn.
CHART_TEXT_JS = """
var key = arguments[0];
var gd = Array.from(document.querySelectorAll('.keel-graph .js-plotly-plot')).find(function (g) {
  return g.layout && g.layout.meta && g.layout.meta.key === key;
});
if (!gd) return null;
var text = function (selector) {
  return Array.from(gd.querySelectorAll(selector)).map(function (e) { return e.textContent; });
};
return {title: text('.gtitle'), ytitle: text('.ytitle'), notes: text('.annotation-text')};
"""

# Hover every trace of a chart at step `x` (x unified: one label naming each trace) and
# return the hover layer's text.
HOVER_JS = """
var gd = arguments[0], x = arguments[1];
window.Plotly.Fx.hover(gd, {xval: x}, 'xy');
var layer = gd.querySelector('.hoverlayer');
return layer ? layer.textContent : '';
"""


def _graph(browser: Any, key: str) -> Any:
    return browser.execute_script(
        "var key = arguments[0];"
        "return Array.from(document.querySelectorAll('.keel-graph .js-plotly-plot')).find(function (g) {"
        "  return g.layout && g.layout.meta && g.layout.meta.key === key; })",
        key,
    )


def _hover(browser: Any, plot: Any, x: float) -> str:
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", plot)
    return str(browser.execute_script(HOVER_JS, plot, x))


def _click(browser: Any, selector: str) -> None:
    """Click an element in the middle of the window (not under the page's sticky header)."""
    element = browser.find_element("css selector", selector)
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    element.click()


def _no_markup(browser: Any, page: str) -> None:
    found = browser.execute_script(INJECTED_JS)
    assert found == [], f"{page}: markup a trainer sent became elements: {found}"


class _Run:
    """A run created over the ingest websocket (name, group, tags, config as given), its
    points (the headline metrics and the planted keys) and samples sent over REST."""

    def __init__(self, server: Any, name: str, group: str, seed: int, *, token: str | None = None):
        self.run = new_run(name, group=group, tags=[TAG, "toy"], config={"seed": seed, "note": CONFIG})
        self.id: str = self.run["id"]
        self._stack = ExitStack()
        hello(self._stack.enter_context(open_ingest(server)), self.run)
        rows = []
        for step in range(STEPS):
            values: dict[str, Any] = {**toy_values(step, seed), KEY: 0.5 + step / 100, TEMPLATE_KEY: 1.0 + step}
            values[ALERT_KEY] = "nan" if step == NAN_STEP else 0.1
            row: dict[str, Any] = {"step": step, "time": time.time(), "values": values}
            if token is not None and step % 10 == 0:
                import numpy as np

                planted = sample(0, step, np.random.default_rng(step), worst_ell=3.0)
                planted["tokens"][3] = token
                planted["seq_id"] = token
                row["samples"] = [planted]
            rows.append(row)
        for first in range(0, len(rows), 20):
            response = httpx.post(
                f"{server.url}/api/v1/runs/{self.id}/points", json={"rows": rows[first : first + 20]}, timeout=60
            )
            assert response.status_code == 200, response.text

    def close(self) -> None:
        self._stack.close()


@pytest.mark.slow
def test_markup_a_trainer_sends_is_text_on_every_page(server, browser, artifacts) -> None:
    first = _Run(server, NAME, GROUP, 0, token=TOKEN)
    second = _Run(server, OTHER, GROUP, 1)
    keys = {*HEADLINE, "policy/entropy", KEY, TEMPLATE_KEY, ALERT_KEY}

    # The runs table: name (a markdown link cell), group and tags as sent; the filters too.
    browser.get(f"{server.url}/")
    wait_until(lambda: NAME in text_of(browser, "runs-grid"), 30, message="runs table")
    grid = text_of(browser, "runs-grid")
    assert GROUP in grid and TAG in grid and OTHER in grid
    _click(browser, "#filter-group")
    wait_until(
        lambda: browser.find_elements("xpath", "//*[@role='option'][contains(., 'group-link')]"),
        message="the group filter's options",
    )
    options = [e.text for e in browser.find_elements("xpath", "//*[@role='option']")]
    assert GROUP in options, options
    _no_markup(browser, "runs")

    # The run page: header, overview, config, alerts table, every chart, the token view.
    browser.get(f"{server.url}/runs/{first.id}")
    wait_until(lambda: NAME in text_of(browser, "run-header"), 30, message="run header")
    assert f"group {GROUP}" in text_of(browser, "run-header")
    assert TAG in text_of(browser, "run-overview")
    browser.execute_script("document.getElementById('run-config-fold').open = true")  # folded on load
    assert json.loads(text_of(browser, "run-config"))["note"] == CONFIG
    message = f"non-finite {ALERT_KEY}=nan at step {NAN_STEP}"
    wait_until(lambda: message in text_of(browser, "run-alerts"), 30, message="the non-finite alert")
    drawn_charts(browser, len(keys), timeout=60)
    for key in (KEY, TEMPLATE_KEY, ALERT_KEY):
        shown = browser.execute_script(CHART_TEXT_JS, key)
        assert shown["title"] == [key], (key, shown)
        assert shown["ytitle"] == [key.rsplit("/", 1)[-1]], (key, shown)
    hover = _hover(browser, _graph(browser, "reward/mean"), 20)
    assert NAME in hover, hover
    # The alert's diamond on its metric's chart: its hover says the rule, run and message.
    hover = _hover(browser, _graph(browser, ALERT_KEY), NAN_STEP)
    assert message in hover and f"non-finite value · {NAME}" in hover, hover
    wait_until(lambda: "step 30" in text_of(browser, "tokens-caption"), 40, message="token view")
    tokens = [t.get_attribute("textContent") for t in browser.find_elements("css selector", "#tokens-view .tok")]
    assert TOKEN in tokens, tokens
    assert f"seq {TOKEN}" in browser.find_element("css selector", "#tokens-view .sample-head").text
    hazard = wait_until(lambda: hazard_chart(browser), 30, message="hazard chart")
    assert [t["name"] for t in hazard["traces"]]  # drawn (its names: hovered on the compare page)
    _no_markup(browser, "run")
    screenshot(browser, artifacts / "markup_run_page.png")

    # The compare page: chips, summary, charts (group means), the hazard, the metric picker.
    browser.get(f"{server.url}/compare?runs={first.id},{second.id}")
    wait_until(lambda: NAME in text_of(browser, "compare-chips"), 30, message="compare chips")
    assert GROUP in text_of(browser, "compare-chips") and OTHER in text_of(browser, "compare-chips")
    wait_until(lambda: NAME in text_of(browser, "compare-summary"), 30, message="compare summary")
    drawn_charts(browser, len(HEADLINE) + 1)  # and the entropy, with each run's learned level named
    hover = _hover(browser, _graph(browser, "reward/mean"), 20)
    assert NAME in hover and OTHER in hover, hover
    plot = browser.find_element("css selector", ".hazard-graph .js-plotly-plot")
    wait_until(lambda: hazard_chart(browser), 30, message="hazard chart")
    hover = _hover(browser, plot, STEPS - 1)
    assert NAME in hover and OTHER in hover, hover
    _click(browser, "#opt-aggregate input[value='std']")
    wait_until(
        lambda: any(t["role"] == "mean" for c in charts(browser) if c["key"] == "reward/mean" for t in c["traces"]),
        30,
        message="group means",
    )
    hover = _hover(browser, _graph(browser, "reward/mean"), 20)
    assert f"{GROUP} (n=2)" in hover, hover
    _no_markup(browser, "compare, group means")
    _click(browser, "#opt-metrics")
    option = wait_until(
        lambda: next(iter(browser.find_elements("xpath", "//*[@role='option'][contains(., 'key-link')]")), None),
        message="the planted key in the metric picker",
    )
    assert option.text == KEY
    option.click()
    assert drawn_charts(browser, len(HEADLINE) + 2)[-1]["key"] == KEY
    assert browser.execute_script(CHART_TEXT_JS, KEY)["title"] == [KEY]
    _no_markup(browser, "compare")
    assert console_errors(browser) == []
    first.close()
    second.close()
