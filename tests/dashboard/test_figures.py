"""Figure builders: structure the browser relies on, markers that never drop, axes, alerts, bands."""

from __future__ import annotations

import json
import math

import plotly.graph_objects as go
import pytest

from dashboard.figures import (
    HAZARD_TITLE,
    ChartOptions,
    flat_range,
    hazard_figure,
    message_figure,
    metric_figure,
    x_axis_end,
)
from dashboard.series import Alert, Series, all_zero
from dashboard.traces import EDGE_SYMBOL, EDGE_Y, HazardRead, RunLine, run_styles

INF, NAN = math.inf, math.nan


def _line(run_id: str, group: str | None, values: list[float], name: str | None = None) -> RunLine:
    return RunLine(run_id, name or run_id, group, Series(list(range(len(values))), values))


def _roles(figure: dict, role: str) -> list[dict]:
    return [t for t in figure["data"] if t.get("meta", {}).get("role") == role]


THREE = [
    _line("a", "cispo", [1.0, 2.0, 3.0, 4.0]),
    _line("b", "cispo", [1.5, 2.5, NAN, 4.5]),
    _line("c", "is", [0.5, INF, 1.0, -INF]),
]


def test_figure_is_valid_plotly_and_strict_json() -> None:
    figure = metric_figure(
        "reward/mean", THREE, options=ChartOptions(smoothing=0.6), render_id="r1"
    )
    go.Figure(figure)  # raises on any invalid attribute
    json.dumps(figure, allow_nan=False)  # no NaN/Inf floats reach the browser


def test_one_raw_and_one_smoothed_line_per_run_named_after_the_run() -> None:
    figure = metric_figure("reward/mean", THREE, options=ChartOptions(smoothing=0.6))
    raw, smooth = _roles(figure, "raw"), _roles(figure, "smooth")
    assert [t["name"] for t in raw] == ["a", "b", "c"] and [t["meta"]["run"] for t in smooth] == [
        "a",
        "b",
        "c",
    ]
    # Raw shown faintly under the smoothed line; the legend lists each run once.
    assert all(t["opacity"] < 0.5 and not t["showlegend"] for t in raw)
    assert all(t.get("showlegend", True) for t in smooth)
    assert raw[1]["y"] == [1.5, 2.5, None, 4.5]  # NaN is a gap in the line...
    assert smooth[0]["meta"]["ema"]["count"] == 4 and smooth[0]["meta"]["last_step"] == 3


def test_smoothing_off_draws_raw_lines_only() -> None:
    figure = metric_figure("reward/mean", THREE, options=ChartOptions(smoothing=0.0))
    assert not _roles(figure, "smooth")
    assert all(t["showlegend"] and t["opacity"] == 1.0 for t in _roles(figure, "raw"))


def test_non_finite_values_are_edge_markers_never_dropped() -> None:
    figure = metric_figure("reward/mean", THREE, options=ChartOptions(smoothing=0.6))
    markers = {t["meta"]["run"]: t for t in _roles(figure, "nonfinite")}
    assert set(markers) == {"a", "b", "c"}  # present even when empty, so live points can land
    assert markers["a"]["x"] == []
    assert markers["b"]["x"] == [2] and markers["b"]["y"] == [EDGE_Y["nan"]]
    assert markers["c"]["x"] == [1, 3]
    assert markers["c"]["y"] == [EDGE_Y["+inf"], EDGE_Y["-inf"]]
    assert markers["c"]["marker"]["symbol"] == [EDGE_SYMBOL["+inf"], EDGE_SYMBOL["-inf"]]
    assert all(t["yaxis"] == "y2" for t in markers.values())
    # The edge axis is pinned to [0, 1]: zoom and log scale cannot move markers off the plot.
    assert figure["layout"]["yaxis2"] == {
        "overlaying": "y",
        "range": [0, 1],
        "visible": False,
        "fixedrange": True,
    }
    assert EDGE_Y["+inf"] > 0.9 and EDGE_Y["-inf"] < 0.1
    assert "1 NaN, 1 +Inf, 1 −Inf" in figure["layout"]["annotations"][0]["text"]


