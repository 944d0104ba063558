"""`keel parity A B`: the per-step rank-sum test, the histogram's tail shares, and the
command against a real server (runs stored through the ingest protocol, and `keel lm` runs)."""

from __future__ import annotations

import bisect
import itertools
import json
import math
import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from keel.cli import main
from keel.importers import ImportedRun, PointTable
from keel.parity import (
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
    tail_key,
)
from keel.transfer import upload_run
from tests.support.monitor import keel
from trainer_hooks.details import EDGES
from wire import Histogram, Row

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
    import keel.parity as parity

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


def _histogram(values: list[float]) -> list[int]:
    """Counts on EDGES as trainer_hooks.details bins them: [e(i), e(i+1)), the rest in the end bins."""
    counts = [0] * (len(EDGES) - 1)
    for value in values:
        counts[min(max(bisect.bisect_right(EDGES, value) - 1, 0), len(counts) - 1)] += 1
    return counts


def test_tail_shares_from_the_histogram_equal_the_shares_of_the_tokens() -> None:
    rng = random.Random(8)
    steps = [[rng.gauss(0, 10 ** rng.uniform(-4, 0.5)) for _ in range(500)] for _ in range(3)]
    values, notes = histogram_values(list(EDGES), [_histogram(step) for step in steps], [0, 5, 0], [0.001, 0.1, 1.0, 0.003])
    assert notes == ["τ=0.003 is not a bin edge of mismatch/log_ratio (±0.003): left out"]
    for tau in (0.001, 0.1, 1.0):
        both = [sum(abs(v) >= tau for v in step) / len(step) for step in steps]
        low = [sum(v < -tau for v in step) / len(step) for step in steps]
        assert values[tail_key(tau, low=False)] == pytest.approx(both)
        assert values[tail_key(tau, low=True)] == pytest.approx(low)
        assert 0 < min(low) and max(low) < max(both) < 1
    assert values[f"{HISTOGRAM_KEY}:nan"] == pytest.approx([0, 5 / 505, 0])


# -- the command against a real server -----------------------------------------------------------


def _store(url: str, name: str, steps: int, kl: float, *, seed: int, tail: float = 0.01, identity: str | None = None) -> str:
    """A run with the mismatch scalars and a log-ratio histogram per step, stored through
    the ingest protocol: per-step values varying around `kl`, a histogram whose tail
    (|ℓ| ≥ 0.1) holds about `tail` of the tokens."""
    rng = random.Random(seed)
    rows = []
    for step in range(steps):
        tokens = [rng.gauss(0, 0.01) if rng.random() > tail else rng.gauss(0, 1.0) for _ in range(400)]
        values = {
            "mismatch/kl": kl * math.exp(rng.gauss(0, 0.3)),
            "mismatch/tail_frac": sum(abs(t) >= 1 for t in tokens) / len(tokens),
            "loss/total": rng.random(),
        }
        rows.append(Row(step=step, time=None, values=values, histograms={HISTOGRAM_KEY: Histogram(edges=list(EDGES), counts=_histogram(tokens))}))
    table = PointTable()
    run = ImportedRun(identity=identity or f"parity-test/{name}/{seed}", name=name, table=table)
    assert upload_run(run, rows, url, timeout=60) is None
    return run.run_id


