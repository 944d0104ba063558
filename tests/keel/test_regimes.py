"""keel/regimes.py: leave one regime out, on a hand-made corpus with the real detectors."""

from __future__ import annotations

import math
import random

from keel.eval_alerts import CorpusRun, hazard_rule, rule_firings
from keel.regimes import (
    cells,
    hazard_steps,
    leave_one_out,
    operating_curve,
    threshold_firings,
    worst,
)
from server.alerts.catalog import DEFAULT_RULES
from server.alerts.hazard import MODEL, HazardModel


def _run(index: int, lr: float, loss: str, collapse: bool) -> CorpusRun:
    """A run that learns (0.1 -> 0.8); a collapsing one has its KL and ratio tail climb from
    step 250 and its reward fall for good at 300."""
    rng = random.Random(index)
    steps = 600
    reward, kl, ratio = [], [], []
    for step in range(steps):
        level = min(0.8, 0.1 + step / 200)
        drifting = collapse and step >= 250
        if collapse and step >= 300:
            level = 0.2
        reward.append(level + rng.gauss(0, 0.02))
        kl.append((0.02 * math.exp((step - 250) / 12) if drifting else 0.02) * math.exp(rng.gauss(0, 0.1)))
        ratio.append((5.0 * math.exp((step - 250) / 10) if drifting else 5.0) * math.exp(rng.gauss(0, 0.1)))
    series = {
        "reward/mean": reward, "reward/std": [0.1] * steps, "mismatch/kl": kl, "mismatch/ratio_max": ratio,
        "grad/norm": [math.exp(rng.gauss(0, 0.1)) for _ in range(steps)],
    }  # fmt: skip
    config = {"loss": loss, "lag": 4, "lr": lr, "digits": 3, "size": "tiny", "prompts": 16, "group": 8, "sampler_dtype": "bf16"}
    return CorpusRun.labelled(f"r{index}", config, series)


def corpus() -> list[CorpusRun]:
    runs = []
    for index in range(36):
        runs.append(_run(index, (5e-4, 1.5e-3, 3e-3)[index % 3], ("ppo", "cispo")[index // 3 % 2], index % 4 == 0))
    runs[1].config["size"] = "small"  # one small model: the 35 tiny ones are no held-out regime
    for run in runs[:12]:
        run.config["clip"] = 2.0 if int(run.name[1:]) < 6 else 0.0  # runs that do not say are not split on it
    toy = _run(99, 1e-3, "ppo", True)  # a run without the axes: fitted on, never held out
    return [*runs, CorpusRun.labelled("toy", {"loss": "ppo", "lag": 4}, toy.series)]


def test_threshold_firings_are_the_backtests() -> None:
    runs = corpus()[:8]
    model = HazardModel(MODEL)
    for p in (0.02, 0.1, 0.5):
        replayed = rule_firings(runs, [hazard_rule(p)], hazard_model=model)["collapse hazard"]
        emulated = [threshold_firings([(s, model.probability(x)) for s, x in steps], p, 50) for steps in hazard_steps(runs)]
        assert emulated == replayed
    assert any(replayed) or any(rule_firings(runs, [hazard_rule(0.02)], hazard_model=model)["collapse hazard"])


def test_every_axis_value_is_held_out_once_and_fitted_without_it() -> None:
    runs = corpus()
    assert sum(run.collapse_step is not None for run in runs) == 10 and runs[0].collapse_step == 300
    found = cells(runs, min_runs=5)
    assert [(c.axis, c.value, len(c.runs)) for c in found] == [
        ("learning rate", "1e-3 to 2e-3", 12), ("learning rate", "2e-3 to 4e-3", 12), ("learning rate", "< 1e-3", 12),
        ("loss family", "bounded", 18), ("loss family", "unbounded", 18), ("clipping", "off", 6), ("clipping", "on", 6),
    ]  # fmt: skip
    assert all(len(runs) - 1 not in cell.runs for cell in found)  # the toy run is never held out
    fitted: list[int] = []

    def fit_model(data):  # the real fit, counting the rows it was given
        from keel.hazard_eval import fit

        fitted.append(len(data.y))
        return fit(data)

    results = leave_one_out(runs, DEFAULT_RULES, 0.5, min_runs=5, fit_model=fit_model)
    assert len(results) == 7
    # Each fit saw the rows of the other runs only: two thirds of the corpus, then half.
    total = sum(1 for steps in hazard_steps(runs) for _ in steps)
    assert all(rows < total for rows in fitted) and fitted[0] > fitted[3]
    for result in results:
        rules, alone = result.scores
        assert rules.detector == "rules" and alone.detector == "hazard > 0.5"
        assert rules.collapsing + rules.stable_bounded + rules.stable_unbounded == len(result.cell.runs)
    # The drift is the same in every cell: the hazard fitted on the others catches it.
    assert all(result.scores[1].recall == 1.0 for result in results)
    w = worst(results, "hazard > 0.5")
    assert w["recall"]["value"] == 1.0 and w["fa_bounded"]["value"] == 0.0
    curve = operating_curve(results[0], runs, [0.01, 0.5, 0.99])
    assert [s.detector for s in curve] == ["hazard > 0.01", "hazard > 0.5", "hazard > 0.99"]
    fa = [s.false_alarms_bounded + s.false_alarms_unbounded for s in curve]
    assert fa == sorted(fa, reverse=True)  # a higher threshold never pages more