def test_log_axis_by_metric_and_override() -> None:
    assert metric_figure("mismatch/kl", THREE)["layout"]["yaxis"]["type"] == "log"
    assert metric_figure("grad/norm", THREE)["layout"]["yaxis"]["type"] == "log"
    assert metric_figure("mismatch/ratio_max", THREE)["layout"]["yaxis"]["type"] == "log"
    assert metric_figure("reward/mean", THREE)["layout"]["yaxis"]["type"] == "linear"
    assert (
        metric_figure("mismatch/kl", THREE, options=ChartOptions(log_y=False))["layout"]["yaxis"][
            "type"
        ]
        == "linear"
    )
    assert (
        metric_figure("custom/x", THREE, options=ChartOptions(log_y=True))["layout"]["yaxis"][
            "type"
        ]
        == "log"
    )


def test_layout_meta_is_the_contract_with_the_live_updater() -> None:
    figure = metric_figure(
        "gate/frac", THREE, options=ChartOptions(smoothing=0.25), render_id="abc"
    )
    meta = figure["layout"]["meta"]
    assert meta["key"] == "gate/frac" and meta["render_id"] == "abc" and meta["smoothing"] == 0.25
    assert meta["aggregate"] is False and meta["empty"] is False
    assert meta["edge"]["nan"] == [EDGE_Y["nan"], EDGE_SYMBOL["nan"], "NaN"]
    assert figure["layout"]["xaxis"]["title"]["text"] == "step"
    assert "fraction" in figure["layout"]["yaxis"]["title"]["text"]


def test_colour_by_group_dash_by_seed() -> None:
    styles = run_styles(THREE)
    assert styles["a"].colour == styles["b"].colour != styles["c"].colour
    assert styles["a"].dash != styles["b"].dash
    # A run without a group is its own group.
    solo = run_styles([_line("x", None, [1.0]), _line("y", None, [1.0])])
    assert solo["x"].colour != solo["y"].colour


def test_aggregate_draws_group_mean_with_band_and_keeps_markers() -> None:
    figure = metric_figure(
        "reward/mean", THREE, options=ChartOptions(smoothing=0.0, aggregate="std")
    )
    means = {t["meta"]["group"]: t for t in _roles(figure, "mean")}
    assert set(means) == {"cispo", "is"}
    assert means["cispo"]["name"] == "cispo (n=2)"
    # Step 2: b is NaN, so only a counts.
    assert means["cispo"]["y"] == pytest.approx([1.25, 2.25, 3.0, 4.25])
    assert means["cispo"]["customdata"] == [2, 2, 1, 2]
    assert len(_roles(figure, "band")) == 2 and len(_roles(figure, "member")) == 3
    assert not _roles(figure, "raw")
    assert len(_roles(figure, "nonfinite")) == 3
    assert figure["layout"]["meta"]["aggregate"] is True


