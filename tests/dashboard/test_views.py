"""Pure pieces of the pages: summary rows, runs-table rows and filters, URL parsing, zoom events."""

from __future__ import annotations

import math

import pytest

from dashboard.series import Alert, Series
from dashboard.summary import (
    Headline,
    last_finite,
    peak,
    series_max,
    summarise_group,
    summarise_run,
)
from dashboard.views.charts import UNCHANGED, zoom_range
from dashboard.views.compare import parse_runs
from dashboard.views.run import order_keys
from dashboard.views.runs import filter_runs, health, run_rows

INF, NAN = math.inf, math.nan


def _alert(severity: str, step: int | None, state: str = "firing", run_id: str = "r") -> Alert:
    return Alert("1", run_id, "rule", "m", severity, state, step, None, "")


def test_summary_statistics_keep_spikes_and_infinities() -> None:
    reward = Series([0, 10, 20], [0.1, 0.9, NAN], mins=[0.0, 0.2, 0.3], maxs=[0.5, 0.95, NAN])
    assert last_finite(reward) == (10, 0.9)
    assert peak(reward) == (0.95, 10)  # the bucket max, not the bucket's last value
    assert series_max(Series([0, 1], [1.0, INF])) == INF
    assert series_max(Series([0], [NAN])) is None and series_max(Series.empty()) is None


def test_a_headline_takes_the_tally_of_pushed_points_once() -> None:
    read = Headline.of(
        {
            "reward/mean": Series([0, 1, 2], [0.2, 0.8, 0.6]),
            "mismatch/kl": Series([0, 1, 2], [0.01, 0.3, 0.2]),
            "grad/norm": Series([0, 1, 2], [1.0, NAN, 2.0]),
        }
    )
    assert read == Headline(final=(2, 0.6), peak=(1, 0.8), max_kl=0.3, max_ratio=None, nonfinite=1, through=2)
    tally = {
        "reward/mean": {"last": [4, 0.5], "top": [3, 0.9], "inf": False, "bad": [], "to": 4},
        "mismatch/kl": {"last": [4, 0.1], "top": [3, 0.2], "inf": False, "bad": [], "to": 4},
        "mismatch/ratio_max": {"last": None, "top": None, "inf": True, "bad": [4], "to": 4},
        # A NaN the read counted already (step 1) and one it did not.
        "grad/norm": {"last": [4, 3.0], "top": [4, 3.0], "inf": False, "bad": [1, 3], "to": 4},
        "not/summarised": {"last": [9, 1e9], "top": [9, 1e9], "inf": True, "bad": [9], "to": 9},
    }
    merged = read.merged(tally)
    assert merged == Headline(final=(4, 0.5), peak=(3, 0.9), max_kl=0.3, max_ratio=math.inf, nonfinite=3, through=4)
    assert merged.merged(tally) == merged  # what it took already counts once
    # An older final or a lower top does not replace what was read; a tally sent again changes nothing.
    assert read.merged({"reward/mean": {"last": [1, 0.1], "top": [0, 0.3], "bad": [], "to": 1}}) == read
    assert Headline.from_json(merged.to_json()) == merged  # through the page's store (+Inf as text)
    assert Headline().merged(tally).final == (4, 0.5)  # a run that had no points when read
    row = summarise_run("a", None, merged, []).row()
    assert (row["final_reward"], row["peak_reward"], row["peak_step"], row["max_ratio"], row["nonfinite"]) == (0.5, 0.9, 3, "+Inf", 3)


def test_summarise_run_and_group() -> None:
    a = summarise_run(
        "a",
        "cispo",
        Headline.of(
            {
                "reward/mean": Series([0, 1], [0.2, 0.8]),
                "mismatch/kl": Series([0, 1], [0.01, 0.3]),
                "grad/norm": Series([0, 1], [1.0, INF]),
            }
        ),
        [_alert("warning", 3), _alert("critical", 9), _alert("critical", 5)],
    )
    assert (a.final_reward, a.peak_reward, a.peak_step) == (0.8, 0.8, 1)
    assert (
        a.first_critical_step == 5 and a.max_kl == 0.3 and a.max_ratio is None and a.nonfinite == 1
    )
    row = summarise_run("b", "cispo", Headline.of({"mismatch/ratio_max": Series([0], [INF])}), []).row()
    assert (
        row["max_ratio"] == "+Inf"
        and row["final_reward"] is None
        and row["first_critical_step"] is None
    )
    b = summarise_run("b", "cispo", Headline.of({"reward/mean": Series([0], [0.4])}), [])
    group = summarise_group("cispo", [a, b])
    assert (
        group.runs == 2
        and group.final_reward == pytest.approx(0.6)
        and group.first_critical_step == 5
    )


def test_the_summary_peak_hazard_is_the_highest_of_the_run_and_of_the_group() -> None:
    """A run's peak hazard is the highest of its hazard series, with its step (the first, on a
    tie); a group's is the highest of its runs'; a run still warming up has none."""
    a = summarise_run("a", "cispo", Headline(), [], Series([30, 31, 32, 33], [0.1, 0.7, 0.4, 0.7]))
    assert (a.peak_hazard, a.peak_hazard_step) == (0.7, 31)
    b = summarise_run("b", "cispo", Headline(), [], Series([30, 40], [0.2, 0.9]))
    warming = summarise_run("c", "cispo", Headline(), [], Series.empty())
    assert warming.peak_hazard is None and warming.peak_hazard_step is None
    assert summarise_run("d", None, Headline(), []).row()["peak_hazard"] is None  # no hazard read
    assert (a.row()["peak_hazard"], a.row()["peak_hazard_step"]) == (0.7, 31)
    group = summarise_group("cispo", [a, warming, b])
    assert group.peak_hazard == 0.9 and group.peak_hazard_step is None
    assert summarise_group("cispo", [warming]).row()["peak_hazard"] is None


