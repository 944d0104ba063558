"""The compare page's parity view in headless Chromium: runs streamed over the ingest websocket
with their `mismatch/log_ratio` histograms, the verdict `keel parity` gives (the same code,
wire/parity.py, with the same statement of what was compared and what it could have
detected), progress while it computes, the summed histograms, and the KL chart's healthy band."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import pytest

from tests.support.browser import console_errors, screenshot, text_of, wait_until
from tests.support.step_details import EDGES, histogram
from tests.support.toy_runs import LiveRun
from wire.parity import (
    HISTOGRAM_KEY,
    ParityReport,
    compare,
    compare_groups,
    histogram_values,
    tail_key,
)

STEPS = 40
TOKENS = 600


def _rows(seed: int, *, spread: float, tail: float) -> list[dict[str, Any]]:
    """Per-step rows of a run whose ℓ is a core of width `spread` and a tail of `tail` of its
    tokens at ±1-ish: the mismatch scalars and the histogram come from the same tokens."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(STEPS):
        in_tail = rng.random(TOKENS) < tail
        ell = np.where(in_tail, rng.normal(0.0, 1.0, TOKENS), rng.normal(0.0, spread, TOKENS))
        rows.append({
            "step": step,
            "time": time.time(),
            "values": {
                "mismatch/kl": float(np.mean(np.exp(-ell) - 1 + ell)),
                "mismatch/tail_frac": float(np.mean(np.abs(ell) >= 1)),
                "mismatch/low_tail_frac": float(np.mean(ell <= -1)),
            },
            "histograms": {HISTOGRAM_KEY: {"edges": EDGES, "counts": histogram(ell)}},
        })  # fmt: skip
    return rows


def _stream(server: Any, name: str, group: str, rows: list[dict[str, Any]]) -> LiveRun:
    run = LiveRun(server, name, group)
    run.send(rows)
    return run


def _values(rows: list[dict[str, Any]]) -> dict[str, list[float]]:
    """The per-step values `keel parity` compares, computed here from what was sent."""
    values = {key: [row["values"][key] for row in rows] for key in rows[0]["values"]}
    counts = [row["histograms"][HISTOGRAM_KEY]["counts"] for row in rows]
    shares, _ = histogram_values(EDGES, counts, [0] * len(rows), (0.001, 0.01, 0.1))
    return {**values, **shares}


def _verdict(browser: Any, expected: str) -> dict[str, Any]:
    def shown() -> dict[str, Any] | None:
        found = browser.execute_script(
            """var v = document.getElementById('parity-verdict');
            if (!v) return null;
            var rows = Array.from(document.querySelectorAll('.parity-metric')).map(function (r) {
              return [r.getAttribute('data-key')].concat(Array.from(r.cells).map(function (c) { return c.innerText; }));
            });
            var method = document.getElementById('parity-method');
            return {verdict: v.getAttribute('data-verdict'), text: v.innerText, rows: rows,
                    method: method ? method.innerText : null};"""
        )
        return found if found and found["verdict"] == expected else None

    return wait_until(shown, 40, message=f"parity verdict {expected!r}")  # type: ignore[no-any-return]


def _shows(found: dict[str, Any], expected: ParityReport) -> None:
    """The page's table and method line are the report's, cell for cell."""
    assert found["method"] == f"method: {expected.method}"
    assert {row[0]: row[1:] for row in found["rows"]} == {row[0]: list(row) for row in expected.rows()}


RECORD_PARITY_STATES = """
window.parityStates = [];
function recordParity() {
  var panel = document.getElementById('parity');
  if (!panel) return;
  var text = function (id) { var el = document.getElementById(id); return el ? el.innerText : ''; };
  var value = function (id) { var shown = text(id); return /^(run|group) /m.test(shown) ? shown : ''; };
  var messages = Array.from(panel.querySelectorAll('.annotation-text')).map(function (a) { return a.textContent; });
  window.parityStates.push({a: value('parity-a'), b: value('parity-b'),
    progress: text('parity-progress'), result: text('parity-result'), messages: messages});
}
var watch = {subtree: true, childList: true, characterData: true};
var waiting = new MutationObserver(function () {
  var panel = document.getElementById('parity');
  if (!panel) return;
  waiting.disconnect();  // from now on the panel alone: the charts' redraws are not its states
  recordParity();
  new MutationObserver(recordParity).observe(panel, watch);
});
waiting.observe(document, watch);
"""


