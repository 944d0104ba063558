"""Zeros on a log axis (dashboard/traces.py): a tail fraction that is 0 for a while is drawn
honestly: the zeros are gaps in the line and open circles at the bottom edge (hover "0"),
and its smoothed line stops at LOG_FLOOR × the smallest positive value instead of diving
decades towards 0 (0.6⁵⁰ ≈ 1e-11 after 50 zeros)."""

from __future__ import annotations

import json

import plotly.graph_objects as go

from dashboard.figures import ChartOptions, metric_figure
from dashboard.series import Series, ema
from dashboard.traces import EDGE_SYMBOL, EDGE_Y, LOG_FLOOR, RunLine, log_floor, zero_label

KEY = "mismatch/tail_frac"
VALUES = [1e-3] * 10 + [0.0] * 50 + [2e-3] * 10 + [-0.5]
ZEROS = [s for s, v in enumerate(VALUES) if v <= 0]


def _line(run_id: str, values: list[float], group: str | None = None) -> RunLine:
    return RunLine(run_id, run_id, group, Series(list(range(len(values))), values))


def _same(drawn: list[float | None], values: list[float | None]) -> bool:
    """Equal up to the digits a figure drops (figures.DRAWN_PRECISION), gaps in place."""
    return len(drawn) == len(values) and all(
        (a is None) == (b is None) and (a is None or b is None or abs(a - b) <= 1e-3 * abs(b))
        for a, b in zip(drawn, values, strict=True)
    )


def _role(figure: dict, role: str) -> list[dict]:
    return [t for t in figure["data"] if t["meta"]["role"] == role]


def test_zeros_on_a_log_axis_are_edge_markers_and_the_smoothed_line_does_not_dive() -> None:
    figure = metric_figure(KEY, [_line("a", VALUES)], options=ChartOptions(smoothing=0.6))
    go.Figure(figure)
    json.dumps(figure, allow_nan=False)
    assert figure["layout"]["yaxis"]["type"] == "log"
    (raw,) = _role(figure, "raw")
    assert [s for s, y in enumerate(raw["y"]) if y is None] == ZEROS  # gaps, never drops
    (marks,) = _role(figure, "nonfinite")
    assert marks["x"] == ZEROS and marks["yaxis"] == "y2"
    assert set(marks["y"]) == {EDGE_Y["zero"]} and set(marks["marker"]["symbol"]) == {EDGE_SYMBOL["zero"]}
    assert marks["text"] == ["0"] * 50 + ["-0.5 (≤ 0)"]
    (smooth,) = _role(figure, "smooth")
    floor = LOG_FLOOR * 1e-3
    assert smooth["meta"]["floor"] == floor
    drawn = [y for y in smooth["y"] if y is not None]
    assert min(drawn) >= floor  # the EMA itself falls to ~1e-14 over the zeros
    assert min(v for v in ema(VALUES, 0.6)[0] if v is not None and v > 0) < 1e-12
    # It follows the zeros down a decade, then stops; it comes back with the positive values.
    expected = [v if v is not None and v >= floor else None for v in ema(VALUES, 0.6)[0]]
    assert _same(smooth["y"], expected)
    assert smooth["y"][9] is not None and smooth["y"][40] is None and smooth["y"][69] is not None
    # The axis never reaches below the floor.
    low, _ = figure["layout"]["meta"]["y_extent"]
    assert low >= floor


def test_without_zeros_or_on_a_linear_axis_nothing_changes() -> None:
    positive = [1e-3 * (1 + k % 3) for k in range(40)]
    figure = metric_figure(KEY, [_line("a", positive)], options=ChartOptions(smoothing=0.6))
    (smooth,) = _role(figure, "smooth")
    assert _same(smooth["y"], ema(positive, 0.6)[0])  # an EMA of positives never drops below their min
    assert _role(figure, "nonfinite")[0]["x"] == []
    linear = metric_figure(KEY, [_line("a", VALUES)], options=ChartOptions(smoothing=0.6, log_y=False))
    assert _same(_role(linear, "smooth")[0]["y"], ema(VALUES, 0.6)[0])
    assert _role(linear, "nonfinite")[0]["x"] == []  # 0 is on a linear axis
    assert "floor" not in _role(linear, "smooth")[0]["meta"]


def test_group_means_on_a_log_axis_stop_at_the_floor_too() -> None:
    lines = [_line("a", VALUES, "g"), _line("b", [2 * v for v in VALUES], "g")]
    figure = metric_figure(KEY, lines, options=ChartOptions(smoothing=0.6, aggregate="std"))
    floor = LOG_FLOOR * 1e-3
    for role in ("member", "mean"):
        for trace in _role(figure, role):
            assert all(y is None or y >= floor for y in trace["y"]), role


def test_floor_and_label() -> None:
    assert log_floor([0.0, -1.0, float("nan"), 5e-4, 2e-3]) == LOG_FLOOR * 5e-4
    assert log_floor([0.0, -1.0]) is None
    assert zero_label(0.0) == zero_label(-0.0) == "0" and zero_label(-0.25) == "-0.25 (≤ 0)"