def test_a_live_group_band_ends_at_its_slowest_running_member_with_what_the_page_extends_it_from() -> None:
    """While members run, a group's band ends where the slowest running one is (every running
    member has said its value at each step up to there); each member's meta carries its value
    as of that end and its points after it, and the mean says which members run. A member that
    stopped neither holds the band back nor counts after its last step."""
    ahead = _line("a", "g", [1.0, 2.0, 3.0, 4.0, 5.0])
    behind = _line("b", "g", [3.0, 4.0, 5.0])
    stopped = _line("c", "g", [2.0, 2.0])
    options = ChartOptions(smoothing=0.0, aggregate="std")
    figure = metric_figure("reward/mean", [ahead, behind, stopped], options=options, running={"a", "b"})
    (mean,) = _roles(figure, "mean")
    assert mean["x"] == [0, 1, 2] and mean["customdata"] == [3, 3, 2]
    assert mean["y"] == pytest.approx([2.0, 8 / 3, 4.0], rel=1e-4)  # drawn to the digits a pixel shows
    assert mean["meta"]["last_step"] == 2 and mean["meta"]["running"] == ["a", "b"] and mean["meta"]["members"] == ["a", "b", "c"]
    members = {t["meta"]["run"]: t["meta"] for t in _roles(figure, "member")}
    assert members["a"]["asof"] == 3.0 and members["a"]["tail"] == [[3, 4.0], [4, 5.0]] and members["a"]["first_step"] == 0
    assert members["b"]["asof"] == 5.0 and members["b"]["tail"] == []
    assert members["c"]["asof"] is None and members["c"]["tail"] == []  # out of its range at step 2
    (band,) = _roles(figure, "band")
    assert band["meta"]["points"] == 3 and band["x"] == [0, 1, 2, 2, 1, 0]
    # Nothing live: the band spans every step, and the page extends nothing (it asks the server).
    done = metric_figure("reward/mean", [ahead, behind, stopped], options=options)
    assert _roles(done, "mean")[0]["x"] == [0, 1, 2, 3, 4] and _roles(done, "mean")[0]["meta"]["running"] == []
    # A seed restarted beside one that finished ahead of it: the band spans every step as before,
    # and the page leaves it to the server.
    restarted = metric_figure("reward/mean", [ahead, behind], options=options, running={"b"})
    assert _roles(restarted, "mean")[0]["x"] == [0, 1, 2, 3, 4] and _roles(restarted, "mean")[0]["meta"]["running"] == []


def test_downsampled_series_get_a_min_max_envelope() -> None:
    line = RunLine("a", "a", None, Series([10, 20], [1.0, 2.0], mins=[0.5, 1.5], maxs=[9.0, INF]))
    figure = metric_figure("grad/norm", [line], options=ChartOptions(smoothing=0.0))
    (envelope,) = _roles(figure, "envelope")
    assert envelope["x"] == [10, 10] and envelope["y"] == [
        9.0,
        0.5,
    ]  # the Inf bucket is a marker instead
    assert _roles(figure, "nonfinite")[0]["x"] == [20]


def test_alerts_shade_firing_ranges_and_mark_starts() -> None:
    alerts = [
        Alert("1", "a", "mismatch climbing", "mismatch/kl", "warning", "resolved", 1, 2, "kl up"),
        Alert(
            "2",
            "c",
            "non-finite value",
            "reward/mean,mismatch/kl",
            "critical",
            "firing",
            1,
            None,
            "nan",
        ),
        Alert("3", "a", "pending one", "mismatch/kl", "warning", "pending", 0, None, ""),
        Alert("4", "a", "other metric", "grad/norm", "critical", "firing", 0, None, ""),
        Alert("5", "zzz", "other run", "mismatch/kl", "critical", "firing", 0, None, ""),
    ]
    figure = metric_figure("mismatch/kl", THREE, alerts)
    shapes = figure["layout"]["shapes"]
    assert [(s["x0"], s["x1"]) for s in shapes] == [
        (1, 2),
        (1, 3),
    ]  # firing: up to the run's last step
    assert all(s["yref"] == "paper" and s["layer"] == "below" for s in shapes)
    # The live updater stretches the firing ones.
    assert [s["name"] for s in shapes] == ["resolved", "firing:c"]
    (markers,) = _roles(figure, "alerts")
    assert markers["x"] == [1, 1] and markers["yaxis"] == "y2"
    assert "mismatch climbing" in markers["text"][0] and "firing" in markers["text"][1]


def test_empty_and_placeholder_figures() -> None:
    nothing = metric_figure("reward/mean", [_line("a", None, [])])
    assert nothing["layout"]["meta"]["empty"] is True
    assert "waiting for data" in nothing["layout"]["annotations"][0]["text"]
    assert len(_roles(nothing, "raw")) == 1  # still there for live points to extend
    assert (
        "No runs selected" in metric_figure("reward/mean", [])["layout"]["annotations"][0]["text"]
    )
    placeholder = message_figure("Loading…")
    assert (
        placeholder["data"] == [] and placeholder["layout"]["annotations"][0]["text"] == "Loading…"
    )
    go.Figure(placeholder)


