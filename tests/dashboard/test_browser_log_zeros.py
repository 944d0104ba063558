"""Zeros on a log axis in headless Chromium: the history the server draws and the points the
live updater appends (assets/live/math.js logFloor/aboveFloor, charts.js) agree: zeros
are open circles at the bottom edge with hover "0", the smoothed line stops at its floor."""

from __future__ import annotations

from typing import Any

import pytest

from dashboard.series import ema
from dashboard.traces import EDGE_Y, LOG_FLOOR
from tests.support.browser import (
    charts,
    console_errors,
    drawn_charts,
    live_state,
    set_viewport,
    wait_until,
)
from tests.support.toy_runs import LiveRun

pytestmark = [
    pytest.mark.browser,
    pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
]

KEY = "mismatch/tail_frac"
HISTORY = [1e-3] * 10 + [0.0] * 40 + [2e-3] * 10
LIVE = [0.0] * 40 + [-0.25] + [3e-3] * 20
SMOOTHING = 0.6  # components.INITIAL_SMOOTHING

MARKS_JS = """
var key = arguments[0];
var gd = Array.from(document.querySelectorAll('.keel-graph .js-plotly-plot')).find(function (g) {
  return g.layout && g.layout.meta && g.layout.meta.key === key;
});
if (!gd) return null;
var t = gd.data.find(function (d) { return d.meta && d.meta.role === 'nonfinite'; });
var s = gd.data.find(function (d) { return d.meta && d.meta.role === 'smooth'; });
return {render: gd.layout.meta.render_id, axis: gd.layout.yaxis.type, x: Array.from(t.x), y: Array.from(t.y),
        text: Array.from(t.text), symbol: Array.from(t.marker.symbol), floor: s ? s.meta.floor : null};
"""


def _chart(browser: Any) -> dict[str, Any]:
    return next(c for c in charts(browser) if c["key"] == KEY)


def _smooth(chart: dict[str, Any]) -> dict[str, Any]:
    return next(t for t in chart["traces"] if t["role"] == "smooth")


def test_zeros_on_a_log_axis_are_marked_and_the_smoothed_line_stops_at_its_floor(server, browser) -> None:
    run = LiveRun(server, "tails", "cispo")
    run.send([{"step": s, "values": {KEY: v}} for s, v in enumerate(HISTORY)])
    set_viewport(browser, 1280, 2400)
    browser.get(f"{server.url}/runs/{run.id}")
    drawn_charts(browser, 1)
    floor = LOG_FLOOR * 1e-3
    marks = browser.execute_script(MARKS_JS, KEY)
    assert marks["axis"] == "log" and marks["floor"] == pytest.approx(floor)
    zeros = [s for s, v in enumerate(HISTORY) if v == 0]
    assert marks["x"] == zeros and set(marks["y"]) == {EDGE_Y["zero"]} and set(marks["text"]) == {"0"}
    smooth = _smooth(_chart(browser))
    assert all(y is None or y >= floor for y in smooth["y"])
    assert any(y is None for y in smooth["y"][10:50]) and smooth["y"][-1] is not None

    wait_until(lambda: live_state(browser) == "live", message="live websocket")
    start = len(HISTORY)
    run.send([{"step": start + k, "values": {KEY: v}} for k, v in enumerate(LIVE)])
    last = start + len(LIVE) - 1

    def appended() -> dict[str, Any] | None:
        m = browser.execute_script(MARKS_JS, KEY)
        return m if m and start + 40 in m["x"] and last in _smooth(_chart(browser))["x"] else None

    after = wait_until(appended, 15, message="the live zeros appended")
    assert after["render"] == marks["render"]  # appended, not redrawn
    live_zeros = [start + k for k, v in enumerate(LIVE) if v <= 0]
    assert after["x"] == zeros + live_zeros
    assert after["text"] == ["0"] * (len(zeros) + 40) + ["-0.25 (≤ 0)"]
    # The live smoothed points are the server's rule on the same values: gaps below the floor.
    expected = [v if v is not None and v >= floor else None for v in ema(HISTORY + LIVE, SMOOTHING)[0]]
    drawn = _smooth(_chart(browser))["y"]
    live_drawn = drawn[len(drawn) - len(LIVE):]
    want = expected[start:]
    assert [y is None for y in live_drawn] == [y is None for y in want], (live_drawn, want)
    assert all(a is None or a == pytest.approx(b, rel=1e-9) for a, b in zip(live_drawn, want, strict=True))
    assert live_drawn[-1] is not None and any(y is None for y in live_drawn)
    assert console_errors(browser) == []
    run.close()
