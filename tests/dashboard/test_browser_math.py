"""The page's side of the drawing arithmetic (assets/live/math.js), run in the browser against
the one table of cases the server's side is held to as well (tests/dashboard/drawing_spec.json,
tests/dashboard/test_drawing_spec.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.browser import wait_until
from tests.support.drawing import SPEC, close

pytestmark = pytest.mark.browser

# Every case of the table through math.js, in one call: values arrive as the wire carries
# them and are read with the page's own parseValue.
RUN_THE_TABLE = """
var m = window.keelLive.math, spec = arguments[0];
function v(raw) { return raw === null ? null : m.parseValue(raw); }
return {
  ema: spec.ema.map(function (c) { var r = m.ema(c.values.map(v), c.weight); return {smoothed: r.values, state: r.state}; }),
  drawable: spec.drawable.map(function (c) { return m.drawable(v(c.value), c.log); }),
  log_floor: spec.log_floor.map(function (c) { return c.values.reduce(function (f, raw) { return m.logFloor(f, v(raw)); }, null); }),
  above_floor: spec.above_floor.map(function (c) { return m.aboveFloor(v(c.value), c.floor, c.log); }),
  zero_label: spec.zero_label.map(function (c) { return m.zeroLabel(c.value); }),
  flat_range: spec.flat_range.map(function (c) { return m.flatRange(c.extent, c.log, spec.flat); }),
  x_axis_end: spec.x_axis_end.map(function (c) { return m.xAxisEnd(c.first, c.newest); }),
  kind: spec.kind.map(function (c) { return m.nonFiniteKind(v(c.value)); }),
  band: spec.band.map(function (c) { return m.band(c.values.map(v), c.spread); }),
};
"""

EXPECTED = {"drawable": "drawable", "log_floor": "floor", "above_floor": "above", "zero_label": "label",
            "flat_range": "range", "x_axis_end": "end", "kind": "kind"}  # fmt: skip


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_page_computes_every_case_of_the_drawing_table(server, browser) -> None:
    browser.get(f"{server.url}/")
    wait_until(lambda: browser.execute_script("return !!(window.keelLive && window.keelLive.math)"), message="live updater")
    got: dict[str, list[Any]] = browser.execute_script(RUN_THE_TABLE, SPEC)
    for case, result in zip(SPEC["ema"], got["ema"], strict=True):
        name = (case["name"], case["weight"])
        assert len(result["smoothed"]) == len(case["smoothed"]), name
        assert all(close(g, w) for g, w in zip(result["smoothed"], case["smoothed"], strict=True)), name
        assert result["state"]["count"] == case["state"]["count"] and close(result["state"]["value"], case["state"]["value"]), name
    for case, result in zip(SPEC["band"], got["band"], strict=True):
        want = case["band"]
        assert (result is None) is (want is None), case
        if want is not None:
            assert result["n"] == want["n"] and all(close(result[k], want[k]) for k in ("mean", "lower", "upper")), (case, result)
    for part, field in EXPECTED.items():
        assert len(got[part]) == len(SPEC[part])
        for case, result in zip(SPEC[part], got[part], strict=True):
            assert result == case[field], (part, case)
