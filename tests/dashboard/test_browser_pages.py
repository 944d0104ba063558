"""The pages as a newcomer first reads them, in a real headless Chromium against a real server:
whole run names with the name on hover, a compare summary that shows its runs at once and its
numbers while they stream, step axes that follow the data alike on every chart, one line of
what healthy looks like under each headline chart, a metric the run's loss does not use said
in words, and an alerts panel that wraps whole words."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from dashboard.figures import x_axis_end
from dashboard.theme import HAZARD_HEALTHY, HEADLINE_KEYS, HEALTHY
from tests.support.browser import (
    console_errors,
    drawn_charts,
    live_state,
    screenshot,
    set_viewport,
    text_of,
    wait_until,
)
from tests.support.toy_runs import LiveRun, toy_values

pytestmark = [pytest.mark.browser, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]

# Three seeds of one arm: cut to 26 characters they read the same ("importance_sampling-lag8-se…").
SEEDS = [f"importance_sampling-lag8-seed{seed}-bf16-sampler" for seed in range(3)]
LOSS = "importance_sampling"  # gates nothing: its gate/frac is 0 at every step
HISTORY = 60

NAME_CELLS_JS = """
return Array.from(document.querySelectorAll('#' + arguments[0] + ' .ag-cell.cell-name')).map(function (cell) {
  return {text: cell.innerText.trim(), title: cell.getAttribute('title'), wraps: cell.scrollWidth <= cell.clientWidth + 1};
});
"""

BELOW_CAME_JS = """
// Whether every headline chart had its figure when the summary and the parity view came.
window.keelBelowCame = {};
new MutationObserver(function () {
  ['compare-summary', 'parity'].forEach(function (id) {
    if (id in window.keelBelowCame || !document.getElementById(id)) return;
    var plots = Array.from(document.querySelectorAll('.chart-card[data-key] .js-plotly-plot')).filter(function (gd) {
      return HEADLINE.indexOf(gd.closest('.chart-card').getAttribute('data-key')) >= 0;
    });
    window.keelBelowCame[id] = {charts: plots.length, drawn: plots.filter(function (gd) {
      return gd.layout && gd.layout.meta && gd.layout.meta.render_id;
    }).length};
  });
}).observe(document, {childList: true, subtree: true});
"""

# Counts the "drawn" ticks the page sends from now on (assets/live/socket.js sets the store
# through dash_clientside.set_props, looked up at each call).
DRAWN_TICKS_JS = """
window.keelDrawnTicks = 0;
var setProps = window.dash_clientside.set_props;
window.dash_clientside.set_props = function (id, props) {
  if (id === 'live-data-tick' && ((props.data || {}).reasons || []).indexOf('drawn') >= 0) window.keelDrawnTicks += 1;
  return setProps.apply(this, arguments);
};
"""

X_RANGES_JS = """
return Array.from(document.querySelectorAll('.keel-graph .js-plotly-plot, .hazard-graph .js-plotly-plot')).map(function (gd) {
  var meta = (gd.layout && gd.layout.meta) || {};
  var last = -Infinity;
  (gd.data || []).forEach(function (t) {
    if (t.x && t.x.length && (t.yaxis || 'y') === 'y') last = Math.max(last, t.x[t.x.length - 1]);
  });
  return {key: meta.key || meta.chart || null, range: gd._fullLayout.xaxis.range.slice(), last: last};
});
"""

CAPTIONS_JS = """
return Array.from(document.querySelectorAll('.chart-card')).filter(function (card) {
  return !card.closest('#parity');
}).map(function (card) {
  var caption = card.querySelector('.chart-caption');
  return [card.getAttribute('data-key') || 'hazard', caption ? caption.innerText : null];
});
"""

# Each word of the alerts table, as the browser lays it out: a word broken over two lines has
# line boxes at two heights.
BROKEN_WORDS_JS = """
var broken = [], words = 0;
var walker = document.createTreeWalker(document.querySelector('#run-alerts table'), NodeFilter.SHOW_TEXT);
for (var node = walker.nextNode(); node; node = walker.nextNode()) {
  var re = /\\S+/g, m;
  while ((m = re.exec(node.data))) {
    var range = document.createRange();
    range.setStart(node, m.index);
    range.setEnd(node, m.index + m[0].length);
    var tops = Array.from(range.getClientRects()).map(function (r) { return Math.round(r.top); });
    words += 1;
    if (new Set(tops).size > 1) broken.push(m[0]);
  }
}
return {words: words, broken: broken};
"""


def _is_values(step: int, seed: int) -> dict[str, Any]:
    return {**toy_values(step, seed), "gate/frac": 0.0}


def _stream(runs: list[LiveRun], first: int, stop: threading.Event, period_s: float = 0.25) -> list[int]:
    """Send a step to every run each period until `stop`; the last step sent, in a list (the
    thread's result)."""
    sent = [first - 1]
    step = first
    while not stop.is_set():
        for run in runs:
            run.send([{"step": step, "values": _is_values(step, run.seed)}])
        sent[0] = step
        step += 1
        time.sleep(period_s)
    return sent


def _name_cells(browser: Any, grid_id: str, count: int) -> list[dict[str, Any]]:
    return wait_until(  # type: ignore[no-any-return]
        lambda: (lambda cells: cells if len(cells) == count and all(c["text"] for c in cells) else None)(
            browser.execute_script(NAME_CELLS_JS, grid_id)
        ),
        message=f"{count} names in {grid_id}",
    )


def _assert_whole_names(cells: list[dict[str, Any]], names: list[str]) -> None:
    assert sorted(c["text"].replace("\n", "") for c in cells) == sorted(names)  # wrapped, never cut
    assert sorted(c["title"] for c in cells) == sorted(names)  # the whole name on hover
    assert all(c["wraps"] for c in cells), cells  # nothing hidden past the cell's edge


@pytest.mark.slow
def test_a_newcomer_reads_whole_names_a_summary_that_fills_and_charts_that_keep_up(server, browser, artifacts) -> None:
    runs = [LiveRun(server, name, LOSS, seed=seed, config={"loss": LOSS}) for seed, name in enumerate(SEEDS)]
    for run in runs:
        run.send([{"step": s, "values": _is_values(s, run.seed)} for s in range(HISTORY)])

    # The runs table: three whole names, each with its title.
    browser.get(f"{server.url}/")
    _assert_whole_names(_name_cells(browser, "runs-grid", 3), SEEDS)

    # The compare page: the summary names its runs and says what it waits for, once the
    # headline charts are drawn: the grid and the parity view come after them, never holding
    # back their first draw. (Every chart in view: a chart scrolled out of view draws nothing
    # until seen.)
    set_viewport(browser, 1280, 2400)
    source = f"var HEADLINE = {json.dumps(list(HEADLINE_KEYS))};{BELOW_CAME_JS}"
    script = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": source})
    try:
        browser.get(f"{server.url}/compare?runs={','.join(run.id for run in runs)}")
        opened = time.monotonic()
        _assert_whole_names(_name_cells(browser, "compare-summary", 3), SEEDS)
    finally:
        browser.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": script["identifier"]})
    assert time.monotonic() - opened < 15
    came = wait_until(lambda: (lambda c: c if len(c) == 2 else None)(browser.execute_script("return window.keelBelowCame")),
                      message="the summary and the parity view")  # fmt: skip
    assert came == {"compare-summary": {"charts": 5, "drawn": 5}, "parity": {"charts": 5, "drawn": 5}}, came
    chips = browser.execute_script("return Array.from(document.querySelectorAll('#compare-chips .chip')).map(c => c.title)")
    assert sorted(chips) == sorted(SEEDS)

    drawn_charts(browser, 6)
    wait_until(lambda: live_state(browser) == "live", message="live websocket")
    stop = threading.Event()
    result: list[int] = []
    streamer = threading.Thread(target=lambda: result.extend(_stream(runs, HISTORY, stop)), daemon=True)
    streamer.start()
    try:
        # While the runs stream, the summary's numbers come (the status line clears).
        wait_until(
            lambda: text_of(browser, "compare-summary-status") == ""
            and browser.execute_script(
                "return Array.from(document.querySelectorAll('#compare-summary .ag-cell[col-id=final_reward]'))"
                ".filter(c => c.innerText.trim()).length"
            )
            == 3,
            timeout=30,
            message="the summary's numbers while the runs stream",
        )
        time.sleep(6)  # long enough for the step axes to be widened at least once
    finally:
        stop.set()
        streamer.join(timeout=10)
    last = result[0]

    # Every chart's step axis reaches past the last point sent, and they all end at one step
    # (the gated fraction draws no line: it says its loss gates nothing, below).
    def followed() -> list[dict[str, Any]] | None:
        ranges = [r for r in browser.execute_script(X_RANGES_JS) if r["last"] is not None]
        metric = [r for r in ranges if r["key"] != "hazard"]
        if all(r["last"] >= last for r in metric) and len({r["range"][1] for r in ranges}) == 1:
            return ranges  # type: ignore[no-any-return]
        return None

    ranges = wait_until(followed, timeout=30, message=f"every chart's x axis past step {last}, alike")
    end = ranges[0]["range"][1]
    assert last < end <= x_axis_end(0, last + 200), ranges  # room for what comes, not a runaway axis
    assert {r["key"] for r in ranges} == {*HEADLINE_KEYS, "policy/entropy", "hazard"} - {"gate/frac"}

    # A line of what healthy looks like under each headline chart and the hazard.
    captions = dict(browser.execute_script(CAPTIONS_JS))
    for key in HEADLINE_KEYS:
        assert captions[key] == HEALTHY[key], key
    assert captions["hazard"] == HAZARD_HEALTHY

    # The gated fraction of a loss that gates nothing: said in words, no flat line.
    gate = next(
        c for c in browser.execute_script(
            "return Array.from(document.querySelectorAll('.keel-graph .js-plotly-plot')).map(function (gd) {"
            "  return {key: gd.layout.meta.key, unused: gd.layout.meta.unused,"
            "          raw: gd.data.filter(t => (t.meta || {}).role === 'raw').length,"
            "          notes: Array.from(gd.querySelectorAll('.annotation-text')).map(t => t.textContent)}; })"
        )
        if c["key"] == "gate/frac"
    )
    assert gate["raw"] == 0 and sorted(gate["unused"]) == sorted(run.id for run in runs)
    assert gate["notes"] == [f"not used by {LOSS} ({', '.join(SEEDS)}): 0 at every step (it gated nothing)"]
    assert console_errors(browser) == []
    screenshot(browser, artifacts / "compare-first-ten-minutes.png")

    # To the runs table and back through the browser's history (no reload): the compare page
    # is built again, and its summary and parity view come again once its charts are drawn.
    # The runs table has no chart: nothing is "drawn" there (the compare page's charts, still
    # on screen for a moment after the URL changed, are not that page's).
    browser.execute_script(DRAWN_TICKS_JS)
    browser.find_element("css selector", ".keel-nav a[href='/']").click()
    _name_cells(browser, "runs-grid", 3)
    assert browser.execute_script("return !document.getElementById('compare-summary')")
    time.sleep(1)
    assert browser.execute_script("return window.keelDrawnTicks") == 0
    browser.back()
    _assert_whole_names(_name_cells(browser, "compare-summary", 3), SEEDS)
    assert browser.execute_script("return window.keelDrawnTicks") == 1  # no reload: the count goes on
    wait_until(lambda: browser.execute_script("return !!document.getElementById('parity')"),
               message="the parity view, again")  # fmt: skip
    for run in runs:
        run.close()


def test_the_alerts_panel_wraps_whole_words(server, browser, artifacts) -> None:
    run = LiveRun(server, SEEDS[0], LOSS, config={"loss": LOSS})
    run.send([{"step": s, "values": toy_values(s, 0)} for s in range(40)])
    run.send([{"step": 40, "values": {**toy_values(40, 0), "mismatch/kl": "nan", "grad/norm": "inf"}}])
    run.send([{"step": s, "values": toy_values(s, 0)} for s in range(41, 60)])
    set_viewport(browser, 1100, 900)  # the alerts panel a half of a narrow page
    browser.get(f"{server.url}/runs/{run.id}")
    wait_until(lambda: "non-finite" in text_of(browser, "run-alerts"), message="the alert")
    laid_out = browser.execute_script(BROKEN_WORDS_JS)
    assert laid_out["words"] >= 10, laid_out
    assert laid_out["broken"] == []  # no "resolv|ed", "mismat|ch/kl", "toke|ns"
    wraps = browser.execute_script(
        "return Array.from(document.querySelectorAll('#run-alerts td')).map(td => getComputedStyle(td).overflowWrap)"
    )
    assert wraps and set(wraps) == {"break-word"}
    # The run page names the run whole.
    assert SEEDS[0] in text_of(browser, "run-header")
    assert console_errors(browser) == []
    screenshot(browser, artifacts / "run-alerts-words.png", full_page=False)
    run.close()
