"""The live overlay in a real headless Chromium: a pushed point is painted over the chart at
once, where Plotly draws it later, and a point the axes cannot place is drawn at once.

The overlay (assets/live/overlay.js) is a canvas over the plot: the test keeps a copy of it
while the figure does not hold the step yet, then reads where Plotly's own SVG path puts
that step once the figure took it in, and looks at the copy there.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.support.browser import (
    console_errors,
    drawn_charts,
    live_state,
    live_stats,
    screenshot,
    wait_until,
)
from tests.support.toy_runs import LiveRun

pytestmark = [
    pytest.mark.browser,
    pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
]

KEY = "reward/mean"
CHART_JS = """
var key = arguments[0];
return Array.from(document.querySelectorAll('.keel-graph .js-plotly-plot')).find(function (g) {
  return g.layout && g.layout.meta && g.layout.meta.key === key;
});
"""

# Keep a copy of the overlay canvas each frame while the figure does not hold `step` yet and
# the canvas shows something (the last such copy is what the reader saw before the redraw).
WATCH_JS = (
    CHART_JS.replace("return Array", "var gd = Array")
    + """
var step = arguments[1];
window.keelTailCopy = null;
function painted(canvas) {
  var data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  for (var i = 3; i < data.length; i += 4) if (data[i]) return true;
  return false;
}
function look() {
  var smooth = gd.data.find(function (t) { return t.meta && t.meta.role === 'smooth'; });
  if (smooth.x.indexOf(step) >= 0) return;
  var canvas = gd.querySelector('canvas.keel-overlay');
  if (canvas && canvas.width && painted(canvas)) {
    var copy = document.createElement('canvas');
    copy.width = canvas.width;
    copy.height = canvas.height;
    copy.getContext('2d').drawImage(canvas, 0, 0);
    window.keelTailCopy = {canvas: copy, ratio: canvas.width / gd._fullLayout.width};
  }
  requestAnimationFrame(look);
}
requestAnimationFrame(look);
"""
)

# Where the figure draws `step` on the smoothed line (its SVG path's vertex, in page pixels
# of the chart), the colour of that line, and what the kept overlay copy shows around there.
SAMPLE_JS = (
    CHART_JS.replace("return Array", "var gd = Array")
    + """
var step = arguments[1];
var index = gd.data.findIndex(function (t) { return t.meta && t.meta.role === 'smooth'; });
var trace = gd.data[index];
var paths = gd.querySelectorAll('.subplot.xy .scatterlayer .trace');
var d = paths[index].querySelector('.js-line').getAttribute('d');
var vertices = d.match(/-?[\\d.]+(?:e[-+]?\\d+)?,-?[\\d.]+(?:e[-+]?\\d+)?/g);
var last = vertices[vertices.length - 1].split(',').map(Number);
var size = gd._fullLayout._size;
var x = size.l + last[0], y = size.t + last[1];
var copy = window.keelTailCopy;
var best = null;
if (copy) {
  var context = copy.canvas.getContext('2d');
  for (var dx = -2; dx <= 2; dx++) for (var dy = -2; dy <= 2; dy++) {
    var px = context.getImageData(Math.round((x + dx) * copy.ratio), Math.round((y + dy) * copy.ratio), 1, 1).data;
    if (!best || px[3] > best[3]) best = Array.from(px);
  }
}
var right = null; // the rightmost column the overlay painted (where its lines end)
if (copy) {
  var all = copy.canvas.getContext('2d').getImageData(0, 0, copy.canvas.width, copy.canvas.height);
  for (var k = 3; k < all.data.length; k += 4) {
    if (all.data[k]) right = Math.max(right === null ? 0 : right, ((k - 3) / 4) % all.width);
  }
  if (right !== null) right = right / copy.ratio;
}
var live = gd.querySelector('canvas.keel-overlay');
var left = live ? live.getContext('2d').getImageData(0, 0, live.width, live.height).data : [];
var stillPainted = false;
for (var i = 3; i < left.length; i += 4) if (left[i]) { stillPainted = true; break; }
return {last_x: trace.x[trace.x.length - 1], colour: gd._fullData[index].line.color,
        pixel: best, x: x, right: right, overlay_cleared: !stillPainted};
"""
)

FIGURE_JS = (
    CHART_JS.replace("return Array", "var gd = Array")
    + """