def _open_recording_parity(browser: Any, url: str) -> None:
    """Open `url`, recording from its first script on every state of the parity panel: the
    picks, the progress line, the result's text and the charts' messages (a MutationObserver
    on the document, installed before the page's own scripts, so no state is missed however
    soon the comparison starts). A pick shows as its option's label in the dropdown ("run
    base", "group engine-old")."""
    script = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_PARITY_STATES})
    try:
        browser.get(url)
    finally:
        browser.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": script["identifier"]})


def _figure_meta(browser: Any, graph_id: str) -> dict[str, Any] | None:
    return browser.execute_script(  # type: ignore[no-any-return]
        "var gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot') || document.getElementById(arguments[0]);"
        "return gd && gd.layout && gd.layout.meta && gd.layout.meta.chart ? gd.layout.meta : null;",
        graph_id,
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_parity_view_gives_keel_parity_s_verdict_on_runs_and_groups(server, browser, artifacts) -> None:
    base_rows = _rows(1, spread=0.01, tail=0.01)
    twin_rows = _rows(2, spread=0.01, tail=0.01)
    wide_rows = _rows(3, spread=0.03, tail=0.05)
    base = _stream(server, "base", "engine-old", base_rows)
    twin = _stream(server, "twin", "engine-old", twin_rows)
    wide = _stream(server, "wide", "engine-new", wide_rows)

    # Two runs alike: the first two runs are A and B at first (the page shows one group each
    # for two runs only when they are in two groups: these share one).
    _open_recording_parity(browser, f"{server.url}/compare?runs={base.id},{twin.id}")
    same = _verdict(browser, "same")
    expected = compare(_values(base_rows), _values(twin_rows))
    assert expected.verdict == "same"
    assert same["text"].startswith("Same") and "SAME (base vs twin)" in same["text"]
    _shows(same, expected)
    assert same["method"].startswith("method: one run a side, each cut into") and "detects" in text_of(browser, "parity-result")
    # While A and B are picked the panel never asks to pick them: it says it is comparing.
    states = browser.execute_script("return window.parityStates;")
    picked = [state for state in states if state["a"] and state["b"]]
    assert picked and not [state for state in picked if "Pick A and B" in state["result"] + " ".join(state["messages"])]
    assert any(state["progress"].startswith("Comparing A and B") for state in states)
    assert browser.find_element("id", "parity-progress").text == ""
    overlay = wait_until(lambda: _figure_meta(browser, "parity-overlay"), 20, message="overlay drawn")
    assert overlay["totals"] == [STEPS * TOKENS, STEPS * TOKENS]  # every token of every step, summed
    summed_a = [sum(row["histograms"][HISTOGRAM_KEY]["counts"][i] for row in base_rows) for i in range(len(EDGES) - 1)]
    assert overlay["counts"][0] == summed_a[overlay["first_bin"] : overlay["first_bin"] + len(overlay["counts"][0])]
    difference = wait_until(lambda: _figure_meta(browser, "parity-difference"), 20, message="difference drawn")
    summed_b = [sum(row["histograms"][HISTOGRAM_KEY]["counts"][i] for row in twin_rows) for i in range(len(EDGES) - 1)]
    per_bin = [b / sum(summed_b) - a / sum(summed_a) for a, b in zip(summed_a, summed_b, strict=True)]
    low = difference["first_bin"]
    assert difference["difference"] == pytest.approx(per_bin[low : low + len(difference["difference"])])
    assert sum(abs(d) for d in difference["difference"]) == pytest.approx(sum(abs(d) for d in per_bin))
    tails = wait_until(lambda: _figure_meta(browser, "parity-tails"), 20, message="tails drawn")
    assert tails["lines"] == ["A base", "A base (low)", "B twin", "B twin (low)"]

    # A run with a wider core and five times the tail: different, and the view says which
    # metrics and by how much, as `keel parity` does.
    browser.get(f"{server.url}/compare?runs={base.id},{wide.id}")
    different = _verdict(browser, "different")
    expected = compare(_values(base_rows), _values(wide_rows))
    assert expected.verdict == "different"
    assert different["text"].startswith("Different") and expected.summary().replace("A vs B", "base vs wide") in different["text"]
    _shows(different, expected)
    differing = {row[0] for row in different["rows"] if row[-1] == "differs"}
    assert {"mismatch/kl", tail_key(0.1, low=False)} <= differing

    # Groups: the old engine's two runs (two seeds) against the new engine's one, picked by
    # default (the runs are in two groups); the last 2 steps are too few to decide.
    browser.get(f"{server.url}/compare?runs={base.id},{twin.id},{wide.id}")
    expected = compare_groups([_values(base_rows), _values(twin_rows)], [_values(wide_rows)])
    grouped = _verdict(browser, expected.verdict)
    assert f"{expected.verdict.upper()} (group engine-old vs group engine-new)" in grouped["text"]
    assert grouped["method"].startswith("method: 2 run(s) against 1")
    assert {row[0]: row[2] for row in grouped["rows"]}["mismatch/kl"] == f"{STEPS * 2}/{STEPS}"
    _shows(grouped, expected)
    screenshot(browser, artifacts / "compare_parity.png")
    box = browser.find_element("id", "parity-from")
    box.send_keys(f"{STEPS - 2}\n")
    cannot = _verdict(browser, "incomparable")
    assert cannot["text"].startswith("Cannot compare") and "INCOMPARABLE" in cannot["text"]
    assert "fewer than 4 blocks of 3: not tested" in text_of(browser, "parity-result")
    assert console_errors(browser) == []
    for run in (base, twin, wide):
        run.close()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_kl_chart_shades_the_healthy_band_a_user_picks(server, browser) -> None:
    run = _stream(server, "base", "engine-old", _rows(1, spread=0.01, tail=0.01))
    browser.get(f"{server.url}/runs/{run.id}")

    def band() -> Any:
        return browser.execute_script(
            """var gd = Array.from(document.querySelectorAll('.keel-graph .js-plotly-plot')).find(function (g) {
                 return g.layout && g.layout.meta && g.layout.meta.key === 'mismatch/kl'; });
               if (!gd || !gd.layout.meta.render_id) return null;
               var shape = (gd.layout.shapes || []).find(function (s) { return s.name === 'band'; });
               var box = gd.querySelector('.shapelayer path');
               return {band: gd.layout.meta.band, shape: shape ? [shape.y0, shape.y1] : null,
                       top: shape ? gd._fullLayout.yaxis.d2p(shape.y1) + gd._fullLayout._size.t : null,
                       drawn: box ? box.getBoundingClientRect().top - gd.getBoundingClientRect().top : null};"""
        )

    first = wait_until(band, 30, message="the KL chart drawn")
    assert first["band"] is None and first["shape"] is None
    browser.find_element("css selector", "#opt-kl-band input[value='dense']").click()
    dense = wait_until(lambda: (b := band()) and b["band"] and b, 20, message="dense band")
    assert dense["band"] == ["dense model", 1e-5, 1e-3] and dense["shape"] == [1e-5, 1e-3]
    # Drawn where the log axis has 1e-3 (Plotly places a shape by its data value on a log axis).
    assert math.isclose(dense["drawn"], dense["top"], abs_tol=2)
    browser.find_element("css selector", "#opt-kl-band input[value='moe']").click()
    moe = wait_until(lambda: (b := band()) and b["band"] and b["band"][0] == "MoE" and b, 20, message="MoE band")
    assert moe["shape"] == [1e-3, 1e-1]
    # The other charts have no band.
    others = browser.execute_script(
        "return Array.from(document.querySelectorAll('.keel-graph .js-plotly-plot')).filter(function (g) {"
        " return g.layout.meta.key !== 'mismatch/kl'; }).map(function (g) { return (g.layout.shapes || []).filter("
        " function (s) { return s.name === 'band'; }).length; });"
    )
    assert others and set(others) == {0}
    assert console_errors(browser) == []
    run.close()
