"""The arithmetic the live updater shares with Python (assets/live/math.js against
dashboard/series.py and dashboard/figures.py), run in the browser on the same vectors."""

from __future__ import annotations

import math
import random

import pytest

from dashboard.figures import FLAT_PAD, FLAT_SPAN, flat_range, x_axis_end
from dashboard.series import ema
from tests.support.browser import wait_until

pytestmark = pytest.mark.browser

_rng = random.Random(7)
VECTORS = {
    "constant": [1.0] * 60,  # exact: no 1.0000000000000002 for the axis to zoom into
    "walk": [sum(_rng.gauss(0, 1) for _ in range(k)) for k in range(200)],
    "tiny": [1e-9 * (1 + 0.01 * math.sin(k)) for k in range(100)],
    "gaps": [float("nan") if k % 7 == 3 else float("inf") if k == 20 else -float("inf") if k == 21 else k * 0.5 for k in range(60)],
}
EXTENTS = [(1.0, 1.0 + 1e-9), (0.0, 0.0), (1.0, 2.0), (-3.0, -3.0 + 1e-8), (5e-4, 5e-4), (-1e-300, 1e-300), (2.0, 2.0000001)]


def _js(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_smoothing_and_the_flat_axis_are_the_same_numbers_in_the_browser(server, browser) -> None:
    browser.get(f"{server.url}/")
    wait_until(lambda: browser.execute_script("return !!(window.keelLive && window.keelLive.math)"), message="live updater")
    for name, values in VECTORS.items():
        for weight in (0.0, 0.6, 0.99):
            expected, state = ema(values, weight)
            got = browser.execute_script(
                "var v = arguments[0].map(function (x) { return typeof x === 'string' ? Number(x.replace('inf', 'Infinity')) : x; });"
                "var r = window.keelLive.math.ema(v, arguments[1]); return [r.values, r.state];",
                [_js(v) for v in values],
                weight,
            )
            assert got[0] == expected, (name, weight)  # exactly, gaps (None) where Python has them
            assert (got[1]["value"], got[1]["count"]) == (state.value, state.count), (name, weight)
    flat = {"span": FLAT_SPAN, "pad": FLAT_PAD}
    for extent in EXTENTS:
        for log_y in (False, True):
            if log_y and extent[0] <= 0:
                continue
            got = browser.execute_script("return window.keelLive.math.flatRange(arguments[0], arguments[1], arguments[2])", list(extent), log_y, flat)
            assert got == flat_range(extent, log_y), (extent, log_y)
    for first, newest in [(0, 0), (0, 5), (0, 71), (0, 99), (0, 100), (0, 305), (30, 348), (0, 9999), (12, 123456)]:
        got = browser.execute_script("return window.keelLive.math.xAxisEnd(arguments[0], arguments[1])", first, newest)
        assert got == x_axis_end(first, newest), (first, newest)
