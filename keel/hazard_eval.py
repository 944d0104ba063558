"""The collapse hazard on a labelled corpus: fit it, check its calibration, and measure
what each of its features tells apart (`keel eval-alerts --fit-hazard / --hazard`).

Every run contributes one row per step t from the hazard's warm-up up to its collapse,
or, on a run that never collapsed, up to AFTERMATH steps before its end (keel.eval_alerts:
what follows every row is then known): the features at t
(server.alerts.hazard.features, exactly as the server computes them) and the label "the
run collapses in (t, t + HORIZON]" (a collapse that lasts, wire.labels). Rows in a
dip's window (from 150 steps before a fall that regained to 100 after it) are left out:
they are neither a collapse to come nor a calm run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from server.alerts.hazard import FEATURES, HORIZON, WARMUP, HazardModel, features, reads

__all__ = [
    "Rows", "auc", "calibration", "feature_separation", "fit", "fit_trees", "format_calibration",
    "format_separation", "rows", "run_features",
]  # fmt: skip

RELIABILITY_EDGES = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)


@dataclass
class Rows:
    x: list[list[float | None]]
    """Features per row; None where the run never logged what a feature needs."""
    y: list[int]
    run: list[int]
    """The index of the row's run in the corpus."""


def run_features(run: Any) -> list[tuple[int, list[float | None]]]:
    """The (step, features) of every step of `run` the hazard is given at, as the server
    computes them: the features do not depend on the model, so they are computed once."""
    state: dict[str, Any] = {}
    out = []
    for row in run.rows():
        if not reads(row.values):  # as the detector: not a step of the hazard
            continue
        x = features(state, row.values)
        if state["n"] > WARMUP:
            out.append((row.step, x))
    return out


def rows(corpus: Sequence[Any], steps: Sequence[Sequence[tuple[int, list[float | None]]]] | None = None) -> Rows:
    """The rows of every run of `corpus` (keel.eval_alerts.CorpusRun); `steps`: the runs'
    `run_features`, when already computed."""
    out = Rows([], [], [])
    for index, run in enumerate(corpus):
        c = run.collapse_step
        end = run.scored_until if c is None else c
        for step, x in steps[index] if steps is not None else run_features(run):
            if step >= end:
                break
            if not run.judged(step):
                continue
            out.x.append(x)
            out.y.append(int(c is not None and c - step <= HORIZON))
            out.run.append(index)
    return out


def fit(data: Rows, *, l2: float = 1.0, description: str = "") -> dict[str, Any]:
    """Logistic regression by Newton's method on standardised features, an L2 penalty `l2`
    on the weights (not the intercept); the model dict of server.alerts.hazard.MODEL."""
    import torch

    x = torch.tensor([[math.nan if v is None else v for v in row] for row in data.x], dtype=torch.float64)
    y = torch.tensor(data.y, dtype=torch.float64)
    present = ~x.isnan()
    means = torch.where(present, x, 0).sum(0) / present.sum(0).clamp_min(1)
    x = torch.where(present, x, means)  # a feature never logged is taken at its mean, as HazardModel does
    scales = x.std(0).nan_to_num(1.0).clamp_min(1e-9)
    z = torch.cat([torch.ones(len(x), 1, dtype=torch.float64), (x - means) / scales], 1)
    w = torch.zeros(z.shape[1], dtype=torch.float64)
    base = float(y.mean().clamp(1e-6, 1 - 1e-6))
    w[0] = math.log(base / (1 - base))
    penalty = torch.full((z.shape[1],), l2, dtype=torch.float64)
    penalty[0] = 0.0
    def objective(w: torch.Tensor) -> float:
        logits = z @ w
        nll = torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="sum")
        return float(nll + 0.5 * (penalty * w * w).sum())

    current = objective(w)
    for _ in range(100):  # Newton's method, step halved until the penalised loss falls
        p = torch.sigmoid(z @ w)
        grad = z.T @ (p - y) + penalty * w
        hessian = (z * (p * (1 - p)).unsqueeze(1)).T @ z + torch.diag(penalty) + 1e-6 * torch.eye(z.shape[1], dtype=torch.float64)
        step = torch.linalg.solve(hessian, grad)
        scale = 1.0
        while scale > 1e-6:
            candidate = w - scale * step
            value = objective(candidate)
            if value <= current:
                break
            scale /= 2
        else:
            break
        w, improvement, current = candidate, current - value, value
        if improvement < 1e-9 * max(1.0, abs(current)):
            break
    return {
        "kind": "logistic",
        "horizon": HORIZON,
        "features": list(FEATURES),
        "fitted_on": description,
        "intercept": round(float(w[0]), 6),
        "weights": [round(float(v), 6) for v in w[1:]],
        "means": [round(float(v), 6) for v in means],
        "scales": [round(float(v), 6) for v in scales],
    }


