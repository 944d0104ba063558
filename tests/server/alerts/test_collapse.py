"""The collapse-risk detector (server/alerts/collapse.py), step by step."""

from __future__ import annotations

import math
import random

import pytest

from server.alerts.collapse import CollapseRisk
from server.alerts.detectors import RewardGain


def _calm(n: int, seed: int = 0) -> list[dict[str, float]]:
    """A learning run: reward up from 0.1, noisy slowly shrinking gradient, KL ~0.02."""
    rng = random.Random(seed)
    return [
        {
            "grad/norm": 0.9 * math.exp(-i / 150) * math.exp(rng.gauss(0, 0.15)),
            "mismatch/kl": 0.02 * math.exp(rng.gauss(0, 0.2)),
            "reward/mean": min(0.9, 0.1 + i / 50),
            "reward/std": 0.1,
        }
        for i in range(n)
    ]


def _feed(det: CollapseRisk, state: dict, rows: list[dict[str, float]], start: int = 0) -> list[int]:
    fired = []
    for offset, row in enumerate(rows):
        signal = det.update(state, start + offset, row)
        if signal is not None and signal.active:
            fired.append(start + offset)
    return fired


def test_a_spike_that_moved_the_policy_fires_one_that_did_not_stays_quiet() -> None:
    det = CollapseRisk("grad/norm")
    state = det.initial_state()
    calm = _calm(300)
    assert _feed(det, state, calm) == []
    last = calm[-1]
    # A 10x gradient step, and the KL of the next batches stays at its level: no page.
    assert _feed(det, state, [{**last, "grad/norm": 10 * last["grad/norm"]}] + [last] * 5, start=300) == []
    # A 10x step after which the learner is 3 nats from the sampler: fires on that KL.
    spike = {**last, "grad/norm": 10 * last["grad/norm"], "mismatch/ratio_max": 400.0, "mismatch/ess_frac": 0.03}
    moved = {**last, "mismatch/kl": 3.0, "mismatch/ratio_max": 400.0, "mismatch/ess_frac": 0.03}
    assert det.update(state, 310, spike).active is False  # the step's own KL predates the update
    signal = det.update(state, 311, moved)
    assert signal.active
    assert "spiked to" in signal.message and "at step 310" in signal.message and "ratio_max 400" in signal.message
    assert "after reward/mean had risen 7.6 times its early spread since the start" in signal.message
    # The spike did not move the gradient baseline, nor the KL level.
    assert math.exp(state["kl_level"]) == pytest.approx(0.02, rel=0.3)
    assert not det.update(state, 320, last).active


def test_a_kl_jump_long_after_the_spike_or_without_one_does_not_fire() -> None:
    det = CollapseRisk("grad/norm")
    state = det.initial_state()
    calm = _calm(200, seed=1)
    _feed(det, state, calm)
    last = calm[-1]
    det.update(state, 200, {**last, "grad/norm": 10 * last["grad/norm"]})
    # confirm_steps (3) later the window has closed.
    assert _feed(det, state, [last] * 3, start=201) == []
    assert not det.update(state, 204, {**last, "mismatch/kl": 3.0}).active
    # A stale sampler's KL climbing on its own is the warning's business, not a page.
    assert _feed(det, state, [{**last, "mismatch/kl": 5.0}] * 10, start=210) == []


@pytest.mark.parametrize(("kl", "pages"), [(3.9, False), (4.1, True)])  # +1.9 nats but under 2x; +2.1, over 2x
def test_kl_must_rise_relative_to_its_own_level_too(kl: float, pages: bool) -> None:
    det = CollapseRisk("grad/norm")
    state = det.initial_state()
    rows = [{**row, "mismatch/kl": 2.0} for row in _calm(200, seed=2)]  # a very stale sampler
    _feed(det, state, rows)
    last = rows[-1]
    assert det.params["kl_factor"] == 2.0
    det.update(state, 200, {**last, "grad/norm": 10 * last["grad/norm"]})
    assert det.update(state, 201, {**last, "mismatch/kl": kl}).active is pages


def test_a_noisy_batch_after_one_that_shows_the_policy_unmoved_does_not_confirm() -> None:
    """A converged PPO run of the regime corpus (ppo-lag3-fp16-lr0.002-d2-b32x4-s181): its
    policy nearly deterministic, its KL ~1e-5 on most batches and up to 0.2 on some; a 28x
    gradient, then a batch whose KL is at its level (the update did not move the policy),
    then one rare batch at 19.3 nats. That paged (the window was 3 steps, any reading in it);
    now the unmoved batch closes the window. A learner that moves away at once and stays
    away still confirms on a later batch of the window."""
    det = CollapseRisk("grad/norm")
    state = det.initial_state()
    rng = random.Random(5)
    rows = [{**row, "mismatch/kl": 1e-5 * math.exp(rng.gauss(0, 1.5))} for row in _calm(300, seed=5)]
    assert _feed(det, state, rows) == []
    last = {**rows[-1], "mismatch/kl": 1e-5}
    spike = {**last, "grad/norm": 10 * last["grad/norm"]}
    unmoved, outlier = {**last, "mismatch/kl": 1.5e-5}, {**last, "mismatch/kl": 19.3}
    assert _feed(det, state, [spike, unmoved, outlier, last, last], start=300) == []
    moved, away = {**last, "mismatch/kl": 0.5}, {**last, "mismatch/kl": 3.0}
    assert _feed(det, state, [spike, moved, away, last], start=320) == [322]