def test_zoomed_range_is_kept() -> None:
    figure = metric_figure("reward/mean", THREE, options=ChartOptions(x_range=(1.0, 2.5)))
    assert (
        figure["layout"]["xaxis"]["range"] == [1.0, 2.5]
        and figure["layout"]["xaxis"]["autorange"] is False
    )
    assert figure["layout"]["uirevision"] == "reward/mean|a,b,c"


def test_a_flat_series_gets_a_fixed_range_around_it_not_its_rounding_error() -> None:
    noisy = _line("a", None, [0.3, 0.1 + 0.2] * 10)  # 0.3 up to the last bit
    layout = metric_figure("gate/frac", [noisy], options=ChartOptions(smoothing=0.0))["layout"]
    assert layout["yaxis"]["autorange"] is False
    assert layout["yaxis"]["range"] == pytest.approx([0.27, 0.33])
    assert layout["meta"]["flat"]["range"] == layout["yaxis"]["range"]
    # On a log axis the range is in decades: a tenth of one either side.
    ratio = metric_figure("mismatch/ratio_max", [_line("a", None, [1.0] * 50)])["layout"]
    assert ratio["yaxis"]["type"] == "log" and ratio["yaxis"]["range"] == pytest.approx([-0.1, 0.1])
    assert set(
        _roles(metric_figure("mismatch/ratio_max", [_line("a", None, [1.0] * 50)]), "smooth")[0][
            "y"
        ]
    ) == {1.0}
    # A series that varies (even by a thousandth) autoranges; so does an all-zero one.
    assert (
        "range"
        not in metric_figure("gate/frac", [_line("a", None, [1.0, 1.001])])["layout"]["yaxis"]
    )
    assert (
        "range" not in metric_figure("gate/frac", [_line("a", None, [0.0] * 5)])["layout"]["yaxis"]
    )
    assert flat_range((5.0, 5.0), False) == [4.5, 5.5] and flat_range((-2.0, -2.0), False) == [
        -2.2,
        -1.8,
    ]
    assert flat_range((1.0, 1.5), False) is None and flat_range(None, True) is None


def test_on_a_log_axis_values_at_or_below_zero_are_gaps() -> None:
    line = _line("a", "g", [2.0, 0.0, 3.0, -1.0, 4.0])
    figure = metric_figure("grad/norm", [line], options=ChartOptions(smoothing=0.5))
    assert _roles(figure, "raw")[0]["y"] == [2.0, None, 3.0, None, 4.0]
    assert all(v is None or v > 0 for v in _roles(figure, "smooth")[0]["y"])
    # Linear axes draw them as they are.
    linear = metric_figure("grad/norm", [line], options=ChartOptions(smoothing=0.0, log_y=False))
    assert _roles(linear, "raw")[0]["y"] == [2.0, 0.0, 3.0, -1.0, 4.0]
    # A downsampled bucket whose minimum is ≤ 0 keeps its band down to its own value.
    bucketed = RunLine(
        "a", "a", None, Series([10, 20], [1.0, 2.0], mins=[0.0, 1.5], maxs=[9.0, 3.0])
    )
    (envelope,) = _roles(metric_figure("grad/norm", [bucketed]), "envelope")
    assert envelope["y"] == [9.0, 3.0, 1.5, 1.0]
    # Group bands reaching below 0 are cut at the mean.
    spread = [_line("a", "g", [1.0, 1.0]), _line("b", "g", [0.01, 0.01])]
    aggregated = metric_figure(
        "grad/norm", spread, options=ChartOptions(smoothing=0.0, aggregate="std")
    )
    (band,) = _roles(aggregated, "band")
    assert all(v is not None and v > 0 for v in band["y"])


