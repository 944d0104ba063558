"""The statistics and the verdict of parity (wire/parity.py), shared by `keel parity`
and the compare page's parity view: blocks of steps as the unit of evidence, the margin, the
noise floors, seeds a side, and the histogram's tail shares."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from scipy import stats

from tests.support.step_details import EDGES, histogram
from wire.parity import (
    BLOCKS,
    DEFAULT_TOLERANCE,
    EXIT_CANNOT_TELL,
    EXIT_DIFFERENT,
    EXIT_INCOMPARABLE,
    HISTOGRAM_KEY,
    SEED_TOLERANCE,
    block_summaries,
    compare,
    compare_groups,
    default_floor,
    histogram_values,
    holm,
    student_t_cdf,
    student_t_quantile,
    tail_key,
)


def _ar1(rng: random.Random, count: int, level: float, *, rho: float = 0.9, spread: float = 0.5) -> list[float]:
    """Per-step values of a metric whose log follows an AR(1) around log(level): a step's
    mismatch close to its neighbours', as on a real run (rho 0.9: ~19 steps to forget)."""
    values, x = [], rng.gauss(0, spread)
    for _ in range(count):
        x = rho * x + math.sqrt(1 - rho**2) * rng.gauss(0, spread)
        values.append(level * math.exp(x))
    return values


# -- the pieces -------------------------------------------------------------------------------


def test_student_t_is_scipy_s_to_rounding() -> None:
    for df in (1, 2, 3, 4, 9, 10, 57, 400):
        for t in (-6.0, -1.3, 0.0, 0.4, 2.2, 30.0):
            assert student_t_cdf(t, df) == pytest.approx(stats.t.cdf(t, df), abs=1e-12), (t, df)
        for q in (0.95, 0.975, 0.995, 0.1):
            assert student_t_quantile(q, df) == pytest.approx(stats.t.ppf(q, df), rel=1e-9), (q, df)


def test_holm_adjusts_step_down_and_stays_monotone() -> None:
    assert holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert holm([0.5, 0.5]) == [1.0, 1.0]


def test_a_block_is_the_log_of_its_steps_mean_above_the_floor() -> None:
    values = [float(v) for v in range(1, 21)]  # 20 steps in 4 blocks of 5
    assert block_summaries(values, 0.5, 4) == pytest.approx([math.log(m + 0.5) for m in (3, 8, 13, 18)])
    # Uneven lengths: block sizes differ by at most one step, every step in one block.
    assert block_summaries([1.0] * 7 + [3.0] * 6, 0.0, 3) == pytest.approx([0.0, math.log(9 / 5), math.log(3)])  # 4, 5 and 4 steps
    # The floor makes rounding noise nothing: 3e-15 and 5e-15 nats are ~1e-12 either way.
    low, high = (block_summaries([v] * 12, default_floor("mismatch/kl"), 4)[0] for v in (3e-15, 5e-15))
    assert abs(high - low) < 3e-3


def test_every_metric_has_a_noise_floor() -> None:
    assert default_floor("mismatch/kl") == 1e-12
    assert {default_floor(f"mismatch/log_ratio_abs_{b}") for b in ("rare", "unlikely", "likely", "mean", "seq_mean")} == {1e-6}
    shares = ["mismatch/tail_frac", "mismatch/tail_frac_2", "mismatch/low_tail_frac", tail_key(0.01, low=True), f"{HISTOGRAM_KEY}:nan"]
    assert {default_floor(key) for key in shares} == {1e-4}


# -- one run a side ---------------------------------------------------------------------------------


def test_autocorrelated_runs_of_one_setting_are_not_called_different_however_long() -> None:
    """Steps that follow their neighbours are not independent observations: a per-step test
    calls most such pairs different at 1,000 steps. Blocks keep the rate at alpha or below at
    every length; at 100 steps (~5 steps' memory a block of 10 cannot forget) some pairs
    cannot tell, at 1,000 nearly all are affirmatively the same."""
    rng = random.Random(0)
    for length, same in ((100, 0.7), (1000, 0.95)):
        verdicts = [compare({"mismatch/kl": _ar1(rng, length, 1e-4)}, {"mismatch/kl": _ar1(rng, length, 1e-4)}).verdict for _ in range(200)]
        assert verdicts.count("different") / len(verdicts) <= 0.05, length
        assert verdicts.count("same") / len(verdicts) >= same, length