def fit_trees(
    data: Rows,
    *,
    trees: int = 150,
    depth: int = 3,
    learning_rate: float = 0.05,
    min_leaf: int = 400,
    l2: float = 1.0,
    description: str = "",
) -> dict[str, Any]:
    """Gradient-boosted trees on the log-odds (scikit-learn's HistGradientBoostingClassifier,
    fitted offline), written as the `"kind": "trees"` model server.alerts.hazard evaluates in
    pure Python. A None feature is a missing value: the fit learns where it goes."""
    try:
        import numpy as np
        from sklearn.ensemble import HistGradientBoostingClassifier
    except ImportError as exc:
        raise RuntimeError("fitting trees needs scikit-learn: pip install scikit-learn") from exc

    x = np.array([[np.nan if v is None else v for v in row] for row in data.x], dtype=np.float64).reshape(-1, len(FEATURES))
    logged = [index for index in range(len(FEATURES)) if np.isfinite(x[:, index]).any()]  # a never-logged feature is not split on
    x = x[:, logged]
    classifier = HistGradientBoostingClassifier(
        max_iter=trees, max_depth=depth, learning_rate=learning_rate, min_samples_leaf=min_leaf,
        l2_regularization=l2, early_stopping=False, random_state=0,
    )  # fmt: skip
    classifier.fit(x, np.asarray(data.y))
    out = []
    for (predictor,) in classifier._predictors:  # one tree per iteration (binary)
        out.append([
            [-1 if node["is_leaf"] else logged[int(node["feature_idx"])], round(float(node["num_threshold"]), 6),
             int(node["missing_go_to_left"]), int(node["left"]), int(node["right"]), round(float(node["value"]), 6)]
            for node in predictor.nodes
        ])  # fmt: skip
    return {
        "kind": "trees",
        "horizon": HORIZON,
        "features": list(FEATURES),
        "fitted_on": description,
        "intercept": round(float(np.ravel(classifier._baseline_prediction)[0]), 6),
        "trees": out,
    }


def calibration(data: Rows, model: HazardModel) -> dict[str, Any]:
    """Reliability table (per bin of predicted hazard: rows, mean predicted, observed rate),
    the Brier score, and the Brier score of always predicting the base rate."""
    predicted = [model.probability(x) for x in data.x]
    n = len(predicted)
    base = sum(data.y) / n if n else math.nan
    brier = sum((p - y) ** 2 for p, y in zip(predicted, data.y, strict=True)) / n if n else math.nan
    brier_base = sum((base - y) ** 2 for y in data.y) / n if n else math.nan
    table = []
    for low, high in zip(RELIABILITY_EDGES, RELIABILITY_EDGES[1:], strict=False):
        members = [(p, y) for p, y in zip(predicted, data.y, strict=True) if low <= p < high or (high == 1.0 and p == 1.0)]
        if members:
            table.append({
                "bin": [low, high], "rows": len(members),
                "predicted": sum(p for p, _ in members) / len(members),
                "observed": sum(y for _, y in members) / len(members),
            })  # fmt: skip
    return {
        "rows": n, "positives": sum(data.y), "base_rate": base, "brier": brier, "brier_base_rate": brier_base,
        "skill": 1 - brier / brier_base if brier_base else math.nan, "auc": auc(predicted, data.y), "reliability": table,
    }  # fmt: skip


def auc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """ROC AUC (Mann–Whitney, ties counted half): the chance a positive row outranks a negative one."""
    positives = sum(labels)
    negatives = len(labels) - positives
    if not positives or not negatives:
        return math.nan
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    rank_sum, i = 0.0, 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        mean_rank = (i + j) / 2 + 1
        rank_sum += mean_rank * sum(labels[order[k]] for k in range(i, j + 1))
        i = j + 1
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def feature_separation(data: Rows) -> list[dict[str, Any]]:
    """Per feature: its AUC for "collapses within HORIZON" over every row, and over the rows
    whose mismatch is high (log_kl above the median of the rows that do not collapse soon):
    what tells a run that will fall from one that keeps a high mismatch and learns."""
    kl = FEATURES.index("log_kl")
    calm = sorted(v for x, y in zip(data.x, data.y, strict=True) if not y and (v := x[kl]) is not None)
    median = calm[len(calm) // 2] if calm else math.inf
    high = {i for i, x in enumerate(data.x) if (v := x[kl]) is not None and v > median}
    out = []
    for index, name in enumerate(FEATURES):
        logged = [i for i, x in enumerate(data.x) if x[index] is not None]
        values = [float(data.x[i][index]) for i in logged]  # type: ignore[arg-type]
        labels = [data.y[i] for i in logged]
        mean_pos = [v for v, y in zip(values, labels, strict=True) if y]
        mean_neg = [v for v, y in zip(values, labels, strict=True) if not y]
        out.append({
            "feature": name,
            "auc": auc(values, labels),
            "auc_high_mismatch": auc([v for v, i in zip(values, logged, strict=True) if i in high], [data.y[i] for i in logged if i in high]),
            "mean_before_collapse": sum(mean_pos) / len(mean_pos) if mean_pos else math.nan,
            "mean_otherwise": sum(mean_neg) / len(mean_neg) if mean_neg else math.nan,
        })  # fmt: skip
    return out


def format_calibration(result: dict[str, Any]) -> str:
    lines = [
        f"hazard (collapse within {HORIZON} steps): {result['rows']} rows, {result['positives']} positive "
        f"(base rate {result['base_rate']:.3f}); Brier {result['brier']:.4f} vs {result['brier_base_rate']:.4f} "
        f"for the base rate (skill {result['skill']:.2f}); AUC {result['auc']:.3f}",
        f"{'predicted':>13s} {'rows':>7s} {'mean pred.':>10s} {'observed':>9s}",
    ]
    for row in result["reliability"]:
        low, high = row["bin"]
        lines.append(f"{f'{low:.2f}-{high:.2f}':>13s} {row['rows']:>7d} {row['predicted']:>10.3f} {row['observed']:>9.3f}")
    return "\n".join(lines)


def format_separation(table: Sequence[dict[str, Any]]) -> str:
    lines = [f"{'feature':18s} {'AUC':>6s} {'AUC, high KL':>12s} {'mean: before collapse':>22s} {'otherwise':>10s}"]
    for row in table:
        lines.append(
            f"{row['feature']:18s} {row['auc']:>6.3f} {row['auc_high_mismatch']:>12.3f} "
            f"{row['mean_before_collapse']:>22.3g} {row['mean_otherwise']:>10.3g}"
        )
    return "\n".join(lines)