def test_a_log_chart_with_nothing_positive_is_drawn_linear_with_a_note() -> None:
    zeros = metric_figure("mismatch/kl", [_line("a", None, [0.0, 0.0, NAN])])
    assert zeros["layout"]["yaxis"]["type"] == "linear"
    assert zeros["layout"]["meta"]["log_fallback"] is True
    notes = [a["text"] for a in zeros["layout"]["annotations"]]
    assert "all values are 0; a log axis cannot show them<br>drawn on a linear axis" in notes
    assert _roles(zeros, "raw")[0]["y"] == [0.0, 0.0, None]
    negative = metric_figure("mismatch/kl", [_line("a", None, [0.0, -1.0])])["layout"]
    assert any("no value is above 0" in a["text"] for a in negative["annotations"])
    # One positive value anywhere keeps the log axis; no finite value at all keeps it too.
    mixed = metric_figure("mismatch/kl", [_line("a", None, [0.0]), _line("b", None, [1e-3])])
    assert mixed["layout"]["yaxis"]["type"] == "log" and not mixed["layout"]["meta"]["log_fallback"]
    assert (
        metric_figure("mismatch/kl", [_line("a", None, [NAN])])["layout"]["yaxis"]["type"] == "log"
    )
    # The note is about the log axis only.
    assert metric_figure("reward/mean", [_line("a", None, [0.0])])["layout"]["annotations"] == []


def test_hazard_figure_one_line_per_run_in_its_colour_on_a_probability_axis() -> None:
    lines = [
        RunLine("a", "a", "cispo", Series([30, 31, 32], [0.01, 0.2, 0.9])),
        RunLine("b", "b", "cispo", Series([30, 31], [0.02, 0.03])),
        RunLine("c", "c", "is", Series.empty()),  # still warming up: a line with no points
    ]
    figure = hazard_figure(lines, 50, height=330, render_id="h1")
    go.Figure(figure)
    json.dumps(figure, allow_nan=False)
    layout = figure["layout"]
    assert HAZARD_TITLE == "collapse hazard" and HAZARD_TITLE in layout["title"]["text"]
    assert layout["yaxis"]["title"]["text"] == "P(collapse within 50 steps)"
    assert layout["yaxis"]["range"] == [0, 1] and layout["yaxis"]["autorange"] is False
    traces = figure["data"]
    assert [(t["meta"]["run"], t["meta"]["role"]) for t in traces] == [("a", "hazard"), ("b", "hazard"), ("c", "hazard")]
    assert traces[0]["x"] == [30, 31, 32] and traces[0]["y"] == [0.01, 0.2, 0.9] and traces[2]["x"] == []
    # The colours and dashes of the metric charts: colour by group, dash by run within it.
    styles = run_styles(lines)
    assert [(t["line"]["color"], t["line"]["dash"]) for t in traces] == [(styles[r].colour, styles[r].dash) for r in "abc"]
    assert traces[0]["line"]["color"] == traces[1]["line"]["color"] != traces[2]["line"]["color"]
    assert layout["meta"]["render_id"] == "h1" and not layout["meta"]["empty"] and not layout["annotations"]
    # A short chart breaks its label in two; no run known: no horizon, and a note.
    assert hazard_figure(lines, 50, height=220)["layout"]["yaxis"]["title"]["text"] == "P(collapse within<br>50 steps)"
    empty = hazard_figure([], None)
    assert empty["data"] == [] and empty["layout"]["yaxis"]["title"]["text"] == "P(collapse)"
    assert empty["layout"]["annotations"][0]["text"] == "No runs selected"
    waiting = hazard_figure([RunLine("c", "c", None, Series.empty())], 50)
    assert waiting["layout"]["meta"]["empty"] and "No hazard yet" in waiting["layout"]["annotations"][0]["text"]


