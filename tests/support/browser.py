"""Reading the dashboard's state out of a live page (selenium + the page's own JS objects)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

CHARTS_JS = """
return Array.from(document.querySelectorAll('.keel-graph .js-plotly-plot')).map(function (gd) {
  var meta = (gd.layout && gd.layout.meta) || {};
  return {
    key: meta.key || null,
    render: meta.render_id || null,
    yaxis: gd.layout && gd.layout.yaxis ? gd.layout.yaxis.type : null,
    shapes: ((gd.layout && gd.layout.shapes) || []).map(function (s) {
      return {name: s.name || null, x0: s.x0, x1: s.x1};
    }),
    traces: (gd.data || []).map(function (t) {
      var m = t.meta || {};
      return {role: m.role || null, run: m.run || null, group: m.group || null, name: t.name,
              x: Array.from(t.x || []), y: Array.from(t.y || [])};
    }),
  };
});
"""


def wait_until(
    condition: Any, timeout: float = 20.0, interval: float = 0.05, message: str = ""
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message or condition}")
        time.sleep(interval)


def charts(driver: Any) -> list[dict[str, Any]]:
    return list(driver.execute_script(CHARTS_JS))


SCROLL_TO_LOADING_JS = """
var card = Array.from(document.querySelectorAll('.chart-card[data-key]')).find(function (c) {
  var gd = c.querySelector('.js-plotly-plot');
  return !(gd && gd.layout && gd.layout.meta && gd.layout.meta.render_id);
});
if (card) card.scrollIntoView({block: 'nearest'});
"""


def drawn_charts(driver: Any, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Wait for `count` charts drawn from server data (not the loading placeholder),
    scrolling to each chart still loading as a reader would: a chart asks for its figure
    only once it comes near the view."""

    def ready() -> list[dict[str, Any]] | None:
        found = charts(driver)
        if len(found) == count and all(c["key"] and c["render"] for c in found):
            return found
        driver.execute_script(SCROLL_TO_LOADING_JS)
        return None

    scrolled = driver.execute_script("return window.scrollY")
    drawn = wait_until(ready, timeout, message=f"{count} charts with data")
    driver.execute_script("window.scrollTo(0, arguments[0])", scrolled)  # where the reader was
    return drawn  # type: ignore[no-any-return]


def live_state(driver: Any) -> str | None:
    return driver.execute_script(
        "return document.getElementById('live-indicator').getAttribute('data-state')"
    )  # type: ignore[no-any-return]


def instrument(driver: Any) -> None:
    """Turn on the live updater's instrumentation (keelLive.stats, keelLive.drawn) in every
    page this browser opens from now on."""
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": "window.keelInstrument = true;"})


def live_stats(driver: Any) -> dict[str, int]:
    return dict(driver.execute_script("return JSON.parse(JSON.stringify(window.keelLive.stats))"))


def drawn_at(driver: Any, key: str) -> dict[tuple[str, int], float]:
    """When (browser clock, ms) each (run, step) of `key` was painted by the live updater."""
    entries = driver.execute_script(
        "var key = arguments[0]; return window.keelLive.drawn.filter(function (d) { return d.key === key; })",
        key,
    )
    first: dict[tuple[str, int], float] = {}
    for entry in entries:  # a redraw can paint a step again; the first paint is when it showed
        first.setdefault((entry["run"], int(entry["step"])), float(entry["t"]))
    return first


def text_of(driver: Any, element_id: str) -> str:
    """The element's text, or "" while it is not on the page yet."""
    return str(
        driver.execute_script(
            "var e = document.getElementById(arguments[0]); return e ? e.innerText : ''", element_id
        )
    )


