"""The statistics and the verdict of parity (dashboard/parity.py), shared by `keel parity`
and the compare page's parity view: the per-step rank-sum test, Holm, the tolerance, and the
histogram's tail shares."""

from __future__ import annotations

import itertools
import json
import math
import random

import numpy as np
import pytest

import dashboard.parity as parity
from dashboard.parity import (
    EXIT_DIFFERENT,
    EXIT_INCOMPARABLE,
    EXIT_SAME,
    HISTOGRAM_KEY,
    _midranks,
    compare,
    histogram_values,
    holm,
    mann_whitney_p,
    min_attainable_p,
    pool,
    tail_key,
)
from tests.support.step_details import EDGES, histogram

# -- the statistic on synthetic per-step values -----------------------------------------------


def _steps(rng: random.Random, count: int, median: float, spread: float = 0.5) -> list[float]:
    """Per-step values of a metric that varies from step to step: log-normal around `median`."""
    return [median * math.exp(rng.gauss(0, spread)) for _ in range(count)]


def _brute_force_p(a: list[float], b: list[float]) -> float:
    """The two-sided rank-sum p-value by enumerating every split of the pooled values."""
    ranks, _ = _midranks([*a, *b])
    center = len(a) * (len(a) + len(b) + 1) / 2
    observed = abs(sum(ranks[: len(a)]) - center)
    splits = list(itertools.combinations(range(len(ranks)), len(a)))
    extreme = sum(abs(sum(ranks[i] for i in split) - center) >= observed - 1e-9 for split in splits)
    return extreme / len(splits)


def test_the_exact_p_value_is_the_permutation_distribution_of_the_rank_sum_ties_included() -> None:
    rng = random.Random(7)
    for trial in range(150):
        a = [float(rng.choice([0, 0, 1, 2, 2.5, 3])) for _ in range(rng.randint(1, 7))]
        b = [float(rng.choice([0, 1, 2, 3, 4])) for _ in range(rng.randint(1, 7))]
        if trial % 2:  # no ties
            a, b = [x + rng.random() for x in a], [x + rng.random() for x in b]
        assert mann_whitney_p(a, b) == pytest.approx(_brute_force_p(a, b), abs=1e-12), (a, b)
    # Completely separated samples reach the smallest p the sizes allow.
    assert mann_whitney_p([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]) == pytest.approx(min_attainable_p(6, 6))
    assert min_attainable_p(6, 6) == pytest.approx(2 / 924)
    assert mann_whitney_p([0.0] * 8, [0.0] * 9) == 1.0


def test_large_samples_use_the_normal_approximation_close_to_the_exact_value() -> None:
    rng = random.Random(3)
    a, b = _steps(rng, 60, 1.0), _steps(rng, 60, 1.15)
    approximate = mann_whitney_p(a, b)
    saved = parity._EXACT_BUDGET
    parity._EXACT_BUDGET = 10**15
    try:
        exact = mann_whitney_p(a, b)
    finally:
        parity._EXACT_BUDGET = saved
    assert approximate != exact and approximate == pytest.approx(exact, rel=0.1)
    # Thousands of steps stay cheap and decisive.
    assert mann_whitney_p(_steps(rng, 3000, 1.0), _steps(rng, 3000, 1.2)) < 1e-10


def test_holm_adjusts_step_down_and_stays_monotone() -> None:
    assert holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert holm([0.5, 0.5]) == [1.0, 1.0]


def test_two_runs_of_the_same_distribution_are_the_same() -> None:
    rng = random.Random(0)
    a = {"mismatch/kl": _steps(rng, 30, 1e-4), "mismatch/tail_frac": _steps(rng, 30, 1e-3)}
    b = {"mismatch/kl": _steps(rng, 30, 1e-4), "mismatch/tail_frac": _steps(rng, 30, 1e-3)}
    report = compare(a, b)
    assert report.exit_code == EXIT_SAME and report.verdict == "same"
    assert [metric.verdict for metric in report.metrics] == ["same", "same"]
    assert all(metric.p is not None and metric.p_adjusted is not None and metric.p_adjusted >= 0.05 for metric in report.metrics)


def test_twice_the_kl_is_different_and_says_which_metric_and_by_how_much() -> None:
    rng = random.Random(1)
    a = {"mismatch/kl": _steps(rng, 30, 1e-4), "mismatch/tail_frac": _steps(rng, 30, 1e-3)}
    b = {"mismatch/kl": _steps(rng, 30, 2e-4), "mismatch/tail_frac": _steps(rng, 30, 1e-3)}
    report = compare(a, b)
    assert report.exit_code == EXIT_DIFFERENT and report.verdict == "different"
    kl, tail = report.metrics
    assert (kl.key, kl.verdict, tail.verdict) == ("mismatch/kl", "differs", "same")
    assert 1.5 < kl.ratio < 2.7 and kl.p_adjusted is not None and kl.p_adjusted < 0.01
    text = report.render()
    assert "DIFFERENT" in text and "mismatch/kl" in text.splitlines()[-1]
    assert json.loads(json.dumps(report.to_json()))["metrics"][0]["verdict"] == "differs"


def test_a_significant_difference_within_the_tolerance_is_the_same() -> None:
    rng = random.Random(2)
    a = {"mismatch/kl": _steps(rng, 200, 1.0, spread=0.05)}
    b = {"mismatch/kl": _steps(rng, 200, 1.1, spread=0.05)}
    report = compare(a, b)  # 10 % apart, default tolerance 25 %
    (kl,) = report.metrics
    assert kl.p_adjusted is not None and kl.p_adjusted < 1e-6
    assert (kl.within_tolerance, kl.verdict, report.exit_code) == (True, "same", EXIT_SAME)
    assert compare(a, b, tolerance=0.05).exit_code == EXIT_DIFFERENT
    assert compare(a, b, tolerance=0.05, tolerances={"mismatch/kl": 0.2}).exit_code == EXIT_SAME
    assert compare(a, b, tolerance=0.0, floor=0.2).exit_code == EXIT_SAME