def test_health_badge() -> None:
    assert health(None) == ("n/a", "unknown")
    assert health([]) == ("ok", "ok")
    assert health([_alert("warning", 1)]) == ("warning · 1", "warning")
    assert health([_alert("warning", 1), _alert("critical", 2)]) == ("critical · 2", "critical")


RUNS = [
    {
        "id": "1",
        "name": "a",
        "project": "p",
        "group": "cispo",
        "tags": ["toy", "lag8"],
        "status": "running",
        "last_step": 9,
        "hazard": 0.25,
    },
    {
        "id": "2",
        "name": "b",
        "project": "p",
        "group": None,
        "tags": [],
        "status": "killed",
        "last_step": None,
    },
    {
        "id": "3",
        "name": "c",
        "project": "q",
        "group": "is",
        "tags": ["toy"],
        "status": "silent",
        "last_step": 3,
    },
]


def test_filter_runs_by_project_group_tag_status() -> None:
    names = lambda runs: [r["name"] for r in runs]  # noqa: E731
    assert names(filter_runs(RUNS, {})) == ["a", "b", "c"]
    assert names(filter_runs(RUNS, {"project": ["p"]})) == ["a", "b"]
    assert names(filter_runs(RUNS, {"group": ["(none)", "is"]})) == ["b", "c"]
    assert names(filter_runs(RUNS, {"tag": ["lag8"]})) == ["a"]
    assert names(filter_runs(RUNS, {"status": ["failed"]})) == ["b"]  # killed shows as failed
    assert names(filter_runs(RUNS, {"status": ["live"], "tag": ["toy"]})) == ["a"]
    assert names(filter_runs(RUNS, {"status": [], "project": None})) == ["a", "b", "c"]


def test_run_rows_carry_last_values_status_and_health() -> None:
    latest = {"1": {"reward/mean": Series([9], [0.5]), "grad/norm": Series([9], [INF])}}
    rows = run_rows(RUNS, latest, {"1": [_alert("critical", 4, run_id="1")]})
    first = rows[0]
    assert (
        first["name"] == "[a](/runs/1)"
        and first["status"] == "live"
        and first["health"] == "critical · 1"
    )
    assert (
        first["reward/mean"] == 0.5
        and first["grad/norm"] == "+Inf"
        and first["mismatch/kl"] is None
    )
    assert (
        rows[1]["status"] == "failed" and rows[1]["health"] == "ok" and rows[2]["status"] == "silent"
    )
    assert run_rows(RUNS, {}, None)[0]["health"] == "n/a"
    # The current hazard of a running run; none on the others, nor while one warms up.
    assert [row["hazard"] for row in rows] == [0.25, None, None]
    assert run_rows([{**RUNS[0], "hazard": None}], {}, None)[0]["hazard"] is None
    assert run_rows([{**RUNS[2], "hazard": 0.9}], {}, None)[0]["hazard"] is None  # a silent run shows none


def test_parse_runs_and_key_order() -> None:
    assert parse_runs("?runs=a,b,,a&x=1") == ["a", "b"]
    assert parse_runs("?runs=a%2Cb") == ["a", "b"]
    assert parse_runs("") == [] and parse_runs(None) == []
    assert order_keys(["perf/step_s", "grad/norm", "reward/mean", "loss/pg", "x"]) == [
        ("headline", ["reward/mean", "grad/norm"]),
        ("signals", ["|loss|"]),  # the loss's magnitude; its signed chart stays with its namespace
        ("loss", ["loss/pg"]),
        ("other", ["x"]),
        ("perf", ["perf/step_s"]),
    ]
    # The signals a run logs follow the headline charts, in one order; what they draw as
    # logged (the entropy, the length and its cap, the truncated share) has no second chart.
    logged = [
        "response/length_cap", "policy/entropy", "response/truncated_frac", "response/length_mean",
        "loss/total", "loss/pg", "policy/clip_frac", "reward/mean",
    ]
    assert order_keys(logged) == [
        ("headline", ["reward/mean"]),
        ("signals", ["policy/entropy", "|loss|", "response/length_mean", "response/truncated_frac"]),
        ("loss", ["loss/pg", "loss/total"]),
        ("policy", ["policy/clip_frac"]),
    ]
    assert order_keys(["response/length_cap", "x"]) == [("other", ["x"]), ("response", ["response/length_cap"])]
    assert order_keys(["reward/mean", "x"]) == [("headline", ["reward/mean"]), ("other", ["x"])]


def test_zoom_range_from_relayout_events() -> None:
    assert zoom_range({"xaxis.range[0]": 10.5, "xaxis.range[1]": 20}) == (10.5, 20.0)
    assert zoom_range({"xaxis.range": [1, 2]}) == (1.0, 2.0)
    assert zoom_range({"xaxis.autorange": True, "yaxis.autorange": True}) is None
    assert zoom_range({"autosize": True}) == UNCHANGED
    assert zoom_range({"yaxis.range[0]": 0, "yaxis.range[1]": 1}) == UNCHANGED
    assert zoom_range(None) == UNCHANGED