def set_viewport(driver: Any, width: int, height: int) -> None:
    """The page's viewport itself (a window of 1280x800 leaves less to the page)."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )


def console_errors(driver: Any) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def screenshot(driver: Any, path: Path, full_page: bool = True) -> Path:
    """Save the 1280x800 viewport, or the whole page at 1280 wide."""
    if full_page:
        height = int(driver.execute_script("return document.documentElement.scrollHeight"))
        set_viewport(driver, 1280, max(800, height))
        time.sleep(0.5)
    driver.save_screenshot(str(path))
    if full_page:
        set_viewport(driver, 1280, 800)
    return path


AXIS_JS = """
var key = arguments[0];
var gd = Array.from(document.querySelectorAll('.keel-graph .js-plotly-plot')).find(function (g) {
  return g.layout && g.layout.meta && g.layout.meta.key === key;
});
if (!gd || !gd._fullLayout || !gd._fullLayout.yaxis) return null;
var full = gd._fullLayout;
var main = gd.querySelector('.subplot.xy');
return {
  render: gd.layout.meta.render_id || null,
  type: full.yaxis.type,
  range: full.yaxis.range.slice(),
  height: full._size.h,
  ticks: Array.from(gd.querySelectorAll('.yaxislayer-above .ytick text')).map(function (t) {
    return t.textContent;
  }),
  notes: Array.from(gd.querySelectorAll('.annotation-text')).map(function (t) {
    return t.textContent;
  }),
  lines: main ? Array.from(main.querySelectorAll('.scatterlayer .trace')).map(function (trace) {
    return Array.from(trace.querySelectorAll('.js-line')).map(function (p) {
      return p.getAttribute('d') || '';
    }).join('');
  }) : [],
};
"""


def y_axis(driver: Any, key: str) -> dict[str, Any] | None:
    """How the chart of `key` looks: its y axis as drawn (type, range in axis units, tick
    labels), the text of its notes, and the SVG path of each line on the main plot (one
    string per trace, in trace order; a line broken by gaps has one "M" per piece)."""
    return driver.execute_script(AXIS_JS, key)  # type: ignore[no-any-return]


def path_points(d: str) -> list[tuple[float, float]]:
    """The (x, y) pixel vertices of an SVG line path as Plotly writes it ("M x,y L x,y ...")."""
    number = r"(-?[\d.]+(?:e[-+]?\d+)?)"
    return [(float(x), float(y)) for x, y in re.findall(f"{number},{number}", d)]


HAZARD_JS = """
var gd = document.querySelector('.hazard-graph .js-plotly-plot');
if (!gd || !gd.layout || !gd._fullLayout) return null;
var meta = gd.layout.meta || {};
return {
  render: meta.render_id || null,
  title: gd._fullLayout.title ? gd._fullLayout.title.text : null,
  ytitle: gd._fullLayout.yaxis.title ? gd._fullLayout.yaxis.title.text : null,
  yrange: gd._fullLayout.yaxis.range.slice(),
  traces: (gd.data || []).map(function (t) {
    var m = t.meta || {};
    return {role: m.role || null, run: m.run || null, name: t.name,
            colour: t.line ? t.line.color : null, dash: t.line ? t.line.dash : null,
            x: Array.from(t.x || []), y: Array.from(t.y || [])};
  }),
};
"""

LINE_STYLES_JS = """
var key = arguments[0];
var gd = Array.from(document.querySelectorAll('.keel-graph .js-plotly-plot')).find(function (g) {
  return g.layout && g.layout.meta && g.layout.meta.key === key;
});
if (!gd) return null;
var styles = {};
(gd.data || []).forEach(function (t) {
  var m = t.meta || {};
  if (m.role === 'raw' && t.line) styles[m.run] = [t.line.color, t.line.dash];
});
return styles;
"""


def hazard_chart(driver: Any) -> dict[str, Any] | None:
    """The collapse hazard chart as drawn from server data (None before that): its render id,
    title, y axis title and range, and per trace its run, name, colour, dash, x and y."""
    chart = driver.execute_script(HAZARD_JS)
    return chart if chart and chart["render"] else None


def line_styles(driver: Any, key: str) -> dict[str, list[str]] | None:
    """run id -> [colour, dash] of each run's raw line on the chart of `key`."""
    return driver.execute_script(LINE_STYLES_JS, key)  # type: ignore[no-any-return]


def chart_order(driver: Any) -> list[str | None]:
    """The page's metric charts in document order: each one's key, "hazard" for the
    collapse hazard chart (None for a chart still loading); the compare page's parity view
    (#parity) has charts of its own, not metric charts, and is left out."""
    return list(
        driver.execute_script(
            "return Array.from(document.querySelectorAll('.chart-card:not(#parity .chart-card)')).map(function (card) {"
            "  if (card.querySelector('.hazard-graph')) return 'hazard';"
            "  var gd = card.querySelector('.js-plotly-plot');"
            "  return gd && gd.layout && gd.layout.meta ? gd.layout.meta.key || null : null; })"
        )
    )


DETAIL_JS = """
var gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot') || document.getElementById(arguments[0]);
if (!gd || !gd.layout || !gd._fullLayout) return null;
return {
  meta: gd.layout.meta || {},
  notes: (gd.layout.annotations || []).map(function (a) { return a.text; }),
  traces: (gd.data || []).map(function (t) {
    return {type: t.type, name: t.name || null, role: (t.meta || {}).role || null,
            x: Array.from(t.x || []), y: Array.from(t.y || []),
            z: t.z ? t.z.map(function (row) { return Array.from(row); }) : null,
            customdata: t.customdata ? Array.from(t.customdata) : null};
  }),
};
"""


def detail_chart(driver: Any, graph_id: str) -> dict[str, Any] | None:
    """A step-details chart (`dist-graph`, `seq-graph`) as drawn from server data (None before
    that, or while it shows a message): layout.meta, annotation texts, and per trace its type,
    name, role, x, y, z and customdata."""
    chart = driver.execute_script(DETAIL_JS, graph_id)
    return chart if chart and chart["meta"].get("render_id") else None


def chart_message(driver: Any, graph_id: str) -> str:
    """The text a chart shows instead of data ("Loading…", an empty state), or ""."""
    return str(
        driver.execute_script(
            "var gd = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');"
            "return gd && gd.layout ? (gd.layout.annotations || []).map(function (a) { return a.text; }).join(' ') : ''",
            graph_id,
        )
    )


CLICK_POINT_JS = """
var gd = arguments[0], x = arguments[1];
var full = gd._fullLayout, box = gd.getBoundingClientRect();
var px = full.xaxis._offset + full.xaxis.l2p(x), py = full.yaxis._offset + full.yaxis._length / 2;
return [px - box.width / 2, py - box.height / 2];
"""


def click_at_x(driver: Any, plot: Any, x: float, *, click: bool = True) -> None:
    """A real mouse click on a Plotly chart at data x (half way up its plot area); with
    `click` False, the mouse only rests there (a hover)."""
    from selenium.webdriver.common.action_chains import ActionChains

    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", plot)
    dx, dy = driver.execute_script(CLICK_POINT_JS, plot, x)
    actions = ActionChains(driver).move_to_element_with_offset(plot, int(dx), int(dy)).pause(0.3)
    (actions.click() if click else actions).perform()
