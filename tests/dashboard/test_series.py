"""Pure data operations: EMA debiasing, group bands, non-finite detection, alert matching."""

from __future__ import annotations

import json
import math

import pytest

from dashboard.series import (
    Alert,
    EmaState,
    NonFinite,
    Series,
    alert_matches,
    ema,
    group_band,
    magnitude,
    nonfinite_points,
    parse_value,
)
from wire.errors import ProtocolError

INF = math.inf
NAN = math.nan


def test_parse_value_reads_the_wire_encoding() -> None:
    assert parse_value(1) == 1.0 and parse_value(-2.5) == -2.5
    assert parse_value("inf") == INF and parse_value("-inf") == -INF
    assert (
        math.isnan(parse_value("nan"))
        and math.isnan(parse_value(None))
        and math.isnan(parse_value(True))
    )


def test_ema_is_debiased_like_tensorboard() -> None:
    # A constant stays exactly constant (an undebiased EMA would start near 0), to the last
    # bit: b_n / (1 - w^n) gives 1.0000000000000002 for some n, and the axis zooms into it.
    for value in (1.0, 64.0, 0.1, 3.0, -2.5):
        for weight in (0.6, 0.9, 0.99):
            assert set(ema([value] * 2000, weight)[0]) == {value}
    # Hand-computed: biased accumulators 0.1*1 = 0.1, then 0.9*0.1 + 0.1*3 = 0.39.
    smoothed, state = ema([1.0, 3.0], 0.9)
    assert smoothed[0] == pytest.approx(1.0)
    assert smoothed[1] == pytest.approx(0.39 / (1 - 0.81))
    assert (state.value, state.count) == (pytest.approx(0.39 / (1 - 0.81)), 2)


def test_ema_weight_zero_is_identity_and_weight_bounds() -> None:
    assert ema([1.0, -2.0, 7.5], 0.0)[0] == [1.0, -2.0, 7.5]
    with pytest.raises(ValueError):
        ema([1.0], 1.0)


def test_ema_skips_non_finite_and_leaves_a_gap() -> None:
    smoothed, state = ema([1.0, NAN, INF, 3.0], 0.5)
    assert smoothed[1] is None and smoothed[2] is None
    # The NaN and Inf did not feed the average: same as smoothing [1, 3].
    assert smoothed[3] == pytest.approx(ema([1.0, 3.0], 0.5)[0][1])
    assert state.count == 2


def test_ema_state_continues_where_the_page_left_off() -> None:
    values = [0.3, 1.2, -0.4, 2.2, 0.9, 1.1]
    whole, _ = ema(values, 0.8)
    head, state = ema(values[:3], 0.8)
    tail = [EmaState.push(state, v, 0.8) for v in values[3:]]
    assert head + tail == pytest.approx(whole)


def test_group_band_mean_and_sample_std() -> None:
    band = group_band([([0, 1, 2], [1.0, 2.0, 3.0]), ([0, 1, 2], [3.0, 4.0, 5.0])])
    assert band.steps == [0, 1, 2]
    assert band.mean == pytest.approx([2.0, 3.0, 4.0])
    half = math.sqrt(2.0)  # sample std of {1, 3}
    assert band.upper == pytest.approx([2.0 + half, 3.0 + half, 4.0 + half])
    assert band.lower == pytest.approx([2.0 - half, 3.0 - half, 4.0 - half])
    assert band.count == [2, 2, 2]


def test_group_band_of_equal_runs_is_a_line_at_their_value() -> None:
    # fsum([0.1] * 3) / 3 is 0.10000000000000002, with a std of 1e-17: a band of rounding error.
    band = group_band([([0, 1], [0.1, 0.1])] * 3)
    assert band.mean == band.lower == band.upper == [0.1, 0.1]


def test_group_band_stderr_divides_by_sqrt_n() -> None:
    runs = [([0], [1.0]), ([0], [2.0]), ([0], [6.0])]
    std = group_band(runs, spread="std")
    stderr = group_band(runs, spread="stderr")
    assert std.mean == stderr.mean == [pytest.approx(3.0)]
    assert (stderr.upper[0] - 3.0) == pytest.approx((std.upper[0] - 3.0) / math.sqrt(3))


def test_group_band_aligns_different_steps_as_of_and_respects_run_ends() -> None:
    # Run a logs every step to 4; run b logs at 0 and 2 only and stops at 2.
    band = group_band([([0, 1, 2, 3, 4], [0.0, 1.0, 2.0, 3.0, 4.0]), ([0, 2], [10.0, 20.0])])
    assert band.steps == [0, 1, 2, 3, 4]
    # Step 1: b is read as of step 0 (10); steps 3 and 4: b has ended, only a counts.
    assert band.mean == pytest.approx([5.0, 5.5, 11.0, 3.0, 4.0])
    assert band.count == [2, 2, 2, 1, 1]
    assert band.upper[4] == band.lower[4] == pytest.approx(4.0)  # one run: no spread