var raw = gd.data.find(function (t) { return t.meta && t.meta.role === 'raw'; });
var full = gd._fullLayout;
return {steps: Array.from(raw.x), x: full.xaxis.range.slice(), y: full.yaxis.range.slice()};
"""
)


def _figure(driver: Any) -> dict[str, Any]:
    return driver.execute_script(FIGURE_JS, KEY)  # type: ignore[no-any-return]


def _rgb(colour: str) -> tuple[int, int, int]:
    colour = colour.lstrip("#")
    return int(colour[0:2], 16), int(colour[2:4], 16), int(colour[4:6], 16)


def _row(step: int, value: float) -> dict[str, Any]:
    return {"step": step, "values": {KEY: value}}


def test_a_live_point_is_painted_at_once_where_the_figure_draws_it_later(
    server, browser, artifacts
) -> None:
    run = LiveRun(server, "overlay", "cispo")
    run.send([_row(s, 0.5 + 0.1 * (s % 7) / 7) for s in range(200)])
    browser.get(f"{server.url}/compare?runs={run.id}")
    drawn_charts(browser, 5)
    wait_until(lambda: live_state(browser) == "live", message="live websocket")

    # The first live step is past the end of the step axis: the figure takes it in at once
    # and leaves room on the right for the steps to come.
    run.send([_row(200, 0.55)])
    first = wait_until(lambda: (lambda f: f if 200 in f["steps"] else None)(_figure(browser)))
    lo, hi = sorted(first["x"])
    assert hi >= 200 + 10, first["x"]  # room for at least MIN_HEADROOM more steps
    assert lo == 0

    # The next one falls inside both axes: painted on the overlay, drawn into the figure later.
    browser.execute_script(WATCH_JS, KEY, 201)
    sent = time.monotonic()
    run.send([_row(201, 0.55)])
    wait_until(lambda: 201 in _figure(browser)["steps"], timeout=15, message="step 201 in the figure")
    waited = time.monotonic() - sent
    sample = browser.execute_script(SAMPLE_JS, KEY, 201)
    assert sample["last_x"] == 201, sample
    assert sample["pixel"] is not None, f"the overlay never showed step 201 (figure took it in after {waited:.2f} s)"
    red, green, blue, alpha = sample["pixel"]
    assert alpha >= 128, sample  # the overlay drew the line through the point Plotly drew later
    want = _rgb(sample["colour"])
    assert max(abs(a - b) for a, b in zip((red, green, blue), want, strict=True)) <= 40, (sample, want)
    assert abs(sample["right"] - sample["x"]) <= 3, sample  # the overlay ends at the step
    assert sample["overlay_cleared"], "the redraw that took the step in must clear the overlay"

    # A spike far above the y range cannot be placed on the overlay: the chart is redrawn at
    # once (well before its next regular draw, DRAW_INTERVAL_MS = 2 s after the last one).
    top = max(_figure(browser)["y"])  # a linear axis: the range is in values
    sent = time.monotonic()
    run.send([_row(202, top * 10)])
    spiked = wait_until(
        lambda: (lambda f: f if 202 in f["steps"] else None)(_figure(browser)),
        timeout=15,
        interval=0.02,
        message="the spike in the figure",
    )
    assert time.monotonic() - sent < 1.5
    assert max(spiked["y"]) >= top * 10
    screenshot(browser, artifacts / "overlay.png", full_page=False)
    assert console_errors(browser) == []
    run.close()


def test_points_arriving_faster_than_the_paint_clock_ask_only_for_frames_that_paint(server, browser) -> None:
    """Every animation frame costs the browser a commit of the page's layers, changed or not:
    rows are taken in off-frame, and a frame is asked for only to paint or draw (the overlays
    of all charts on one 200 ms clock), not once per pushed message."""
    run = LiveRun(server, "frames", "cispo")
    run.send([_row(s, 0.5 + 0.1 * (s % 7) / 7) for s in range(200)])
    browser.get(f"{server.url}/compare?runs={run.id}")
    drawn_charts(browser, 5)
    wait_until(lambda: live_state(browser) == "live", message="live websocket")
    run.send([_row(200, 0.55)])  # past the axis' end: drawn at once, room left on the right
    wait_until(lambda: 200 in _figure(browser)["steps"], timeout=15, message="step 200 in the figure")
    before = live_stats(browser)
    for step in range(201, 241):  # 20 messages a second, inside the axes: painted, drawn later
        run.send([_row(step, 0.55)])
        time.sleep(0.05)
    wait_until(lambda: live_stats(browser)["messages"] - before["messages"] >= 40, timeout=15, message="40 messages")
    wait_until(lambda: 240 in _figure(browser)["steps"], timeout=15, message="step 240 in the figure")
    after = live_stats(browser)
    frames = after["frames"] - before["frames"]
    # Every frame painted or drew (but a chart's own redraw may repaint its overlay between a
    # frame's asking and its coming: a few; one frame per message would be ~40).
    assert after["idleFrames"] - before["idleFrames"] <= 3, (before, after)
    assert after["overlays"] > before["overlays"]  # the points were painted before they were drawn
    assert frames <= 40 * 0.6, (before, after)  # ~1 frame per 200 ms of streaming, not one per message
    assert console_errors(browser) == []
    run.close()