def test_a_change_beyond_the_margin_is_different_and_says_which_metric_and_by_how_much() -> None:
    rng = random.Random(1)
    a = {"mismatch/kl": _ar1(rng, 300, 1e-4), "mismatch/tail_frac": _ar1(rng, 300, 1e-3)}
    b = {"mismatch/kl": _ar1(rng, 300, 5e-4), "mismatch/tail_frac": _ar1(rng, 300, 1e-3)}
    report = compare(a, b)
    assert report.exit_code == EXIT_DIFFERENT and report.verdict == "different"
    kl, tail = report.metrics
    assert (kl.key, kl.verdict, tail.verdict) == ("mismatch/kl", "differs", "same")
    assert 3.5 < kl.ratio < 7 and kl.interval is not None and kl.interval[0] > 1 + SEED_TOLERANCE
    assert kl.p_adjusted is not None and kl.p_adjusted < 0.01 and kl.blocks == BLOCKS
    assert kl.tolerance == SEED_TOLERANCE and kl.floor == 1e-12 and tail.floor == 1e-4
    text = report.render()
    assert text.splitlines()[0].startswith("method: one run a side, each cut into 10 blocks")
    assert "DIFFERENT" in text and "mismatch/kl" in text.splitlines()[-1]
    assert "detects" in text.splitlines()[1] and f"≥{kl.detectable:.3g}x" in text
    decoded = json.loads(json.dumps(report.to_json()))
    assert decoded["metrics"][0]["verdict"] == "differs" and decoded["method"] == report.method
    assert decoded["metrics"][0]["detectable"] == pytest.approx(kl.detectable)


def test_what_the_comparison_could_detect_is_the_margin_plus_its_interval() -> None:
    """Block differences known by construction: log(B/A) of block k is d_k, so the estimate,
    its standard error and the smallest ratio called different follow by hand."""
    d = [0.9, 1.0, 1.1, 0.95, 1.05, 1.0, 0.9, 1.1, 1.0, 1.0]
    a = {"mismatch/kl": [1e-3] * 100}
    b = {"mismatch/kl": [1e-3 * math.exp(dk) for dk in d for _ in range(10)]}
    (kl,) = compare(a, b, floor=0.0).metrics
    se = float(np.std(d, ddof=1) / math.sqrt(len(d)))
    assert kl.ratio == pytest.approx(math.exp(np.mean(d)))
    assert kl.detectable == pytest.approx(math.exp(math.log(2) + stats.t.ppf(0.95, 9) * se))
    assert kl.interval == pytest.approx((math.exp(1 - stats.t.ppf(0.95, 9) * se), math.exp(1 + stats.t.ppf(0.95, 9) * se)))
    assert kl.p_different == pytest.approx(stats.t.sf((1 - math.log(2)) / se, 9))
    assert kl.verdict == "differs"  # e ≈ 2.72x against a margin of 2x, the interval above it
    # A margin of e, the estimate itself: not beyond it, so the same (this comparison would
    # have seen a change of e·exp(t·se) ≈ 3.0x or more).
    (kl,) = compare(a, b, floor=0.0, tolerance=math.e - 1).metrics
    assert kl.p_different == pytest.approx(0.5) and kl.verdict == "same" and kl.detectable < 3.2
    assert compare(a, b, floor=0.0, tolerance=2.5, tolerances={"mismatch/kl": 1.0}).exit_code == EXIT_DIFFERENT


def test_a_metric_beyond_its_margin_alone_but_not_over_the_family_cannot_tell() -> None:
    """The KL's own interval lies beyond 2x (p ≈ 0.018), but eight metrics are tested: Holm
    does not call it different, and it is not called the same either."""
    spread = [0.4, -0.4, 0.3, -0.3, 0.5, -0.5, 0.2, -0.2, 0.35, -0.35]
    rng = random.Random(3)
    others = {f"mismatch/log_ratio:abs>={tau}": (_ar1(rng, 100, tau, spread=0.05), _ar1(rng, 100, tau, spread=0.05)) for tau in range(1, 8)}
    a = {"mismatch/kl": [1e-3] * 100, **{key: values for key, (values, _) in others.items()}}
    b = {"mismatch/kl": [1e-3 * 2 * math.exp(0.3 + e) for e in spread for _ in range(10)], **{key: values for key, (_, values) in others.items()}}
    report = compare(a, b)
    kl = report.metrics[0]
    assert kl.p_different is not None and kl.p_adjusted is not None
    assert kl.p_different == pytest.approx(stats.t.sf(0.3 / (np.std(spread, ddof=1) / math.sqrt(10)), 9))
    assert kl.p_different < 0.05 < kl.p_adjusted and kl.interval is not None and kl.interval[0] > 2
    assert kl.verdict == "cannot tell" and {m.verdict for m in report.metrics[1:]} == {"same"}
    assert report.exit_code == EXIT_CANNOT_TELL and report.headline is kl


def test_rounding_noise_is_the_same_by_default_and_a_difference_when_the_floor_is_lowered() -> None:
    """The issue's fp32 pair: KL 3.5e-15 against 4.5e-15 nats, |ℓ| 4e-8 against 6e-8. Under
    the floors both are nothing; with the floors overridden to ~0 they differ by 10x."""
    rng = random.Random(2)
    a = {"mismatch/kl": _ar1(rng, 300, 3.5e-16, spread=0.1), "mismatch/log_ratio_abs_unlikely": _ar1(rng, 300, 4e-9, spread=0.1)}
    b = {"mismatch/kl": _ar1(rng, 300, 4.5e-15, spread=0.1), "mismatch/log_ratio_abs_unlikely": _ar1(rng, 300, 6e-8, spread=0.1)}
    report = compare(a, b)
    assert report.verdict == "same" and all(0.95 < m.ratio < 1.06 for m in report.metrics)
    assert compare(a, b, floor=1e-30).verdict == "different"
    assert compare(a, b, floors={"mismatch/kl": 1e-30}).verdict == "different"


