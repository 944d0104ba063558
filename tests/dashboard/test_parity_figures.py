"""The parity view's figures (dashboard/parity_figures.py): shares of each side's tokens per
bin, their difference, the tails per step."""

from __future__ import annotations

import pytest

from dashboard.parity_figures import (
    HistogramSide,
    TailLine,
    difference_figure,
    overlay_figure,
    summed,
    tails_figure,
)

EDGES = [-1.0, -0.1, 0.0, 0.1, 1.0, 10.0]


def test_the_overlay_draws_each_side_s_shares_of_its_tokens_over_the_occupied_bins() -> None:
    a = HistogramSide("A: base", "#00f", summed([[0, 2, 6, 0, 0], [0, 0, 8, 4, 0]], 5))
    b = HistogramSide("B: new", "#f00", [0, 1, 1, 2, 0])
    assert a.counts == [0, 2, 14, 4, 0]
    figure = overlay_figure(EDGES, [a, b])
    bars = figure["data"]
    assert [bar["x"] for bar in bars] == [[1, 2, 3]] * 2  # bins 0 and 4 are empty on both sides
    assert bars[0]["y"] == pytest.approx([0.1, 0.7, 0.2]) and bars[1]["y"] == pytest.approx([0.25, 0.25, 0.5])
    assert figure["layout"]["yaxis"]["type"] == "log"
    assert figure["layout"]["meta"]["totals"] == [20, 4]
    # Edge i sits at x = i - 0.5, labelled with its value (no two labels on neighbouring edges).
    axis = figure["layout"]["xaxis"]
    assert dict(zip(axis["tickvals"], axis["ticktext"], strict=True)) == {0.5: "-0.1", 2.5: "0.1"}

    difference = difference_figure(EDGES, a, b)["data"][0]
    assert difference["y"] == pytest.approx([0.15, -0.45, 0.3])
    assert difference["marker"]["color"] == ["#f00", "#00f", "#f00"]


def test_empty_sides_and_tails_say_so_instead_of_drawing_nothing() -> None:
    empty = HistogramSide("A", "#00f", [0] * 5)
    assert overlay_figure(EDGES, [empty, empty])["data"] == []
    assert "No mismatch/log_ratio" in overlay_figure(EDGES, [empty, empty])["layout"]["annotations"][0]["text"]
    assert "No mismatch/tail_frac" in tails_figure([TailLine("A x", "#00f", "solid", [], [])])["layout"]["annotations"][0]["text"]
    # A step with no token in a tail is a gap on the log axis, not a zero.
    line = tails_figure([TailLine("A x", "#00f", "dot", [0, 1, 2], [0.01, 0.0, float("nan")])])["data"][0]
    assert line["y"] == [0.01, None, None] and line["line"]["dash"] == "dot"