def test_hazard_figure_marks_where_a_reward_fell_and_says_what_it_does_not_read() -> None:
    lines = [RunLine("a", "a", "cispo", Series([30, 31], [0.2, 0.9])), RunLine("b", "b", "is", Series([30], [0.1]))]
    reads = {
        "a": HazardRead(fell_at=32, collapsed=True, warmup=30),
        "b": HazardRead(fell_at=30, collapsed=False, warmup=30, missing=("mismatch/kl", "mismatch/ratio_max")),
    }
    layout = hazard_figure(lines, 50, reads=reads)["layout"]
    styles = run_styles(lines)
    assert [(shape["x0"], shape["line"]["color"]) for shape in layout["shapes"]] == [(32, styles["a"].colour), (30, styles["b"].colour)]
    texts = [note["text"] for note in layout["annotations"]]
    assert texts == ["a: collapsed at step 32", "b: falling since step 30", "b: read without mismatch/kl, mismatch/ratio_max (not logged)"]
    # One run: its marks need no name. No hazard yet: warming up, or nothing it reads is logged.
    one = hazard_figure(lines[:1], 50, reads=reads)["layout"]
    assert [note["text"] for note in one["annotations"]] == ["collapsed at step 32"]
    warming = hazard_figure([RunLine("c", "c", None, Series.empty())], 50, reads={"c": HazardRead(warmup=30)})
    assert warming["layout"]["annotations"][0]["text"] == "Warming up — the hazard starts once a run has logged 30 steps of what it reads"
    blind = HazardRead(warmup=30, missing=("reward/mean", "mismatch/kl", "mismatch/ratio_max", "grad/norm"))
    none = hazard_figure([RunLine("c", "c", None, Series.empty())], 50, reads={"c": blind})
    assert none["layout"]["annotations"][0]["text"] == (
        "No hazard: it reads reward/mean, mismatch/kl, mismatch/ratio_max or grad/norm, and this run logs none of them"
    )


def test_a_long_band_is_drawn_at_half_the_line_resolution_and_keeps_every_spike() -> None:
    from dashboard.traces import ENVELOPE_POINTS

    n = 2 * ENVELOPE_POINTS + 1
    steps = list(range(10, 10 * n + 1, 10))
    series = Series(steps, [1.0] * n, mins=[0.5] * n, maxs=[100.0 if i == 301 else 2.0 for i in range(n)])
    (envelope,) = _roles(metric_figure("reward/mean", [RunLine("a", "a", None, series)], options=ChartOptions(log_y=False)), "envelope")
    half = len(envelope["x"]) // 2
    assert half <= ENVELOPE_POINTS and envelope["x"][:half] == envelope["x"][half:][::-1]
    upper = envelope["y"][:half]
    assert upper.count(100.0) == 1 and max(upper) == 100.0 and min(envelope["y"][half:]) == 0.5
    assert envelope["x"][half - 1] == steps[-1]  # the band reaches the line's last step


def test_the_entropy_chart_draws_each_runs_learned_level_as_a_dashed_line_in_its_colour() -> None:
    entropy = [_line("a", "cispo", [2.0, 1.5, 1.0]), _line("b", "is", [1.8, 1.7, 1.6]), _line("c", "is", [1.0, 1.1])]
    figure = metric_figure("policy/entropy", entropy, levels={"a": 1.5, "b": 0.25, "c": None}, render_id="r")
    go.Figure(figure)
    layout = figure["layout"]
    assert layout["yaxis"]["type"] == "log"
    styles = run_styles(entropy)
    lines = {shape["name"]: shape for shape in layout["shapes"] if shape["name"].startswith("level:")}
    assert set(lines) == {"level:a", "level:b"}
    for run, level in (("a", 1.5), ("b", 0.25)):
        shape = lines[f"level:{run}"]
        assert (shape["type"], shape["xref"], shape["x0"], shape["x1"]) == ("line", "paper", 0, 1)
        assert shape["y0"] == shape["y1"] == level
        assert shape["line"]["dash"] == "dash" and shape["line"]["color"] == styles[run].colour
    assert lines["level:a"]["label"]["text"] == "learned level 1.5 (a)"
    assert layout["meta"]["levels"] == {"a": 1.5, "b": 0.25, "c": None}
    assert layout["meta"]["pending"] == ["c"]  # the live updater asks again as its points come
    assert any(note["text"] == "learned level: not yet for c" for note in layout["annotations"])
    # One run: its level unnamed; no level asked for (another chart): none drawn, none in meta.
    (alone,) = [s for s in metric_figure("policy/entropy", entropy[:1], levels={"a": 1.5})["layout"]["shapes"]]
    assert alone["label"]["text"] == "learned level 1.5"
    plain = metric_figure("policy/entropy", entropy)["layout"]
    assert plain["shapes"] == [] and "levels" not in plain["meta"]