def test_noisy_short_runs_cannot_tell_and_too_few_steps_cannot_be_compared() -> None:
    """12 steps that wander over orders of magnitude: nothing differs, and nothing could have:
    not "same" (a comparison that could not have failed does not pass)."""
    rng = random.Random(4)
    a = {"mismatch/kl": _ar1(rng, 12, 1.0, rho=0.8, spread=3.0), "mismatch/log_ratio:nan": [0.0] * 12}
    b = {"mismatch/kl": _ar1(rng, 12, 3.0, rho=0.8, spread=3.0), "mismatch/log_ratio:nan": [0.0] * 12}
    report = compare(a, b)
    kl, nan = report.metrics
    assert (kl.blocks, kl.verdict, report.exit_code) == (4, "cannot tell", EXIT_CANNOT_TELL)
    assert kl.detectable is not None and kl.detectable > 10 and kl.p_adjusted is not None and kl.p_adjusted > 0.05
    assert (nan.constant, nan.verdict) == (True, "same")  # all zeros: no evidence of power
    assert "CANNOT TELL" in report.summary() and "more steps or more seeds" in report.summary()
    few = compare({"mismatch/kl": [1.0] * 11, "mismatch/tail_frac": [0.1] * 11}, {"mismatch/kl": [9.0] * 11, "mismatch/tail_frac": [0.5] * 11})
    assert few.exit_code == EXIT_INCOMPARABLE and few.verdict == "incomparable"
    assert {metric.verdict for metric in few.metrics} == {"too few steps"}
    assert any("fewer than 4 blocks of 3" in note for note in few.notes)


def test_tails_no_token_reached_are_the_same_and_do_not_dilute_the_test() -> None:
    """12 tail shares all 0 in both runs: the same, and not counted in Holm's family."""
    zeros = {f"tail/{i}": [0.0] * 40 for i in range(12)}
    rng = random.Random(5)
    a = {"mismatch/kl": _ar1(rng, 40, 1.0, rho=0.3, spread=0.2), **zeros}
    b = {"mismatch/kl": _ar1(rng, 40, 3.0, rho=0.3, spread=0.2), **zeros}
    report = compare(a, b)
    kl, *tails = report.metrics
    assert report.exit_code == EXIT_DIFFERENT and kl.p_adjusted == kl.p_different  # a family of one
    assert {(m.verdict, m.p_adjusted, m.ratio) for m in tails} == {("same", 1.0, 1.0)}


def test_nan_steps_are_dropped_and_only_shared_metrics_are_compared() -> None:
    rng = random.Random(6)
    a = {"mismatch/kl": [*_ar1(rng, 30, 1.0), math.nan], "mismatch/log_ratio_abs_rare": [math.nan] * 5}
    b = {"mismatch/kl": _ar1(rng, 30, 1.0), "mismatch/log_ratio_abs_rare": _ar1(rng, 5, 1.0), "mismatch/tail_frac": [0.1]}
    report = compare(a, b)
    assert [(metric.key, metric.steps_a, metric.steps_b) for metric in report.metrics] == [("mismatch/kl", 30, 30)]
    assert any("only side B has mismatch/tail_frac" in note for note in report.notes)
    assert any("mismatch/log_ratio_abs_rare: a run has no" in note for note in report.notes)


# -- several seeds a side -----------------------------------------------------------------------------


def _seeds(rng: random.Random, count: int, level: float, length: int = 300, seed_spread: float = 0.3) -> list[dict[str, list[float]]]:
    """Runs of one engine: each seed's trajectory sits at its own level (the persistent seed
    effect one run a side cannot see), around `level`."""
    return [{"mismatch/kl": _ar1(rng, length, level * math.exp(rng.gauss(0, seed_spread)))} for _ in range(count)]


def test_seeds_a_side_measure_the_seed_to_seed_spread() -> None:
    rng = random.Random(7)
    old, same, new = _seeds(rng, 3, 1e-4), _seeds(rng, 3, 1e-4), _seeds(rng, 3, 4e-4)
    report = compare_groups(old, new)
    (kl,) = report.metrics
    assert (report.runs_a, report.runs_b, kl.tolerance) == (3, 3, DEFAULT_TOLERANCE)
    assert report.method.startswith("3 run(s) against 3") and kl.verdict == "differs" and 2.5 < kl.ratio < 6.5
    assert kl.steps_a == 900
    # Seeds of one engine are rarely different (alpha), however long the runs.
    verdicts = [compare_groups(_seeds(rng, 3, 1e-4, 1000), _seeds(rng, 3, 1e-4, 1000)).verdict for _ in range(100)]
    assert verdicts.count("different") <= 5
    assert compare_groups(old, same).verdict != "different"
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


