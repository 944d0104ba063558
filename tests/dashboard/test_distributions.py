"""Quantiles and shares from per-step histograms, and the figures built on them (pure)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dashboard.detail_figures import (
    Distribution,
    distribution_figure,
    edge_label,
    fit_text,
    sequences_figure,
)
from dashboard.distributions import histogram_quantile, occupied_bins, shares, signed_log_ticks
from dashboard.views.details import parse_step


def test_quantiles_by_hand() -> None:
    edges = [0.0, 1.0, 2.0, 3.0]
    counts = [1, 1, 2]
    median = histogram_quantile(edges, counts, 0.5)  # 2 of 4 counted by the end of bin 1
    assert median is not None and (median.value, median.position) == (2.0, 2.0)
    p75 = histogram_quantile(edges, counts, 0.75)  # 3 of 4: half way through bin 2
    assert p75 is not None and (p75.value, p75.position) == (2.5, 2.5)
    p10 = histogram_quantile(edges, counts, 0.1)  # 0.4 of bin 0's one count
    assert p10 is not None and p10.value == pytest.approx(0.4) and p10.position == pytest.approx(0.4)
    # Bins of unequal width: the value interpolates in ℓ, the position in bin units.
    wide = histogram_quantile([-10.0, -1.0, 0.0, 0.01], [0, 4, 4], 0.75)
    assert wide is not None and wide.value == pytest.approx(0.005) and wide.position == pytest.approx(2.5)
    empty_first = histogram_quantile([0.0, 1.0, 2.0], [0, 3], 0.0)
    assert empty_first is not None and empty_first.value == 1.0  # the lowest value counted
    assert histogram_quantile([0.0, 1.0], [0], 0.5) is None


def test_quantiles_match_numpy_on_values_spread_within_their_bins() -> None:
    """Values uniform within each bin are what the interpolation assumes: numpy's quantile of
    them agrees to the rounding of one value's rank."""
    rng = np.random.default_rng(3)
    edges = np.concatenate([-np.logspace(1, -3, 25), [0.0], np.logspace(-3, 1, 25)])
    counts = rng.integers(0, 400, size=len(edges) - 1)
    counts[:5] = 0
    values = np.concatenate([rng.uniform(edges[i], edges[i + 1], size=c) for i, c in enumerate(counts)])
    for q in (0.001, 0.01, 0.5, 0.99, 0.999):
        found = histogram_quantile(list(edges), [int(c) for c in counts], q)
        assert found is not None
        bin_index = int(math.floor(found.position))
        width = edges[min(bin_index + 1, len(edges) - 1)] - edges[bin_index]
        assert found.value == pytest.approx(float(np.quantile(values, q)), abs=max(width * 0.05, 1e-9) + width * 2 / counts[bin_index])


def test_shares_occupied_bins_and_ticks() -> None:
    assert shares([1, 3]) == [0.25, 0.75]
    assert shares([1, 3], total=8) == [0.125, 0.375]
    assert shares([0, 0]) == [0.0, 0.0]
    assert occupied_bins([[0, 1, 0, 0], [0, 0, 2, 0]]) == (1, 2)
    assert occupied_bins([[0, 0]]) is None
    edges = [-10.0, -5.0, -1.0, -0.5, -0.1, -0.05, 0.0, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0]
    assert signed_log_ticks(edges) == [0, 2, 4, 6, 8, 10, 12]  # 0 and the powers of ten
    assert signed_log_ticks(edges, 4, 8) == [4, 6, 8]
    assert len(signed_log_ticks(edges, most=4)) <= 4
    monitor = [-1.0, -0.1, -0.01, -1e-4, 1e-4, 0.01, 0.1, 1.0]  # a narrow bin around zero
    assert signed_log_ticks(monitor) == [0, 2, 4, 6]  # ±1e-4 on neighbouring rows: one label
    assert edge_label(-0.01) == "−0.01" and edge_label(1e-5) == "1e-5" and edge_label(0.0) == "0"


def test_the_heatmap_holds_each_steps_share_of_its_tokens_in_the_occupied_bins() -> None:
    edges = [-1.0, -0.1, 0.0, 0.1, 1.0, 10.0]
    dist = Distribution("mismatch/log_ratio", edges, [10, 20], [[0, 2, 6, 2, 0], [0, 1, 5, 3, 1]])
    figure = distribution_figure(dist, title="t")
    heat = figure["data"][0]
    assert figure["layout"]["meta"]["first_bin"] == 1
    assert heat["y"] == [1, 2, 3, 4, 5]  # rows 1..4 (bin 0 is empty at every step): their boundaries
    expected = [[0.2, 0.1], [0.6, 0.5], [0.2, 0.3], [None, 0.1]]
    for row, want in zip(heat["z"], expected, strict=True):
        for z, share in zip(row, want, strict=True):
            assert (z is None and share is None) or 10**z == pytest.approx(share, rel=1e-2)
    quantiles = {t["name"]: t for t in figure["data"][1:]}
    assert not any(t["meta"]["role"] == "nonfinite" for t in figure["data"])
    assert set(quantiles) == {"p0.1", "p1", "p99", "p99.9"}
    p99 = histogram_quantile(edges, [0, 1, 5, 3, 1], 0.99)
    assert p99 is not None and quantiles["p99"]["customdata"][1] == pytest.approx(p99.value, rel=1e-3)
    # Tokens with NaN ℓ are in no bin: marked on the top edge with their count.
    with_nan = Distribution.from_json({"key": "k", "edges": edges, "steps": [10, 20], "counts": dist.counts, "nan": [0, 7]})
    (marks,) = [t for t in distribution_figure(with_nan, title="t")["data"] if t["meta"]["role"] == "nonfinite"]
    assert marks["x"] == [20] and marks["customdata"] == [7]
    # A subset (the unbounded tokens) shared out of every token of its step.
    subset = Distribution("mismatch/log_ratio_unbounded", edges, [10, 20], [[0, 0, 0, 1, 0], [0, 0, 0, 2, 1]])
    heat = distribution_figure(subset, title="t", totals=[10, 10])["data"][0]
    assert 10 ** heat["z"][0][0] == pytest.approx(0.1, rel=1e-2) and 10 ** heat["z"][1][1] == pytest.approx(0.1, rel=1e-2)


def test_the_length_scatter_draws_the_servers_fit() -> None:
    payload = {
        "steps": [1, 1, 2],
        "length": [100, 200, 300],
        "log_ratio": [-0.1, "nan", -0.3],
        "fit": {"slope_per_1k": -1.0, "intercept": 0.0, "n": 2},
    }
    figure = sequences_figure(payload, title="t")
    points, line = figure["data"]
    assert points["x"] == [100.0, 300.0] and points["customdata"] == [1, 2]  # the NaN pair is not drawn
    assert line["x"] == [100.0, 300.0] and line["y"] == pytest.approx([-0.1, -0.3])
    assert fit_text(payload["fit"]) == "Σℓ slope: −1 per 1,000 tokens (n = 2)"
    assert figure["layout"]["annotations"][0]["text"] == fit_text(payload["fit"])
    same_length = sequences_figure({"steps": [1, 1], "length": [4, 4], "log_ratio": [0.1, 0.2], "fit": None}, title="t")
    assert [t["meta"]["role"] for t in same_length["data"]] == ["sequences"]
    assert "same length" in same_length["layout"]["annotations"][0]["text"]


def test_parse_step() -> None:
    assert parse_step("?step=120") == 120
    assert parse_step("?runs=a&step=7") == 7
    assert parse_step("?step=-1") is None and parse_step("?step=x") is None and parse_step(None) is None