def test_the_loss_magnitude_chart_names_what_each_run_draws() -> None:
    total = RunLine("a", "a", None, Series([0, 1], [0.5, 2.0]), key="loss/total")
    pg = RunLine("b", "b", None, Series([0, 1], [0.25, 0.75]), key="loss/pg")
    alert = Alert("1", "a", "loss growing", "loss/total,loss/pg", "critical", "firing", 1, None, "loss up")
    figure = metric_figure("|loss|", [total, pg], [alert], ChartOptions(smoothing=0.0))
    go.Figure(figure)
    layout = figure["layout"]
    assert layout["yaxis"]["type"] == "log" and layout["yaxis"]["title"]["text"] == "|loss| (sign dropped)"
    assert "Loss magnitude" in layout["title"]["text"] and "|loss/total|, |loss/pg|" in layout["title"]["text"]
    assert layout["meta"]["keys"] == ["loss/total", "loss/pg"] and layout["meta"]["of"] == "magnitude"
    assert {t["meta"]["run"]: t["meta"]["key"] for t in _roles(figure, "raw")} == {"a": "loss/total", "b": "loss/pg"}
    assert _roles(figure, "alerts")[0]["x"] == [1]  # an alert on the loss is on its magnitude's chart
    only_total = metric_figure("|loss|", [total])["layout"]["title"]["text"]
    assert "|loss/total|" in only_total and "loss/pg" not in only_total


def test_the_length_chart_draws_the_cap_beside_each_run_that_logs_it() -> None:
    length = [_line("a", "cispo", [100.0, 300.0, 512.0]), _line("b", "is", [80.0, 90.0, 95.0])]
    cap = RunLine("a", "a", "cispo", Series([0, 1, 2], [512.0, 512.0, 512.0]), key="response/length_cap")
    figure = metric_figure("response/length_mean", length, companions=[cap], options=ChartOptions(smoothing=0.6))
    go.Figure(figure)
    (companion,) = _roles(figure, "companion")
    assert companion["y"] == [512.0, 512.0, 512.0] and companion["x"] == [0, 1, 2]
    assert companion["meta"] == {"run": "a", "role": "companion", "last_step": 2, "key": "response/length_cap"}
    assert companion["line"]["dash"] == "dash" and companion["line"]["color"] == run_styles(length)["a"].colour
    meta = figure["layout"]["meta"]
    assert meta["keys"] == ["response/length_mean", "response/length_cap"] and meta["of"] == "value"
    assert figure["layout"]["yaxis"]["title"]["text"] == "tokens (mean per answer)"
    truncated = metric_figure("response/truncated_frac", length)["layout"]
    assert truncated["yaxis"]["type"] == "linear" and "(0–1)" in truncated["yaxis"]["title"]["text"]


@pytest.mark.parametrize(
    ("key", "title", "unit", "log"),
    [
        ("policy/clip_frac", "PPO clip fraction", "share of tokens clipped", "linear"),
        ("policy/ppo_kl", "PPO KL", "KL(π_old‖π), nats", "log"),
        ("reward/zero_std_frac", "Prompts without reward spread", "share of prompts (0–1)", "linear"),
        ("policy/entropy", "Policy entropy", "nats / token", "log"),
        ("custom/thing", "custom/thing", "thing", "linear"),  # an unknown metric: its own name
    ],
)
def test_metrics_of_the_signature_rules_have_titles_and_units(key: str, title: str, unit: str, log: str) -> None:
    layout = metric_figure(key, THREE[:1])["layout"]
    assert f"<b>{title}</b>" in layout["title"]["text"] and layout["yaxis"]["title"]["text"] == unit
    assert layout["yaxis"]["type"] == log