def _parity(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["parity", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_keel_parity_over_a_real_server(server_factory, sqlite_url, capsys) -> None:
    server = server_factory(sqlite_url)
    base = _store(server.url, "base", 16, 1e-3, seed=1)
    _store(server.url, "same", 16, 1e-3, seed=2)
    _store(server.url, "double", 16, 2e-3, seed=3, tail=0.03)

    code, out, _ = _parity(capsys, "base", "same", "--server", server.url)
    assert code == EXIT_SAME, out
    assert out.splitlines()[-1].startswith("SAME (base vs same)")

    code, out, _ = _parity(capsys, base, "double", "--server", server.url, "--json")
    assert code == EXIT_DIFFERENT
    report = json.loads(out)
    assert (report["verdict"], report["exit"], report["runs"]["a"]["name"]) == ("different", 1, "base")
    by_key = {metric["key"]: metric for metric in report["metrics"]}
    assert "loss/total" not in by_key and {"mismatch/kl", tail_key(0.1, low=False), tail_key(0.1, low=True)} <= set(by_key)
    assert by_key["mismatch/kl"]["verdict"] == "differs" and 1.5 < by_key["mismatch/kl"]["ratio"] < 2.7
    assert by_key[tail_key(0.1, low=False)]["verdict"] == "differs"
    assert by_key[tail_key(0.001, low=False)]["median_a"] > 0.9  # the bulk's spread, in both runs

    # A step range: the last 4 steps alone are too few to decide.
    code, out, err = _parity(capsys, "base", "double", "--server", server.url, "--steps", "12:")
    assert code == EXIT_INCOMPARABLE and "INCOMPARABLE" in out
    code, _, err = _parity(capsys, "base", "double", "--server", server.url, "--steps", "100:200")
    assert code == EXIT_INCOMPARABLE and "no steps in the range" in err
    # A wide enough tolerance forgives the doubled KL; the tails still differ.
    code, out, _ = _parity(capsys, "base", "double", "--server", server.url, "--tolerance", "mismatch/kl=1.5", "--json")
    assert code == EXIT_DIFFERENT
    assert {m["key"]: m["verdict"] for m in json.loads(out)["metrics"]}["mismatch/kl"] == "same"


def test_keel_parity_cannot_compare_unknown_ambiguous_or_metricless_runs(server_factory, sqlite_url, capsys) -> None:
    server = server_factory(sqlite_url)
    _store(server.url, "base", 10, 1e-3, seed=1)
    _store(server.url, "twin", 10, 1e-3, seed=2, identity="one")
    _store(server.url, "twin", 10, 1e-3, seed=3, identity="two")
    table = PointTable()
    for step in range(10):
        table.add(step, "loss/total", float(step))
    assert upload_run(ImportedRun(identity="no-mismatch", name="plain", table=table), table.rows(), server.url, timeout=60) is None

    code, _, err = _parity(capsys, "base", "nope", "--server", server.url)
    assert code == EXIT_INCOMPARABLE and "no run with id or name 'nope'" in err
    code, _, err = _parity(capsys, "base", "twin", "--server", server.url)
    assert code == EXIT_INCOMPARABLE and "2 runs are named 'twin'" in err
    code, out, err = _parity(capsys, "base", "plain", "--server", server.url, "--json")
    assert code == EXIT_INCOMPARABLE and "share no mismatch metric" in err
    assert json.loads(out)["verdict"] == "incomparable"
    code, _, err = _parity(capsys, "base", "base", "--server", "http://127.0.0.1:9")
    assert code == EXIT_INCOMPARABLE and "cannot reach" in err


# -- end to end: `keel lm` runs -----------------------------------------------------------------


def test_keel_parity_of_keel_lm_runs_same_setting_and_changed_sampler_precision(server_factory, sqlite_url, tmp_path) -> None:
    """Two seeds of an fp16 sampler are the same; an fp32 sampler's mismatch is orders of
    magnitude smaller (only the learner's own numerics are left), so it differs."""
    server = server_factory(sqlite_url)

    def lm(name: str, seed: int, dtype: str) -> None:
        result = keel(
            "lm", "--loss", "cispo", "--lag", "0", "--steps", "12", "--prompts", "4", "--samples", "4",
            "--digits", "4", "--sampler-dtype", dtype, "--seed", str(seed), "--server", server.url, "--name", name,
            env={"KEEL_SPOOL_DIR": str(tmp_path / "spool")},
        )  # fmt: skip
        assert result.returncode == 0, result.stderr

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lm, ("fp16-s0", "fp16-s1", "fp32-s0"), (0, 1, 0), ("fp16", "fp16", "fp32")))

    same = keel("parity", "fp16-s0", "fp16-s1", "--server", server.url, "--json")
    assert same.returncode == EXIT_SAME, same.stdout + same.stderr
    report = json.loads(same.stdout)
    kl = {metric["key"]: metric for metric in report["metrics"]}["mismatch/kl"]
    assert (kl["steps_a"], kl["steps_b"], kl["verdict"]) == (12, 12, "same")

    different = keel("parity", "fp16-s0", "fp32-s0", "--server", server.url)
    assert different.returncode == EXIT_DIFFERENT, different.stdout + different.stderr
    rows = {line.split()[0]: line.split() for line in different.stdout.splitlines()[2:] if line.startswith("mismatch/")}
    assert rows["mismatch/kl"][-1] == "differs"
    assert float(rows["mismatch/kl"][4].rstrip("x")) < 1e-3  # fp32's KL is > 1000x smaller
    assert different.stdout.splitlines()[-1].startswith("DIFFERENT (fp16-s0 vs fp32-s0)")
