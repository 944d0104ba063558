"""The collapse hazard (server/alerts/hazard.py): its features, its model, its detector."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from server.alerts import hazard
from server.alerts.catalog import build_detector
from server.alerts.hazard import (
    FEATURES,
    HORIZON,
    MODEL,
    WARMUP,
    Hazard,
    HazardModel,
    features,
    hazard_series,
    load_model,
)


def _model(**weights: float) -> dict[str, object]:
    return {
        "horizon": HORIZON, "features": list(FEATURES), "fitted_on": "test", "intercept": -4.0,
        "weights": [weights.get(name, 0.0) for name in FEATURES],
        "means": [0.0] * len(FEATURES), "scales": [1.0] * len(FEATURES),
    }  # fmt: skip


KL_MODEL = HazardModel(_model(kl_climb=4.0))
"""A model that only looks at how far the mismatch climbed above its learned level."""


def _step(step: int, *, kl: float = 0.02, reward: float | None = None, **extra: float) -> dict[str, float]:
    return {
        "reward/mean": reward if reward is not None else min(0.9, 0.1 + step / 50), "reward/std": 0.1,
        "mismatch/kl": kl, "mismatch/ratio_max": 3.0, "grad/norm": 1.0, "mismatch/ess_frac": 0.9, **extra,
    }  # fmt: skip


def test_features_read_what_a_run_logs_and_are_zero_for_what_it_does_not() -> None:
    state: dict[str, object] = {}
    for step in range(300):
        x = dict(zip(FEATURES, features(state, _step(step, **{"mismatch/unbounded_frac": 0.05, "staleness/lag_mean": 3.0})), strict=True))
    assert x["gain"] == hazard.GAIN_CAP  # (0.9 - 0.14) / 0.1 = 7.6 spreads gained, saturated
    assert x["drawdown"] == pytest.approx(0.0) and x["reward_trend"] == pytest.approx(0.0, abs=1e-2)
    assert x["log_kl"] == pytest.approx(math.log10(0.02)) and x["kl_trend"] == pytest.approx(0.0)
    assert x["unbounded_frac"] == pytest.approx(5.0)  # percent of the loss tokens
    assert x["staleness"] == pytest.approx(math.log1p(3.0))
    assert x["ess_loss"] == pytest.approx(0.1)
    assert x["tail_persistence"] == pytest.approx(0.0)  # ratio 3 < e^2
    bare: dict[str, object] = {}
    assert features(bare, {"grad/norm": 2.0}) == [0.0 if name == "grad_trend" else None for name in FEATURES]
    assert features(bare, {}) == [0.0 if name == "grad_trend" else None for name in FEATURES]  # kept from the last step
    assert HazardModel(_model(unbounded_frac=9.0)).probability([None] * len(FEATURES)) == pytest.approx(1 / (1 + math.exp(4.0)))


def test_a_mismatch_climbing_after_learning_raises_the_climb_features_and_a_fall_the_drawdown() -> None:
    state: dict[str, object] = {}
    for step in range(150):
        x = features(state, _step(step))
    calm = dict(zip(FEATURES, x, strict=True))
    for step in range(150, 190):
        x = features(state, _step(step, kl=0.02 * 1.1 ** (step - 149), reward=0.9 - 0.01 * (step - 149)))
    climbed = dict(zip(FEATURES, x, strict=True))
    assert calm["kl_climb"] == 0.0 and climbed["kl_climb"] > 1.0
    assert climbed["kl_trend"] > 0.5 and climbed["drawdown"] > 2.0 and climbed["reward_trend"] < 0


def test_the_rise_above_the_learned_level_the_tails_and_the_unlikely_tokens_mismatch() -> None:
    """kl_rise and tail_rise: decades above the level the run had once it learned (the climbs'
    medians); tail_mass, low_tail: log10 of the tail shares (EWMA); unlikely_mismatch: log10
    of the mean |ℓ| where the sampler gave 1e-3 <= μ < 0.1."""
    extra = {"mismatch/tail_frac": 0.01, "mismatch/low_tail_frac": 0.002, "mismatch/log_ratio_abs_unlikely": 0.05}
    state: dict[str, object] = {}
    for step in range(200):
        x = dict(zip(FEATURES, features(state, _step(step, **extra)), strict=True))
    assert x["kl_rise"] == pytest.approx(0.0, abs=1e-6) and x["tail_rise"] == pytest.approx(0.0, abs=1e-6)
    assert x["tail_mass"] == pytest.approx(-2.0) and x["low_tail"] == pytest.approx(math.log10(0.002))
    assert x["unlikely_mismatch"] == pytest.approx(math.log10(0.05))
    for step in range(200, 260):  # the KL ten times its learned level, the ratio tail 100 times
        x = dict(zip(FEATURES, features(state, {**_step(step, kl=0.2, **extra), "mismatch/ratio_max": 300.0}), strict=True))
    assert x["kl_rise"] == pytest.approx(1.0, abs=1e-3) and x["tail_rise"] == pytest.approx(2.0, abs=1e-3)
    bare: dict[str, object] = {}
    for step in range(200):  # a run that logs none of the new metrics: None, said nothing
        y = dict(zip(FEATURES, features(bare, _step(step)), strict=True))
    assert y["tail_mass"] is None and y["low_tail"] is None and y["unlikely_mismatch"] is None
    assert y["kl_rise"] == pytest.approx(0.0, abs=1e-6)  # every run that logs the KL has it


def test_entropy_and_loss_running_away_from_their_learned_level_and_groups_without_spread() -> None:
    """entropy_rise, loss_rise: decades above the level the run had once it learned (the
    signature rules' climbs: entropy under 0.2 nats counts as 0.2, |loss| under 0.01 as 0.01, a
    loss of exactly 0 is skipped); entropy_climb, loss_climb: their CUSUMs; zero_spread: the
    share of groups without reward spread (EWMA). A run that logs none of them: None."""
    state: dict[str, object] = {}
    for step in range(200):  # learns with its entropy at 0.5 nats and |loss| around 0.2, some steps 0
        extra = {"policy/entropy": 0.5, "loss/pg": 0.0 if step % 7 == 0 else (-0.2 if step % 2 else 0.2), "reward/zero_std_frac": 0.25}
        x = dict(zip(FEATURES, features(state, _step(step, **extra)), strict=True))
    assert x["entropy_rise"] == pytest.approx(0.0, abs=1e-6) and x["entropy_climb"] == 0.0
    assert x["loss_rise"] == pytest.approx(0.0, abs=1e-6) and x["loss_climb"] == 0.0
    assert x["zero_spread"] == pytest.approx(0.25)
    after = features(copy.deepcopy(state), _step(200, **{"policy/entropy": 0.0, "loss/pg": 0.0}))
    assert after[FEATURES.index("entropy_rise")] < 0.0  # an entropy of 0 is a level (under the floor)...
    assert after[FEATURES.index("loss_rise")] == x["loss_rise"]  # ...a loss of exactly 0 is not
    for step in range(200, 240):  # the entropy to 5 nats (ten times), |loss| to 20 (a hundred times)
        extra = {"policy/entropy": 5.0, "loss/pg": -20.0, "reward/zero_std_frac": 0.25}
        x = dict(zip(FEATURES, features(state, _step(step, **extra)), strict=True))
    assert x["entropy_rise"] == pytest.approx(1.0, abs=1e-3) and x["loss_rise"] == pytest.approx(2.0, abs=1e-3)
    assert x["entropy_climb"] > 1.0 and x["loss_climb"] > 1.0
    sharp: dict[str, object] = {}
    for step in range(300):  # an entropy that sharpens to 0.001 nats: under its learned level (the
        # level follows it down, 2 % of the way a step), never a rise
        y = dict(zip(FEATURES, features(sharp, _step(step, **{"policy/entropy": max(0.001, 1.0 - step / 100)})), strict=True))
        assert y["entropy_rise"] is None or y["entropy_rise"] <= 0.0
    assert y["entropy_climb"] == 0.0 and y["loss_rise"] is None and y["zero_spread"] is None
    bare: dict[str, object] = {}
    for step in range(200):
        z = dict(zip(FEATURES, features(bare, _step(step)), strict=True))
    assert all(z[name] is None for name in ("entropy_rise", "entropy_climb", "loss_rise", "loss_climb", "zero_spread"))


def test_a_tree_model_walks_each_tree_and_sends_a_missing_feature_where_the_fit_did() -> None:
    gain, kl = FEATURES.index("gain"), FEATURES.index("log_kl")
    leaf = lambda value: [-1, 0.0, 0, 0, 0, value]  # noqa: E731
    model = HazardModel({
        "kind": "trees", "horizon": HORIZON, "features": list(FEATURES), "fitted_on": "test", "intercept": -3.0,
        "trees": [
            [[gain, 2.0, 1, 1, 2, 0.0], leaf(-1.0), [kl, -1.0, 0, 3, 4, 0.5], leaf(0.25), leaf(2.0)],
            [leaf(0.5)],
        ],
    })  # fmt: skip
    x: list[float | None] = [None] * len(FEATURES)
    assert model.log_odds(x)[0] == pytest.approx(-3.0 - 1.0 + 0.5)  # gain missing: left
    x[gain], x[kl] = 3.0, -0.5
    z, shares = model.log_odds(x)
    assert z == pytest.approx(-3.0 + 2.0 + 0.5) and model.probability(x) == pytest.approx(1 / (1 + math.exp(0.5)))
    assert shares[gain] == pytest.approx(0.5) and shares[kl] == pytest.approx(1.5)
    x[kl] = None  # missing goes right at this node
    assert model.log_odds(x)[0] == pytest.approx(-3.0 + 2.0 + 0.5)
    with pytest.raises(ValueError, match="kind"):
        HazardModel({**_model(), "kind": "forest"})


def test_the_model_is_a_logistic_on_standardised_features() -> None:
    model = HazardModel({**_model(gain=2.0), "means": [1.0] * len(FEATURES), "scales": [0.5] * len(FEATURES)})
    x = [0.0] * len(FEATURES)
    x[FEATURES.index("gain")] = 2.0
    assert model.probability(x) == pytest.approx(1 / (1 + math.exp(-(-4.0 + 2.0 * (2.0 - 1.0) / 0.5))))
    with pytest.raises(ValueError, match="features"):
        HazardModel({**_model(), "features": ["gain", "log_kl"]})
    with pytest.raises(ValueError, match="no intercept, scales: refit"):  # a file cut short, not a KeyError
        HazardModel({key: value for key, value in _model().items() if key not in ("intercept", "scales")})


def _drifting() -> list[dict[str, float]]:
    """Learns for 150 steps, then its mismatch climbs 10 % a step."""
    return [_step(step) for step in range(150)] + [_step(step, kl=0.02 * 1.1 ** (step - 149)) for step in range(150, 200)]


def test_the_series_starts_after_the_warm_up_and_rises_before_a_drift() -> None:
    series = hazard_series(_drifting(), KL_MODEL)
    assert series[:WARMUP] == [None] * WARMUP and series[WARMUP] is not None
    assert series[149] == pytest.approx(1 / (1 + math.exp(4.0)))
    assert series[-1] is not None and series[-1] > 0.99


def test_a_run_that_logs_its_kl_only_as_a_k1_estimate_gets_the_same_hazard() -> None:
    """verl's `rollout_corr/kl` (stored as `mismatch/kl_k1`) is the same KL in nats: the hazard
    reads it where a run logs no `mismatch/kl`, and a run with both reads `mismatch/kl`."""
    as_k1 = [{("mismatch/kl_k1" if key == "mismatch/kl" else key): value for key, value in row.items()} for row in _drifting()]
    assert hazard_series(as_k1, KL_MODEL) == hazard_series(_drifting(), KL_MODEL)
    both = [{**row, "mismatch/kl_k1": 5.0} for row in _drifting()]  # a wild k1 beside the KL: not read
    assert hazard_series(both, KL_MODEL) == hazard_series(_drifting(), KL_MODEL)
    assert hazard.reads({"mismatch/kl_k1": 0.1}) and not hazard.reads({"mismatch/log_ratio_abs_mean": 0.1})


def test_the_detector_fires_above_p_says_why_and_resumes_from_its_json_state() -> None:
    detector = build_detector("hazard", "reward/mean", {"p": 0.5}, hazard_model=KL_MODEL)
    assert isinstance(detector, Hazard) and detector.model is KL_MODEL
    rows = _drifting()
    state: dict[str, object] = detector.initial_state()
    fired, resumed = [], []
    for step, values in enumerate(rows):
        signal = detector.update(state, step, values)
        assert signal is not None
        if signal.active:
            fired.append(step)
            assert "collapse hazard" in signal.message and "kl_climb" in signal.message
        state = json.loads(json.dumps(state))  # as the engine stores it
    again: dict[str, object] = {}
    for step, values in enumerate(rows):
        signal = detector.update(again, step, values)
        if signal is not None and signal.active:
            resumed.append(step)
    assert fired and fired == resumed and 150 < fired[0] < 200
    assert detector.update({}, 0, {"policy/entropy": 1.0}) is None  # nothing it reads


def test_the_detector_computes_with_the_model_it_is_given() -> None:
    """Two detectors on the same rows, each with its own model: nothing is shared between them."""
    never = HazardModel({**_model(), "intercept": -30.0})
    rows = _drifting()
    signals = {}
    for name, model in (("kl", KL_MODEL), ("never", never)):
        detector = build_detector("hazard", "reward/mean", {"p": 0.5}, hazard_model=model)
        state: dict[str, object] = {}
        signals[name] = [detector.update(state, step, values) for step, values in enumerate(rows)]
    assert any(s is not None and s.active for s in signals["kl"])
    assert not any(s is not None and s.active for s in signals["never"])
    assert signals["never"][-1] is not None and signals["never"][-1].value == pytest.approx(1 / (1 + math.exp(30.0)))


def test_a_hazard_detector_built_without_a_model_checks_its_parameters_and_cannot_run() -> None:
    detector = build_detector("hazard", "reward/mean", {"p": 0.3})  # as a rule being validated
    assert detector.params == {"p": 0.3}
    with pytest.raises(RuntimeError, match="hazard_model"):
        detector.update({}, 0, _step(0))


@pytest.mark.parametrize("p", [0, 1, 1.5, -0.1, True, "0.5"])
def test_p_must_be_a_probability(p: object) -> None:
    with pytest.raises(ValueError, match="probability"):
        build_detector("hazard", "reward/mean", {"p": p})


def test_a_model_is_loaded_from_its_file_or_is_the_built_in_one(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    path.write_text(json.dumps(_model(kl_climb=4.0)), encoding="utf-8")
    loaded = load_model(path)
    assert loaded.weights == KL_MODEL.weights and loaded.intercept == -4.0
    assert load_model(str(path)).weights == KL_MODEL.weights
    assert load_model(None).weights == HazardModel(MODEL).weights == MODEL["weights"]
    path.write_text(json.dumps({**_model(), "features": ["drawdown", "gain"]}), encoding="utf-8")
    with pytest.raises(ValueError, match="refit"):
        load_model(path)


def test_a_model_fitted_before_features_were_added_reads_them_as_saying_nothing() -> None:
    """A model file of the first features (fitted before the others existed) still loads; the
    features added since weigh nothing, so its hazard is what it was."""
    old = 13
    full = _model(gain=1.0, ess_loss=2.0)
    before = {**full, "features": FEATURES[:old], **{key: full[key][:old] for key in ("weights", "means", "scales")}}  # type: ignore[index]
    model = HazardModel(before)
    assert model.weights == full["weights"] and model.scales == full["scales"]
    x = [0.5] * len(FEATURES)
    assert model.probability(x) == pytest.approx(HazardModel(full).probability(x))
    assert HazardModel(full).probability([*x[:old], *[9.0] * (len(FEATURES) - old)]) == pytest.approx(model.probability(x))


def test_backtest_replays_a_hazard_rule_as_the_engine_would() -> None:
    from server.alerts.backtest import backtest_rule
    from server.alerts.catalog import RuleSpec
    from wire import Row

    rows = _drifting()
    series = hazard_series(rows, KL_MODEL)
    first = next(step for step, h in enumerate(series) if h is not None and h > 0.5)
    rule = RuleSpec("collapse hazard", "reward/mean", "hazard", "critical", keep_firing_for=50, params={"p": 0.5})
    result = backtest_rule(rule, [Row(step=step, time=None, values=values) for step, values in enumerate(rows)], hazard_model=KL_MODEL)
    assert result.fired_steps == [first]
    assert "collapse hazard" in result.episodes[0].message and result.episodes[0].value == pytest.approx(series[first])


def test_a_step_with_nothing_the_hazard_reads_is_skipped_by_the_series_as_by_the_detector() -> None:
    rows = _drifting()
    padded = [row for values in rows for row in (values, {"policy/entropy": 1.0})]
    series, padded_series = hazard_series(rows, KL_MODEL), hazard_series(padded, KL_MODEL)
    assert padded_series[1::2] == [None] * len(rows) and padded_series[0::2] == series


def test_the_cache_extends_a_run_read_in_pieces_to_the_series_read_at_once() -> None:
    """A page re-reads the hazard every few seconds: each read adds the rows stored since,
    and the newest step (which may still get values) is computed again when read again."""
    from wire import Row

    values = [_step(s, kl=0.02 if s < 205 else 0.02 * 1.03 ** (s - 205)) for s in range(220)]
    whole = hazard_series(values, KL_MODEL)
    expected = ([s for s, v in enumerate(whole) if v is not None], [v for v in whole if v is not None])
    cache = hazard.HazardCache(KL_MODEL, runs=2)
    answer = hazard.Course([], [], hazard.Fall(), frozenset())
    for start, end in ((0, 20), (20, 21), (21, 120), (120, 220)):
        after = cache.after("run", 1.0)
        assert after == start - 2 if start else after == -1  # the last row read is read again
        rows = [Row(step=s, time=None, values=values[s]) for s in range(after + 1, end)]
        answer = cache.extend("run", 1.0, rows)
    assert answer.steps == expected[0] and answer.hazard == pytest.approx(expected[1], rel=1e-12)
    assert answer.fall() == hazard.fall_of(range(220), [v["reward/mean"] for v in values])
    # The newest step got one more value after it was first read: the next read sees it.
    late = {**values[219], "reward/mean": 0.0, "mismatch/kl": 1e-4}
    again = hazard_series([*values[:219], late], KL_MODEL)[-1]
    assert again != whole[-1] and cache.extend("run", 1.0, [Row(step=219, time=None, values=late)]).hazard[-1] == again
    # Another incarnation of the run (started again) starts afresh.
    assert cache.after("run", 2.0) == -1


def _course(rewards: list[float]) -> hazard.Course:
    """The course of a run that logged `rewards` every 10th step, read as a page does: in
    pieces, the newest step read again each time."""
    from wire import Row

    cache = hazard.HazardCache(KL_MODEL, runs=1)
    rows = [Row(step=10 * s, time=None, values={"reward/mean": r}) for s, r in enumerate(rewards)]
    course = cache.extend("run", 1.0, [])
    for start in range(0, len(rows), 37):
        after = cache.after("run", 1.0)
        course = cache.extend("run", 1.0, [row for row in rows[: start + 37] if row.step > after])
    return course


def test_the_label_read_in_pieces_is_the_label_read_at_once() -> None:
    """HazardCache keeps each run's label scan and goes on from it; whatever the pieces, the
    answer is fall_of(all rewards) — dips, a lasting fall, an unjudged one, a range that
    grows past [0, 1] — and so the corpora's label (wire.labels.falls)."""
    import random

    from wire import Row

    rng, seen = random.Random(7), set()
    for trial in range(60):
        level, rewards = 0.0, []
        for _ in range(rng.randrange(1, 400)):
            level = min(1.0, max(0.0, level + rng.gauss(0.004, 0.02) - (0.3 if rng.random() < 0.01 else 0.0)))
            rewards.append(level * (1.0 if trial % 3 else 40.0) - (5.0 if trial % 5 == 0 else 0.0))
        steps = [3 * s + 1 for s in range(len(rewards))]
        rows = [Row(step=s, time=None, values={"reward/mean": r}) for s, r in zip(steps, rewards, strict=True)]
        cache, done = hazard.HazardCache(KL_MODEL, runs=1), 0
        while done < len(rows):
            done = min(len(rows), done + rng.randrange(1, 60))
            after = cache.after("run", 1.0)
            course = cache.extend("run", 1.0, [row for row in rows[:done] if row.step > after])
            assert course.fall() == hazard.fall_of(steps[:done], rewards[:done]), (trial, done)
            label = course.fall()
            seen.update(kind for kind, found in (("dip", label.dips), ("collapse", label.collapsed_at), ("unjudged", label.falling_since)) if found)
    assert seen == {"dip", "collapse", "unjudged"}  # the pieces met every kind of answer