def test_a_growing_chart_leaves_round_room_on_the_right() -> None:
    assert x_axis_end(0, 5) == 20  # at least 10 steps, rounded up to a multiple of 10
    assert x_axis_end(0, 71) == 90  # 71 + 10 = 81, up to the next 10
    assert x_axis_end(0, 305) == 340  # 305 + 30.5, up to the next 20
    assert x_axis_end(0, 290) == 320
    for newest in range(0, 2000, 7):
        end = x_axis_end(0, newest)
        assert newest + max(10, newest / 10) <= end < newest + 2 * max(10, newest / 10)
    layout = metric_figure("reward/mean", THREE, running={line.run_id for line in THREE})["layout"]
    newest = max(line.series.steps[-1] for line in THREE)
    assert layout["xaxis"]["autorangeoptions"] == {"include": [x_axis_end(0, newest)]}
    assert layout["meta"]["x_end"] == x_axis_end(0, newest)
    assert "autorangeoptions" not in metric_figure("reward/mean", THREE)["layout"]["xaxis"]  # a finished run
    zoomed = metric_figure("reward/mean", THREE, options=ChartOptions(x_range=(1.0, 2.0)), running={line.run_id for line in THREE})["layout"]
    assert "autorangeoptions" not in zoomed["xaxis"]


def test_a_metric_the_loss_does_not_use_is_said_not_drawn() -> None:
    gating = _line("a", "cispo", [0.1, 0.2, 0.0])
    not_gating = [RunLine(r, f"is-s{i}", "is", Series([0, 1, 2], [0.0] * 3)) for i, r in enumerate("bc")]
    alone = metric_figure("gate/frac", not_gating, unused={"b": "importance_sampling", "c": "importance_sampling"})
    assert [t for t in alone["data"] if t["meta"].get("role") == "raw"] == []
    assert [a["text"] for a in alone["layout"]["annotations"]] == [
        "not used by importance_sampling (is-s0, is-s1): 0 at every step (it gated nothing)"
    ]
    assert alone["layout"]["yaxis"]["visible"] is False and alone["layout"]["meta"]["unused"] == ["b", "c"]
    both = metric_figure("gate/frac", [gating, *not_gating], unused={"b": "importance_sampling", "c": None})
    assert [t["meta"]["run"] for t in both["data"] if t["meta"].get("role") == "raw"] == ["a"]
    assert [a["text"] for a in both["layout"]["annotations"]] == [
        "not used by importance_sampling (is-s0); this run's loss (is-s1): 0 at every step (it gated nothing)"
    ]
    # The runs drawn keep the colour and dash they have on the other charts.
    drawn = metric_figure("reward/mean", [gating, *not_gating])
    style = next(t["line"] for t in drawn["data"] if t["meta"].get("role") == "raw" and t["meta"]["run"] == "a")
    assert next(t["line"] for t in both["data"] if t["meta"].get("role") == "raw")["color"] == style["color"]
    assert all_zero(not_gating[0].series) and not all_zero(gating.series) and not all_zero(Series.empty())


def test_a_guards_rollbacks_are_dotted_lines_across_every_chart_in_the_runs_colour() -> None:
    lines = [RunLine("g", "guarded", "ppo", Series([0, 1, 2], [0.1, 0.2, 0.3])), RunLine("t", "twin", "ppo", Series([0, 1, 2], [0.1, 0.2, 0.1]))]
    figure = metric_figure("reward/mean", lines, rollbacks={"g": [1, 2]})
    styles = run_styles(lines)
    marks = [s for s in figure["layout"]["shapes"] if s.get("name", "").startswith("rollback:")]
    assert [(s["name"], s["x0"], s["x1"], s["line"]["color"]) for s in marks] == [
        ("rollback:g", 1, 1, styles["g"].colour), ("rollback:g", 2, 2, styles["g"].colour)
    ]
    assert not [s for s in metric_figure("reward/mean", lines)["layout"]["shapes"] if s.get("name", "").startswith("rollback:")]