def test_nothing_but_a_non_finite_gradient_fires_before_the_baseline() -> None:
    det = CollapseRisk("grad/norm")
    state = det.initial_state()

    def pattern(rows: list[dict[str, float]], start: int) -> list[int]:
        """Every other step a 50x gradient, and the step after it 5 nats of KL."""
        fired = []
        for i, row in enumerate(rows):
            for step, values in ((start + 2 * i, {**row, "grad/norm": 50.0}), (start + 2 * i + 1, {**row, "mismatch/kl": 5.0})):
                if det.update(state, step, values).active:
                    fired.append(step)
        return fired

    rows = _calm(40, seed=3)
    assert _feed(det, state, rows[:10]) == []
    assert pattern(rows[10:20], 10) == [] and state["n"] == det.params["warmup"]  # 30 gradient steps: the baseline
    assert pattern(rows[20:22], 30) == [31, 33]  # the same pattern, once there is a baseline
    assert det.update(det.initial_state(), 0, {"grad/norm": math.inf}).active


def test_without_mismatch_kl_only_a_huge_spike_fires() -> None:
    det = CollapseRisk("grad/norm")
    state = det.initial_state()
    rows = [{k: v for k, v in row.items() if k != "mismatch/kl"} for row in _calm(200, seed=4)]
    _feed(det, state, rows)
    g = rows[-1]["grad/norm"]
    assert not det.update(state, 200, {**rows[-1], "grad/norm": 20 * g}).active
    assert det.update(state, 201, {**rows[-1], "grad/norm": 500 * g}).active


def test_does_not_fire_before_the_reward_has_moved() -> None:
    det = CollapseRisk("grad/norm")
    state = det.initial_state()
    flat = [{**row, "reward/mean": 0.1} for row in _calm(100, seed=5)]
    _feed(det, state, flat)
    last = flat[-1]
    det.update(state, 100, {**last, "grad/norm": 10 * last["grad/norm"]})
    signal = det.update(state, 101, {**last, "mismatch/kl": 3.0})
    assert not signal.active and "diverging" in signal.message


@pytest.mark.parametrize(("reward", "pages"), [(0.3, False), (0.5, True)])
def test_a_run_must_have_gained_min_gain_spreads_of_reward_to_be_paged(reward: float, pages: bool) -> None:
    """The start averages 0.14 (the first 5 rewards) with a per-sample spread of 0.1: a peak
    of 0.3 is +1.6 spreads, too little to lose; 0.5 is +3.6. (A jump of 9 nats is over what
    kl_gain asks of either.)"""
    det = CollapseRisk("grad/norm")
    assert det.params["min_gain"] == 2.5
    state = det.initial_state()
    rows = [{**row, "reward/mean": min(reward, row["reward/mean"])} for row in _calm(100, seed=6)]
    _feed(det, state, rows)
    last = rows[-1]
    det.update(state, 100, {**last, "grad/norm": 10 * last["grad/norm"]})
    signal = det.update(state, 101, {**last, "mismatch/kl": 9.0})
    assert signal.active is pages
    assert ("diverging" in signal.message) is not pages


@pytest.mark.parametrize(("peak", "kl", "pages"), [(0.9, 1.8, True), (0.5, 1.8, False), (0.5, 3.8, True)])
def test_the_jump_that_pages_shrinks_as_the_run_gains(peak: float, kl: float, pages: bool) -> None:
    """jump > kl_gain / gain: a run that gained 7.6 spreads (peak 0.9) is paged for 1.8 nats
    (13 / 7.6 = 1.7 asked), one that gained 3.6 (peak 0.5) only from 3.6 nats on."""
    det = CollapseRisk("grad/norm")
    assert det.params["kl_gain"] == 13.0 and det.params["kl_jump"] == 1.25
    state = det.initial_state()
    rows = [{**row, "reward/mean": min(peak, row["reward/mean"])} for row in _calm(100, seed=7)]
    _feed(det, state, rows)
    assert RewardGain.gain(state) == pytest.approx((peak - 0.14) / 0.1, rel=0.01)
    last = rows[-1]
    det.update(state, 100, {**last, "grad/norm": 10 * last["grad/norm"]})
    signal = det.update(state, 101, {**last, "mismatch/kl": kl})
    assert signal.active is pages


def test_without_a_reward_the_jump_asked_is_kl_jump() -> None:
    det = CollapseRisk("grad/norm")
    state = det.initial_state()
    rows = [{k: v for k, v in row.items() if not k.startswith("reward/")} for row in _calm(100, seed=8)]
    _feed(det, state, rows)
    last = rows[-1]
    det.update(state, 100, {**last, "grad/norm": 10 * last["grad/norm"]})
    assert not det.update(state, 101, {**last, "mismatch/kl": 1.2}).active
    assert det.update(state, 102, {**last, "mismatch/kl": 1.4}).active


@pytest.mark.parametrize(
    "params",
    [{"spike_factor": 1.0}, {"alpha": 1.0}, {"kl_factor": 0.5}, {"spike_only_factor": 2.0}, {"min_gain": -1}, {"kl_gain": -1}, {"kl_key": 3}],
)
def test_invalid_parameters_are_refused(params: dict) -> None:
    with pytest.raises(ValueError):
        CollapseRisk("grad/norm", params)