def test_group_band_leaves_non_finite_out_of_the_mean() -> None:
    band = group_band([([0, 1], [1.0, NAN]), ([0, 1], [3.0, 5.0])])
    assert band.mean == pytest.approx([2.0, 5.0])
    assert band.count == [2, 1]
    empty = group_band([([0], [INF])])
    assert empty.mean == [None] and empty.count == [0]


def test_group_band_caps_the_grid() -> None:
    steps = list(range(10_000))
    band = group_band([(steps, [float(s) for s in steps])], max_points=100)
    assert len(band.steps) <= 101 and band.steps[0] == 0 and band.steps[-1] == 9_999


def test_nonfinite_points_raw_series() -> None:
    series = Series([0, 1, 2, 3], [1.0, NAN, INF, -INF])
    assert nonfinite_points(series) == [
        NonFinite(1, "nan"),
        NonFinite(2, "+inf"),
        NonFinite(3, "-inf"),
    ]


def test_nonfinite_points_survive_downsampling() -> None:
    # Bucket 10: last value finite but the bucket held a NaN (max NaN) and a -inf (min).
    series = Series([10, 20], [1.0, 2.0], mins=[-INF, 1.5], maxs=[NAN, INF])
    assert nonfinite_points(series) == [
        NonFinite(10, "-inf"),
        NonFinite(10, "nan"),
        NonFinite(20, "+inf"),
    ]


def test_series_from_json() -> None:
    raw = Series.from_json(
        {"key": "k", "downsampled": False, "steps": [1, 2], "values": [0.5, "nan"]}
    )
    assert (
        raw.steps == [1, 2]
        and raw.values[0] == 0.5
        and math.isnan(raw.values[1])
        and not raw.downsampled
    )
    down = Series.from_json(
        {"key": "k", "downsampled": True, "steps": [9], "values": [1], "min": ["-inf"], "max": [3]}
    )
    assert down.downsampled and down.mins == [-INF] and down.maxs == [3.0]


def test_alert_matches_rule_patterns() -> None:
    assert alert_matches("grad/norm", "grad/norm")
    assert not alert_matches("grad/norm", "grad/norm_clipped")
    assert alert_matches("reward/mean,loss/*", "loss/pg")
    assert alert_matches("*", "anything/at_all")
    assert not alert_matches(None, "grad/norm")


def test_alert_from_json_accepts_the_api_shape() -> None:
    alert = Alert.from_json(
        {
            "id": 7,
            "run_id": "r",
            "rule": "x",
            "metric": "m",
            "severity": "critical",
            "state": "firing",
            "started_step": 12,
            "resolved_step": None,
            "message": "boom",
            "extra": 1,
        }
    )
    assert alert == Alert("7", "r", "x", "m", "critical", "firing", 12, None, "boom")


def test_a_backtest_firing_keeps_its_text_id_through_the_page_store() -> None:
    """The run page keeps a backtest's firings in a store between two callbacks: they come
    back as they went, text id and keys included; the API's shape needs an integer id."""
    firing = Alert("backtest:kl:0", "r", "kl", "mismatch/kl", "critical", "backtest", 32, 40, "up", ("mismatch/kl",))
    assert Alert.from_store(json.loads(json.dumps(firing.to_store()))) == firing
    with pytest.raises(ProtocolError):
        Alert.from_json({**firing.to_store(), "keys": ["mismatch/kl"]})


def test_alert_keys_narrow_a_pattern_rule_to_the_metrics_that_fired() -> None:
    pattern = Alert(
        "1", "r", "non-finite value", "reward/mean,grad/norm", "critical", "firing", 3, None
    )
    assert pattern.on_chart("reward/mean") and pattern.on_chart("grad/norm")
    exact = Alert.from_json(
        {
            "id": 1,
            "run_id": "r",
            "rule": "non-finite value",
            "metric": "reward/mean,grad/norm",
            "severity": "critical",
            "state": "firing",
            "started_step": 3,
            "keys": ["grad/norm"],
        }
    )
    assert exact.on_chart("grad/norm") and not exact.on_chart("reward/mean")


def test_magnitude_of_points_and_of_buckets() -> None:
    raw = magnitude(Series([0, 1, 2, 3], [-2.0, 0.5, NAN, -INF]))
    assert raw.steps == [0, 1, 2, 3] and raw.values[:2] == [2.0, 0.5] and math.isnan(raw.values[2]) and raw.values[3] == INF
    buckets = magnitude(Series([0, 1, 2, 3], [-1.0, 1.0, 0.5, 1.0], mins=[-3.0, -0.5, 0.2, 0.0], maxs=[-0.5, 2.0, 0.9, NAN]))
    assert buckets.mins[:3] == [0.5, 0.0, 0.2] and buckets.maxs[:3] == [3.0, 2.0, 0.9]
    assert math.isnan(buckets.maxs[3])  # a bucket that held a NaN keeps its marker
    assert [p.kind for p in nonfinite_points(buckets)] == ["nan"]
