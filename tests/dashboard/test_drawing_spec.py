"""The server's side of the drawing arithmetic against the one table of cases that the page's
side (assets/live/math.js, tests/dashboard/test_browser_math.py) is held to as well:
tests/dashboard/drawing_spec.json."""

from __future__ import annotations

import math
from typing import Any

import pytest

from dashboard.figures import FLAT_PAD, FLAT_SPAN, flat_range, x_axis_end
from dashboard.series import NonFinite, Series, band_at, ema, nonfinite_points
from dashboard.traces import _smoothed_drawn, drawable, log_floor, zero_label
from tests.support.drawing import SPEC, close
from wire import decode_value


def _value(raw: Any) -> float:
    return decode_value(raw)


def test_the_table_covers_every_function_of_the_page_side() -> None:
    """Every function of math.js that computes something the server also computes has cases
    (parseValue through the wire's values, nonFiniteKind through "kind")."""
    assert {k: len(v) > 0 for k, v in SPEC.items() if isinstance(v, list)} == dict.fromkeys(
        ["ema", "drawable", "log_floor", "above_floor", "zero_label", "flat_range", "x_axis_end", "kind", "band"], True
    )
    assert SPEC["flat"] == {"span": FLAT_SPAN, "pad": FLAT_PAD}


@pytest.mark.parametrize("case", SPEC["ema"], ids=lambda c: f"{c['name']}-{c['weight']}")
def test_smoothing(case: dict[str, Any]) -> None:
    smoothed, state = ema([_value(v) for v in case["values"]], case["weight"])
    assert len(smoothed) == len(case["smoothed"])
    assert all(close(g, w) for g, w in zip(smoothed, case["smoothed"], strict=True))
    assert state.count == case["state"]["count"] and close(state.value, case["state"]["value"])


def test_what_a_log_axis_can_draw_and_where_a_smoothed_line_stops() -> None:
    for case in SPEC["drawable"]:
        assert drawable(_value(case["value"]), case["log"]) is case["drawable"], case
    for case in SPEC["log_floor"]:
        assert log_floor([_value(v) for v in case["values"]]) == case["floor"], case["name"]
    for case in SPEC["above_floor"]:
        drawn = _smoothed_drawn([_value(case["value"])], case["log"], case["floor"])[0] is not None
        assert drawn is case["above"], case


def test_the_words_and_kinds_of_values_no_axis_can_place() -> None:
    for case in SPEC["zero_label"]:
        assert zero_label(case["value"]) == case["label"], case
    for case in SPEC["kind"]:
        value = _value(case["value"])
        assert not math.isfinite(value)
        assert nonfinite_points(Series([7], [value])) == [NonFinite(7, case["kind"])], case


def test_the_flat_range_and_where_the_step_axis_ends() -> None:
    for case in SPEC["flat_range"]:
        assert flat_range(tuple(case["extent"]), case["log"]) == case["range"], case
    for case in SPEC["x_axis_end"]:
        assert x_axis_end(case["first"], case["newest"]) == case["end"], case


def test_a_group_band_at_one_step() -> None:
    """The mean, band and count of a group at one step, as series.band_at computes them for the
    server's group_band and math.js `band` for the page extending a live band."""
    assert SPEC["band"][0] == {"values": [1.0, 2.0, 3.0], "spread": "std", "band": {"mean": 2.0, "lower": 1.0, "upper": 3.0, "n": 3}}
    for case in SPEC["band"]:
        got = band_at([None if v is None else _value(v) for v in case["values"]], case["spread"])
        want = case["band"]
        assert (got is None) is (want is None), case
        if got is not None:
            assert got == (want["mean"], want["lower"], want["upper"], want["n"]), case