def test_a_large_difference_on_few_noisy_steps_is_not_significant_so_the_same() -> None:
    """Step-to-step variation decides: 8 steps of widely varying values are not enough
    evidence for a 1.5x shift, however many tokens each step had."""
    rng = random.Random(4)
    a = {"mismatch/kl": _steps(rng, 8, 1.0, spread=1.5)}
    b = {"mismatch/kl": _steps(rng, 8, 1.5, spread=1.5)}
    (kl,) = compare(a, b).metrics
    assert kl.p is not None and kl.p > 0.05 and kl.verdict == "same"


def test_too_few_steps_cannot_be_compared() -> None:
    rng = random.Random(5)
    a = {"mismatch/kl": _steps(rng, 4, 1e-4), "mismatch/tail_frac": _steps(rng, 4, 1e-3)}
    b = {"mismatch/kl": _steps(rng, 4, 1e-2), "mismatch/tail_frac": _steps(rng, 4, 1e-1)}
    report = compare(a, b)  # 100x apart, but 4 + 4 steps cannot give p < 0.05 / 2
    assert report.exit_code == EXIT_INCOMPARABLE and report.verdict == "incomparable"
    assert {metric.verdict for metric in report.metrics} == {"too few steps"}
    assert any("cannot give p" in note for note in report.notes)


def test_tails_no_token_reached_are_the_same_and_do_not_dilute_the_test() -> None:
    """12 tail shares all 0 in both runs: the same, and not counted in Holm's family, so 5 + 6
    steps still decide the KL (2 / C(11, 5) = 0.0043, below 0.05 alone, not times 13)."""
    zeros = {f"tail/{i}": 0.0 for i in range(12)}
    a = {"mismatch/kl": [1.0, 1.2, 0.9, 1.1, 1.05], **{key: [v] * 5 for key, v in zeros.items()}}
    b = {"mismatch/kl": [3.0, 3.3, 2.9, 3.1, 3.2, 2.8], **{key: [v] * 6 for key, v in zeros.items()}}
    report = compare(a, b)
    assert report.exit_code == EXIT_DIFFERENT
    kl, *tails = report.metrics
    assert kl.verdict == "differs" and kl.p_adjusted == pytest.approx(2 / 462)
    assert {(m.verdict, m.p, m.ratio) for m in tails} == {("same", 1.0, 1.0)}


def test_nan_steps_are_dropped_and_only_shared_metrics_are_compared() -> None:
    rng = random.Random(6)
    a = {"mismatch/kl": [*_steps(rng, 12, 1.0), math.nan], "mismatch/log_ratio_abs_rare": [math.nan] * 5}
    b = {"mismatch/kl": _steps(rng, 12, 1.0), "mismatch/log_ratio_abs_rare": _steps(rng, 5, 1.0), "mismatch/tail_frac": [0.1]}
    report = compare(a, b)
    assert [(metric.key, metric.steps_a, metric.steps_b) for metric in report.metrics] == [("mismatch/kl", 12, 12)]
    assert any("only run B has mismatch/tail_frac" in note for note in report.notes)
    assert any("mismatch/log_ratio_abs_rare: run A has no" in note for note in report.notes)


# -- the histogram's tails ----------------------------------------------------------------------


def test_tail_shares_from_the_histogram_equal_the_shares_of_the_tokens() -> None:
    rng = random.Random(8)
    steps = [[rng.gauss(0, 10 ** rng.uniform(-4, 0.5)) for _ in range(500)] for _ in range(3)]
    values, notes = histogram_values(EDGES, [histogram(np.array(step)) for step in steps], [0, 5, 0], [0.001, 0.1, 1.0, 0.003])
    assert notes == ["τ=0.003 is not a bin edge of mismatch/log_ratio (±0.003): left out"]
    for tau in (0.001, 0.1, 1.0):
        both = [sum(abs(v) >= tau for v in step) / len(step) for step in steps]
        low = [sum(v < -tau for v in step) / len(step) for step in steps]
        assert values[tail_key(tau, low=False)] == pytest.approx(both)
        assert values[tail_key(tau, low=True)] == pytest.approx(low)
        assert 0 < min(low) and max(low) < max(both) < 1
    assert values[f"{HISTOGRAM_KEY}:nan"] == pytest.approx([0, 5 / 505, 0])


# -- groups ---------------------------------------------------------------------------------------


def test_a_group_pools_its_runs_steps_as_observations() -> None:
    pooled = pool([{"mismatch/kl": [1.0, 2.0], "mismatch/tail_frac": [0.1]}, {"mismatch/kl": [3.0]}, {}])
    assert pooled == {"mismatch/kl": [1.0, 2.0, 3.0], "mismatch/tail_frac": [0.1]}
    # Three runs of one setting against three of a setting with twice the KL, 4 steps each:
    # one run a side is not evidence enough, the groups' 12 + 12 steps are.
    rng = random.Random(9)
    old = [{"mismatch/kl": _steps(rng, 4, 1.0, spread=0.3)} for _ in range(3)]
    new = [{"mismatch/kl": _steps(rng, 4, 2.0, spread=0.3)} for _ in range(3)]
    (single,) = compare(old[0], new[0]).metrics
    assert single.p is not None and single.p > 0.05 and single.verdict == "same"
    (kl,) = compare(pool(old), pool(new)).metrics
    assert (kl.steps_a, kl.steps_b, kl.verdict) == (12, 12, "differs")