def test_a_run_whose_reward_fell_for_good_has_collapsed_by_the_corpora_label() -> None:
    """The page reads the hazard by it: past a lasting fall the hazard no longer speaks of
    the run. Steps are the run's own (here every 10th), the label is on the logged rows."""
    rise = [min(0.9, 0.01 * s) for s in range(120)]
    collapsed = _course([*rise, *[0.05] * 150])
    fall = collapsed.fall()
    assert fall.collapsed_at is not None and 1200 <= fall.collapsed_at <= 1300 and fall.falling_since is None
    recovering = _course([*rise, *[0.05] * 30, *[0.9] * 150]).fall()
    assert recovering.collapsed_at is None and len(recovering.dips) == 1 and 1200 <= recovering.dips[0] <= 1300
    falling = _course([*rise, *[0.05] * 40]).fall()  # fewer than 100 rows after the fall: not judged yet
    assert falling.collapsed_at is None and falling.falling_since is not None
    assert _course(rise).fall() == hazard.Fall()
    # A reward outside [0, 1] is read on the range it covered: the same run, scaled by 100.
    assert _course([100 * r for r in [*rise, *[0.05] * 150]]).fall() == fall


def test_the_hazard_says_which_of_its_main_metrics_a_run_never_logged() -> None:
    from wire import Row

    cache = hazard.HazardCache(KL_MODEL, runs=1)
    course = cache.extend("run", 1.0, [Row(step=s, time=None, values={"reward/mean": 0.1, "grad/norm": 1.0}) for s in range(3)])
    assert course.missing() == ["mismatch/kl", "mismatch/ratio_max"]
    k1 = hazard.HazardCache(KL_MODEL, runs=1).extend("run", 1.0, [Row(step=s, time=None, values={"reward/mean": 0.1, "mismatch/kl_k1": 0.01}) for s in range(3)])
    assert k1.missing() == ["mismatch/ratio_max", "grad/norm"]  # the k1 estimate stands for the KL


def test_the_entropy_and_loss_features_measure_as_the_signature_rules_do() -> None:
    """The hazard's entropy and loss climbs are the rules' (metric and every parameter but `h`:
    theirs never fire; and `fallback`, a condition for paging on a run whose reward never rose:
    the hazard's features are levels the run had once it learned), so a change of a rule's floor
    or scale cannot leave the hazard behind."""
    from server.alerts.catalog import SIGNATURE_RULES

    rules = {rule.name: rule for rule in SIGNATURE_RULES}
    for name, climb in (("entropy running away", hazard._ENTROPY_CLIMB), ("loss growing", hazard._LOSS_CLIMB)):
        rule = rules[name]
        assert climb.metric == rule.metric and rule.detector == "climb"
        own = {k: v for k, v in rule.params.items() if k not in ("h", "fallback")}
        assert {key: climb.params[key] for key in own} == own and climb.params["fallback"] == 0
