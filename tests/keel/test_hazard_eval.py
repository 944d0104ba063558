"""Fitting and checking the collapse hazard on a corpus (keel/hazard_eval.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from keel.eval_alerts import CorpusRun
from keel.hazard_eval import Rows, auc, calibration, feature_separation, fit, rows
from server.alerts.hazard import FEATURES, HORIZON, MODEL, WARMUP, HazardModel


def _run(collapse: int | None, steps: int = 300, kl_from: int | None = None) -> CorpusRun:
    kl = [0.02 if kl_from is None or step < kl_from else 0.02 * 1.1 ** (step - kl_from) for step in range(steps)]
    reward = [min(0.9, 0.1 + step / 50) if collapse is None or step < collapse else 0.3 for step in range(steps)]
    series = {
        "reward/mean": reward, "reward/std": [0.1] * steps,
        "mismatch/kl": kl, "mismatch/ratio_max": [3.0] * steps, "grad/norm": [1.0] * steps,
    }  # fmt: skip
    return CorpusRun("r", {"loss": "ppo"}, series, collapse)


def test_auc_is_the_chance_a_positive_outranks_a_negative() -> None:
    assert auc([1, 2, 3, 4], [0, 0, 1, 1]) == 1.0
    assert auc([3, 1, 2], [0, 1, 0]) == 0.0
    assert auc([1, 1, 2], [0, 1, 1]) == pytest.approx((0.5 + 1) / 2)  # a tie counts half


def test_rows_stop_at_the_collapse_or_before_a_stable_runs_tail() -> None:
    data = rows([_run(120), _run(None), _run(280)])  # 300 steps: a stable run is scored until 150
    collapsing = [y for y, run in zip(data.y, data.run, strict=True) if run == 0]
    assert len(collapsing) == 120 - WARMUP and sum(collapsing) == HORIZON  # steps 70..119 are within 50 steps of 120
    assert data.run.count(1) == 150 - WARMUP and all(y == 0 for y, run in zip(data.y, data.run, strict=True) if run == 1)
    assert data.run.count(2) == 280 - WARMUP  # a collapsing run up to its collapse, in the tail too
    assert all(len(x) == len(FEATURES) for x in data.x)


def test_the_fit_is_calibrated_in_sample_and_learns_the_sign_of_the_evidence() -> None:
    corpus = [_run(200, steps=400, kl_from=150) for _ in range(3)] + [_run(None, steps=400) for _ in range(3)]
    data = rows(corpus)
    model = fit(data, description="test")
    assert model["features"] == list(FEATURES) and model["fitted_on"] == "test"
    assert model["weights"][FEATURES.index("kl_climb")] > 0
    result = calibration(data, HazardModel(model))
    assert result["rows"] == len(data.y) and sum(row["rows"] for row in result["reliability"]) == len(data.y)
    mean_predicted = sum(row["predicted"] * row["rows"] for row in result["reliability"]) / result["rows"]
    assert mean_predicted == pytest.approx(result["base_rate"], abs=1e-4)  # a logistic fit with an intercept
    assert result["brier"] < result["brier_base_rate"] and result["auc"] > 0.9


def test_separation_ranks_the_feature_that_moves_before_a_collapse() -> None:
    table = {row["feature"]: row for row in feature_separation(rows([_run(200, steps=400, kl_from=150), _run(None, steps=400)]))}
    assert table["kl_climb"]["auc"] > 0.9 and table["log_kl"]["mean_before_collapse"] > table["log_kl"]["mean_otherwise"]
    assert math.isnan(table["unbounded_frac"]["auc"])  # never logged: no evidence either way


def test_an_empty_corpus_gives_nan_not_an_error() -> None:
    result = feature_separation(Rows([], [], []))
    assert len(result) == len(FEATURES)


def test_keel_eval_alerts_fits_a_hazard_scores_it_and_writes_its_calibration(tmp_path: Path) -> None:
    from keel.cli import main
    from keel.eval_alerts import save_corpus

    corpus_path, model_path, out_path = tmp_path / "corpus.json", tmp_path / "model.json", tmp_path / "scores.json"
    corpus = [_run(200, steps=400, kl_from=150) for _ in range(3)] + [_run(None, steps=400) for _ in range(3)]
    save_corpus(corpus, str(corpus_path))
    code = main(["eval-alerts", "--corpus", str(corpus_path), "--fit-hazard", str(model_path), "--hazard-model",
                 str(model_path), "--hazard", "0.5", "--no-rlwatch", "--json", str(out_path)])  # fmt: skip
    assert code == 0
    model = json.loads(model_path.read_text())
    assert model["fitted_on"] == str(corpus_path)
    (result,) = json.loads(out_path.read_text())
    # Scored with the file's model (--hazard-model), not the built-in one.
    assert result["calibration"] == json.loads(json.dumps(calibration(rows(corpus), HazardModel(model))))
    assert result["calibration"] != json.loads(json.dumps(calibration(rows(corpus), HazardModel(MODEL))))
    scores = {s["detector"]: s for s in result["scores"]}
    assert scores["hazard > 0.5"]["hits"] == 3 and scores["hazard > 0.5"]["false_alarms_unbounded"] == 0
    assert result["calibration"]["brier"] < result["calibration"]["brier_base_rate"]
    assert [row["feature"] for row in result["separation"]] == list(FEATURES)


def test_fitted_trees_evaluate_in_pure_python_as_scikit_learn_predicts() -> None:
    import numpy as np
    from sklearn.ensemble import HistGradientBoostingClassifier  # noqa: F401 (fit_trees uses it)

    from keel.hazard_eval import fit_trees

    corpus = [_run(200, steps=400, kl_from=150) for _ in range(3)] + [_run(None, steps=400) for _ in range(3)]
    data = rows(corpus)
    model = fit_trees(data, trees=20, min_leaf=20)
    assert model["kind"] == "trees" and len(model["trees"]) == 20
    ours = HazardModel(json.loads(json.dumps(model)))  # through its JSON
    # The same fit with scikit-learn's own prediction: equal up to the 6 decimals kept.
    from sklearn.ensemble import HistGradientBoostingClassifier as Classifier

    x = np.array([[np.nan if v is None else v for v in row] for row in data.x])
    logged = np.isfinite(x).any(axis=0)  # fit_trees leaves out what no run logged
    x = x[:, logged]
    reference = Classifier(max_iter=20, max_depth=3, learning_rate=0.05, min_samples_leaf=20, l2_regularization=1.0,
                           early_stopping=False, random_state=0).fit(x, np.asarray(data.y))  # fmt: skip
    expected = reference.predict_proba(x)[:, 1]
    assert [ours.probability(row) for row in data.x] == pytest.approx(list(expected), abs=1e-4)
    assert calibration(data, ours)["auc"] > 0.9
