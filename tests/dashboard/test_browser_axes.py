"""Y axes in a real headless Chromium: constants drawn flat, values ≤ 0 on log axes.

Each test reads the chart as drawn (Plotly's full layout, the tick labels and the SVG
paths), first for the history the server renders and then after points streamed live.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.support.browser import (
    charts,
    console_errors,
    drawn_charts,
    live_state,
    path_points,
    screenshot,
    set_viewport,
    wait_until,
    y_axis,
)
from tests.support.toy_runs import LiveRun

pytestmark = [
    pytest.mark.browser,
    pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
]

# On-policy: the importance ratio is exactly 1 at every step; the batch size never changes;
# 0.1 + 0.2 is 0.3 but for the last bit (a raw series with float noise, no smoothing needed).
CONSTANT = {"mismatch/ratio_max": 1.0, "batch/seqs": 64}
NOISY = ("batch/frac", (0.3, 0.1 + 0.2))


def _constant_row(step: int) -> dict[str, Any]:
    return {"step": step, "values": {**CONSTANT, NOISY[0]: NOISY[1][step % 2]}}


def _axis_bounds(axis: dict[str, Any]) -> tuple[float, float]:
    lo, hi = sorted(axis["range"])
    return (10**lo, 10**hi) if axis["type"] == "log" else (lo, hi)


def _assert_flat_and_readable(axis: dict[str, Any], value: float) -> None:
    lo, hi = _axis_bounds(axis)
    # A sensible range: the line sits inside it, and it is not a zoom into rounding error.
    assert lo < value < hi, (axis, value)
    assert hi - lo >= 0.01 * abs(value), (axis, value)
    # Labelled ticks (a log axis repeats "2" and "5" in each decade, so count distinct ones).
    assert len({t for t in axis["ticks"] if t.strip()}) >= 2, axis["ticks"]


def _smoothed(driver: Any, key: str) -> list[float | None]:
    chart = next(c for c in charts(driver) if c["key"] == key)
    return next(t["y"] for t in chart["traces"] if t["role"] == "smooth")


def _wait_drawn(driver: Any, run: LiveRun, key: str, step: int) -> None:
    """Wait until the figure itself holds `step` (painted on the live overlay is not enough:
    these tests read the figure's axes and SVG paths)."""

    def held() -> bool:
        chart = next((c for c in charts(driver) if c["key"] == key), None)
        return chart is not None and any(
            t["role"] == "raw" and t["run"] == run.id and step in t["x"] for t in chart["traces"]
        )

    wait_until(held, timeout=15, message=f"{key} step {step} in the figure")


def test_a_constant_series_draws_flat_with_readable_ticks(server, browser, artifacts) -> None:
    run = LiveRun(server, "on-policy", "cispo")
    run.send([_constant_row(s) for s in range(150)])
    browser.get(f"{server.url}/runs/{run.id}")
    drawn_charts(browser, 3)
    for key, value in {**CONSTANT, NOISY[0]: 0.3}.items():
        axis = wait_until(lambda key=key: y_axis(browser, key), message=key)
        _assert_flat_and_readable(axis, value)
    for key, value in CONSTANT.items():
        # Smoothing a constant gives the constant, to the last bit: it must not invent variation.
        assert set(_smoothed(browser, key)) == {value}, key
    assert console_errors(browser) == []
    screenshot(browser, artifacts / "run-constant.png")
    run.close()


def test_a_constant_series_streamed_live_keeps_a_sensible_axis(server, browser) -> None:
    # Headline charts of the compare page: gate/frac starts from one point, the reward (a
    # constant integer here) and the ratio charts start empty; the rest comes live, so the
    # browser's own smoothing and axis rule draw it.
    run = LiveRun(server, "on-policy", "cispo")
    noisy = (0.3, 0.1 + 0.2)

    def row(step: int) -> dict[str, Any]:
        return {
            "step": step,
            "values": {"reward/mean": 64, "gate/frac": noisy[step % 2], "mismatch/ratio_max": 1.0},
        }

    run.send([{"step": 0, "values": {"gate/frac": noisy[0]}}])
    browser.get(f"{server.url}/compare?runs={run.id}")
    drawn_charts(browser, 5)
    wait_until(lambda: live_state(browser) == "live", message="live websocket")
    for first in range(1, 61, 10):
        run.send([row(s) for s in range(first, first + 10)])
    expected = {"reward/mean": 64.0, "gate/frac": 0.3, "mismatch/ratio_max": 1.0}
    for key in expected:
        _wait_drawn(browser, run, key, 60)
    for key, value in expected.items():
        _assert_flat_and_readable(y_axis(browser, key), value)  # type: ignore[arg-type]
    assert set(_smoothed(browser, "reward/mean")) == {64.0}
    assert set(_smoothed(browser, "mismatch/ratio_max")) == {1.0}
    assert console_errors(browser) == []
    run.close()


def _inside_plot(axis: dict[str, Any]) -> bool:
    """Every vertex of every line lies inside the plot area (none plunges off its bottom)."""
    vertices = [y for d in axis["lines"] for _, y in path_points(d)]
    return bool(vertices) and all(-1 <= y <= axis["height"] + 1 for y in vertices)


def test_an_all_zero_series_on_a_log_axis_says_why_and_draws_linear(
    server, browser, artifacts
) -> None:
    run = LiveRun(server, "on-policy", "cispo")
    run.send([{"step": s, "values": {"mismatch/kl": 0.0}} for s in range(40)])
    browser.get(f"{server.url}/runs/{run.id}")
    drawn_charts(browser, 1)
    axis = wait_until(lambda: y_axis(browser, "mismatch/kl"), message="KL chart")
    # The KL chart is log by default; with nothing positive it falls back to linear and says so.
    assert any("log axis cannot show" in note for note in axis["notes"]), axis["notes"]
    assert axis["type"] == "linear"
    assert _inside_plot(axis)  # the zeros are drawn: a flat line at 0
    lo, hi = _axis_bounds(axis)
    assert lo < 0 < hi
    screenshot(browser, artifacts / "run-all-zero-log.png")
    # The first positive value streamed live brings the log axis back; the zeros become gaps.
    wait_until(lambda: live_state(browser) == "live", message="live websocket")
    run.send([{"step": s, "values": {"mismatch/kl": 1e-3 * (s - 39)}} for s in range(40, 50)])

    def redrawn_on_log() -> dict[str, Any] | None:
        now = y_axis(browser, "mismatch/kl")
        return now if now and now["render"] != axis["render"] and now["type"] == "log" else None

    log_axis = wait_until(redrawn_on_log, timeout=15, message="log axis after a positive value")
    assert not any("log axis cannot show" in note for note in log_axis["notes"])
    assert _inside_plot(log_axis)
    assert console_errors(browser) == []
    run.close()


def _comb(step: int) -> float:
    """A gradient norm that is exactly 0 on every fifth step (e.g. a skipped update)."""
    return 0.0 if step % 5 == 0 else 1.0 + 0.5 * math.sin(step / 3)


def test_zeros_on_a_log_axis_are_gaps_not_a_comb(server, browser, artifacts) -> None:
    run = LiveRun(server, "skips", "cispo")
    run.send([{"step": s, "values": {"grad/norm": _comb(s)}} for s in range(1, 60)])
    set_viewport(browser, 1280, 2400)  # the grad/norm chart in view: charts out of view wait
    browser.get(f"{server.url}/runs/{run.id}")
    drawn_charts(browser, 1)
    axis = wait_until(lambda: y_axis(browser, "grad/norm"), message="grad/norm chart")
    assert axis["type"] == "log"
    assert _inside_plot(axis), axis["lines"]
    raw = axis["lines"][0]  # the raw line is drawn first, under its smoothed line
    assert raw.count("M") >= 11  # broken at each of the 11 zeros (steps 5, 10, …, 55)
    wait_until(lambda: live_state(browser) == "live", message="live websocket")
    run.send([{"step": s, "values": {"grad/norm": _comb(s)}} for s in range(60, 80)])
    _wait_drawn(browser, run, "grad/norm", 79)
    after = y_axis(browser, "grad/norm")
    assert after is not None and after["render"] == axis["render"]  # appended, not redrawn
    assert _inside_plot(after), after["lines"]
    assert after["lines"][0].count("M") >= 15
    screenshot(browser, artifacts / "run-zeros-on-log.png")
    assert console_errors(browser) == []
    run.close()
