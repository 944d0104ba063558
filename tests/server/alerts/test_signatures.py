"""The default rules on the signatures every RL run logs (server/alerts/catalog.py
SIGNATURE_RULES, docs/alerts.md "Every signal a run logs"), replayed through the engine's own
backtest on synthetic runs shaped like real ones: a GRPO run whose entropy runs away to a
uniform output, a loss that grows into the thousands, answers running to the length cap, a
small-batch GRPO run whose every other step has no reward spread; and their healthy twins,
on which no default rule may fire."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable

import pytest

from server.alerts.backtest import backtest
from server.alerts.catalog import DEFAULT_RULES, build_detector
from wire import Row

STEPS = 300
FALL = 200
"""The step where the failing runs' reward falls (their signature starts 30-40 steps before)."""


def _reward(rng: random.Random, step: int, *, falls: bool, samples: int = 64) -> float:
    """A GRPO reward: the mean of `samples` 0/1 answers whose success rate climbs 0.1 -> 0.7
    over the first 100 steps, and (if it `falls`) drops to 0.02 from FALL on."""
    p = 0.1 + 0.6 * min(1.0, step / 100)
    if falls and step >= FALL:
        p = 0.02
    return sum(rng.random() < p for _ in range(samples)) / samples


def _run(seed: int, signal: dict[str, object], *, falls: bool) -> list[Row]:
    rng = random.Random(seed)
    rows = []
    for step in range(STEPS):
        values = {"reward/mean": _reward(rng, step, falls=falls)}
        for key, make in signal.items():
            value = make(rng, step)  # type: ignore[operator]
            if value is not None:
                values[key] = value
        rows.append(Row(step=step, time=None, values=values))
    return rows


def _fired(rows: list[Row]) -> dict[str, list[int]]:
    return {result.rule.name: result.fired_steps for result in backtest(DEFAULT_RULES, rows) if result.fired_steps}


def _entropy(rng: random.Random, step: int, *, runaway: bool) -> float:
    """Sharpens 1.2 -> 0.3 nats as the run learns; a runaway climbs from step 160 to the
    uniform output over a 150k-token vocabulary (ln 151,936 = 11.9 nats)."""
    level = 0.3 + 0.9 * math.exp(-step / 40)
    if runaway and step >= 160:
        level = min(11.9, 0.3 * math.exp((step - 160) / 12))
    return level * math.exp(rng.gauss(0, 0.05))


def _loss(rng: random.Random, step: int, *, grows: bool) -> float:
    """A GRPO loss: noise around 0 (exact zeros included, as logs rounded to 4 digits show);
    a growing one rises from step 165 into the thousands."""
    noise = round(rng.gauss(0, 0.004), 4) if rng.random() < 0.7 else 0.0
    if grows and step >= 165:
        return noise + 0.05 * math.exp((step - 165) / 3.5)
    return noise


def test_entropy_running_away_is_paged_before_the_reward_falls_and_its_twin_is_not() -> None:
    fired = _fired(_run(1, {"policy/entropy": lambda r, s: _entropy(r, s, runaway=True)}, falls=True))
    steps = fired.get("entropy running away")
    assert steps, fired
    assert 160 < steps[0] < FALL - 10, steps  # it needs the climb, and comes well before the fall
    # Against its start (1.1 nats, before it sharpened) the entropy is 3x only later, still before the fall.
    assert steps[0] < fired["entropy far above its start"][0] < FALL, fired
    assert set(fired) == {"entropy running away", "entropy far above its start"}, fired
    assert _fired(_run(1, {"policy/entropy": lambda r, s: _entropy(r, s, runaway=False)}, falls=False)) == {}


def _small_batch(seed: int, entropy: Callable[[random.Random, int], float], success: Callable[[int], float], steps: int = 200) -> list[Row]:
    """Eight 0/1 answers a step (their spread logged as `reward/std`) and an entropy."""
    rng = random.Random(seed)
    rows = []
    for step in range(steps):
        answers = [1.0 if rng.random() < success(step) else 0.0 for _ in range(8)]
        values = {"reward/mean": statistics.fmean(answers), "reward/std": statistics.pstdev(answers), "policy/entropy": entropy(rng, step)}
        rows.append(Row(step=step, time=None, values=values))
    return rows


def test_an_entropy_that_leaves_its_start_before_the_run_has_learned_is_paged_and_a_burst_is_not() -> None:
    """A model fine-tuned from a trained one starts sharp (0.2-0.3 nats). The run that falls
    (the shape of a public GRPO run with clipping and KL, docs/alerts.md "Real runs") drifts to
    1.25 nats (5 times its start, as that run did) over its first 30 steps while its reward, 8 answers a step, has not gained
    what the climbs wait for; then, at step 60, its output goes uniform and its reward to 0.
    "entropy running away" has no learned level to measure it against; "entropy far above its
    start" pages it 10 steps and more before the fall. A healthy run that sharpens from 0.45 to
    0.1 nats and bursts to 2-4 nats for 8 steps (a public on-policy REINFORCE run does) is not
    paged, nor is a run trained from scratch, which starts at its highest entropy (the uniform
    output over 64 tokens) and comes back to it."""

    def drifting(rng: random.Random, step: int) -> float:
        level = 0.25 + 1.0 * min(1.0, max(0, step - 10) / 20) if step < 60 else 11.9
        spike = 3.0 if rng.random() < 0.1 else 1.0
        return level * spike * math.exp(rng.gauss(0, 0.3))

    burst = [1.07, 0.54, 1.95, 3.83, 4.29, 2.79, 0.05, 0.04, 0.12, 4.11, 2.73, 3.12, 2.33, 0.59, 0.49, 0.97, 1.40, 0.89, 0.26, 0.32]
    burst += [0.57, 0.69, 1.10, 0.88, 0.49, 0.65, 1.62, 2.05, 1.78, 1.11, 1.21, 1.31, 0.63, 0.44]  # that run's steps 61-94

    def bursting(rng: random.Random, step: int) -> float:
        if 61 <= step < 61 + len(burst):
            return burst[step - 61]
        return (0.1 + 0.35 * math.exp(-step / 25)) * math.exp(rng.gauss(0, 0.2))

    def from_scratch(rng: random.Random, step: int) -> float:
        return min(4.16, (0.3 + 3.86 * math.exp(-step / 20)) * (1.0 if step < 150 else math.exp((step - 150) / 10))) * math.exp(rng.gauss(0, 0.05))

    for seed in range(5):
        falls = _fired(_small_batch(seed, drifting, lambda step: 0.35 if step < 60 else 0.0))
        assert "entropy running away" not in falls, (seed, falls)
        assert falls["entropy far above its start"][0] < 50, (seed, falls)  # 10 steps and more before the fall
        healthy = _fired(_small_batch(seed, bursting, lambda step: 0.2 + 0.5 * min(1.0, step / 100)))
        assert "entropy far above its start" not in healthy, (seed, healthy)
        scratch = _fired(_small_batch(seed, from_scratch, lambda step: 0.1 + 0.6 * min(1.0, step / 100) if step < 170 else 0.02))
        assert "entropy far above its start" not in scratch and "entropy running away" in scratch, (seed, scratch)


def test_a_loss_growing_into_the_thousands_is_paged_and_a_loss_near_zero_is_not() -> None:
    rows = _run(2, {"loss/pg": lambda r, s: _loss(r, s, grows=True)}, falls=True)
    fired = _fired(rows)
    assert set(fired) == {"loss growing"}, fired
    assert 165 < fired["loss growing"][0] < FALL - 10, fired
    result = next(r for r in backtest(DEFAULT_RULES, rows) if r.rule.name == "loss growing")
    message = result.episodes[0].message
    assert message.startswith("|loss/pg| climbing:") and "the level it had once the run learned (0.01)" in message, message
    for seed in range(3, 8):  # noise around zero, exact zeros and all, never pages
        assert _fired(_run(seed, {"loss/pg": lambda r, s: _loss(r, s, grows=False)}, falls=False)) == {}


def test_a_loss_about_zero_on_some_steps_and_of_its_size_on_the_others_has_that_size_as_its_level() -> None:
    """Importance sampling or PPO at lag 0 with group-normalised advantages: the surrogate is
    0 up to rounding (1e-5) wherever every ratio is 1 and the advantages cancel, and of its
    size (about 1) on the other steps. Its level is that size, not the floor: the steps of its
    usual size are not growth (they were paged as 2 decades over a level at the floor), and a
    loss that grows from that size into the thousands still is."""

    def bimodal(grows: bool) -> object:
        def make(rng: random.Random, step: int) -> float:
            size = 1.0 * math.exp(rng.gauss(0, 0.4)) * (math.exp((step - 165) / 4) if grows and step >= 165 else 1.0)
            return rng.gauss(0, 1e-5) if rng.random() < 0.6 else size

        return make

    for seed in range(4):
        assert _fired(_run(seed, {"loss/pg": bimodal(False)}, falls=False)) == {}, seed
        fired = _fired(_run(seed, {"loss/pg": bimodal(True)}, falls=True))
        assert set(fired) == {"loss growing"} and 165 < fired["loss growing"][0] < FALL - 5, (seed, fired)


def _resumed(seed: int, *, runaway: bool, falls: bool) -> list[Row]:
    """A run resumed from a trained checkpoint: its reward starts at 0.7 and never rises (no
    learned level by the reward's gain), its entropy sits at 0.4 nats; a runaway climbs from step
    150, and the reward of one that `falls` slides from 0.7 to 0.05 over steps 170-230."""
    rng = random.Random(seed)
    rows = []
    for step in range(STEPS):
        p = 0.7 if not falls or step < 170 else max(0.05, 0.7 - 0.65 * (step - 170) / 60)
        level = 0.4 if not runaway or step < 150 else min(11.9, 0.4 * math.exp((step - 150) / 15))
        values = {"reward/mean": sum(rng.random() < p for _ in range(64)) / 64, "policy/entropy": level * math.exp(rng.gauss(0, 0.1))}
        rows.append(Row(step=step, time=None, values=values))
    return rows


def test_a_run_whose_reward_never_rose_is_paged_when_its_entropy_runs_away_as_its_reward_falls() -> None:
    """No learned level: after `fallback` (100) values the level is the last 50 anyway, and the
    entropy's runaway pages only while the reward is also 2 initial spreads below its peak.
    Against its start (0.4 nats) the runaway is paged whatever the reward does, by "entropy far
    above its start" (a logged reward can hold while the answers' correctness falls: the
    format-reward run of docs/alerts.md, "Real runs")."""
    for seed in range(3):
        fired = _fired(_resumed(seed, runaway=True, falls=True))
        steps = fired.get("entropy running away")
        assert steps and 170 < steps[0] < 200, fired  # once the reward has started to fall
        held = _fired(_resumed(seed, runaway=True, falls=False))
        assert list(held) == ["entropy far above its start"], held  # it holds its reward: only the start rule
        assert 150 + 15 * math.log(3) < held["entropy far above its start"][0] < 200, held
        assert _fired(_resumed(seed, runaway=False, falls=True)) == {}  # nothing ran away
    result = next(r for r in backtest(DEFAULT_RULES, _resumed(0, runaway=True, falls=True)) if r.rule.name == "entropy running away")
    assert "spreads below its level then" in result.episodes[0].message, result.episodes[0].message


def test_a_run_that_learns_after_the_fallback_has_its_level_retaken_when_it_does() -> None:
    detector = build_detector("climb", "policy/entropy", {"fallback": 100, "warmup": 50})
    state = detector.initial_state()
    rng = random.Random(0)
    for step in range(300):
        reward = 0.1 + rng.gauss(0, 0.02) if step < 150 else 0.9  # rises at step 150
        entropy = 2.0 if step < 115 else 0.5  # sharpens before it
        detector.update(state, step, {"reward/mean": reward, "policy/entropy": entropy})
        if step == 120:
            assert state["fallback"] and math.exp(state["median"]) == pytest.approx(2.0)
    assert "fallback" not in state and math.exp(state["median"]) == pytest.approx(0.5)  # the 50 values before step 150


def test_a_level_retaken_after_the_fallback_is_the_level_a_run_that_waited_took() -> None:
    """Once the reward rises, a climb that fell back measures from the very level (the same
    values) and fires at the very steps as the same climb without a fallback: the fallback
    only adds what it pages while the run had no learned level."""
    rng = random.Random(3)
    rows = []
    for step in range(400):
        reward = 0.1 + rng.gauss(0, 0.02) if step < 180 else min(0.9, 0.1 + (step - 180) / 40)
        entropy = 1.0 * math.exp(rng.gauss(0, 0.3)) * (math.exp((step - 300) / 10) if step >= 300 else 1.0)
        rows.append({"reward/mean": reward, "policy/entropy": entropy})
    fired, levels = {}, {}
    for fallback in (0, 100):
        detector = build_detector("climb", "policy/entropy", {"fallback": fallback, "k": 2.0, "h": 10.0})
        state = detector.initial_state()
        fired[fallback] = [step for step, row in enumerate(rows) if getattr(detector.update(state, step, row), "active", False)]
        levels[fallback] = (state["median"], state["scale"])
    assert fired[0] and fired[0][0] > 300 and fired[100] == fired[0]
    assert levels[100] == levels[0]


def test_the_loss_rule_reads_the_whole_loss_first_and_the_pg_loss_without_one() -> None:
    detector = build_detector("climb", "loss/total|loss/pg", {"of": "magnitude"})
    state = detector.initial_state()
    detector.update(state, 0, {"loss/pg": 0.5})
    assert state["key"] == "loss/pg"
    state = detector.initial_state()
    detector.update(state, 0, {"loss/pg": 0.5, "loss/total": 0.7})
    assert state["key"] == "loss/total"


def test_answers_running_to_the_length_cap_warn_and_a_low_truncated_share_does_not() -> None:
    def truncated(rng: random.Random, step: int, *, runs: bool) -> float:
        share = 0.5 + rng.uniform(-0.05, 0.05)
        if runs and step >= 150:
            share = min(0.98, 0.5 + (step - 150) * 0.015)
        return share

    fired = _fired(_run(4, {"response/truncated_frac": lambda r, s: truncated(r, s, runs=True)}, falls=True))
    assert set(fired) == {"answers at the length cap", "answers cut at the cap"}, fired
    # The warning as the share climbs; the page once 9 answers in 10 are cut and the reward's
    # 10-step mean has lost 30 % of its best: here within a few steps of its sudden fall.
    assert 150 < fired["answers at the length cap"][0] < FALL <= fired["answers cut at the cap"][0] < FALL + 10, fired
    # Every answer cut while the reward holds (a reward that reads the answer before the
    # rambling that runs to the cap, as a public TRL sweep shows): the warning, no page.
    held = _fired(_run(4, {"response/truncated_frac": lambda r, s: truncated(r, s, runs=True)}, falls=False))
    assert list(held) == ["answers at the length cap"], held
    assert _fired(_run(4, {"response/truncated_frac": lambda r, s: truncated(r, s, runs=False)}, falls=False)) == {}
    low = {"response/truncated_frac": lambda r, s: r.choice([0.0, 0.01, 0.02, 0.05, 0.08])}
    assert _fired(_run(5, low, falls=False)) == {}  # a share under the floor (0.1) is not a climb


def test_every_group_without_reward_spread_for_twenty_steps_warns() -> None:
    rows = _run(6, {"reward/zero_std_frac": lambda r, s: 0.95 if s >= 120 else 0.3}, falls=False)
    assert _fired(rows) == {"no learning signal": [139]}


def test_a_loss_that_gates_out_every_token_for_twenty_steps_warns() -> None:
    """verl's rejection preset rejecting every sequence (its masked share at 1, a gradient of
    exactly 0): "loss gated out" at the 20th such step, and nothing for a gate that throws away
    half the tokens, or all of them for 15 steps only."""
    stall = _run(7, {"gate/frac": lambda r, s: 1.0 if s >= 50 else 0.4 + 0.1 * r.random(), "grad/norm": lambda r, s: 0.0 if s >= 50 else 1.0}, falls=False)
    assert _fired(stall) == {"loss gated out": [69]}
    assert _fired(_run(7, {"gate/frac": lambda r, s: 0.4 + 0.2 * r.random()}, falls=False)) == {}
    assert _fired(_run(7, {"gate/frac": lambda r, s: 0.99 if 50 <= s < 65 else 0.5}, falls=False)) == {}


@pytest.mark.parametrize("seed", range(4))
def test_a_small_grpo_batch_whose_every_other_step_has_no_spread_pages_nothing(seed: int) -> None:
    """Eight samples a step: a step whose samples all got the same reward has a zero advantage,
    a gradient norm near 1e-3 and a policy ratio of exactly 1 (ppo_kl ~1e-9); the next one ~1.
    Steps alternate, then come in runs of either kind. No default rule may fire on it."""
    rng = random.Random(seed)
    rows = []
    for step in range(STEPS):
        silent = step % 2 == 0 if step < 150 else (step // 7) % 2 == 0
        reward = sum(rng.random() < 0.4 for _ in range(8)) / 8
        values = {
            "reward/mean": reward,
            "grad/norm": (1e-3 if silent else 1.0) * math.exp(rng.gauss(0, 0.3)),
            "policy/ppo_kl": (1e-9 if silent else 1e-3) * math.exp(rng.gauss(0, 0.3)),
            "policy/clip_frac": 0.0 if silent else rng.uniform(0, 0.02),
            "loss/pg": 0.0 if silent else rng.gauss(0, 0.05),
            "policy/entropy": 0.6 * math.exp(rng.gauss(0, 0.05)),
        }
        rows.append(Row(step=step, time=None, values=values))
    assert _fired(rows) == {}


def test_the_policy_ratio_jumping_after_the_run_learned_warns() -> None:
    def ppo_kl(rng: random.Random, step: int) -> float:
        return (0.3 if step == 170 else 1e-3) * math.exp(rng.gauss(0, 0.3))

    fired = _fired(_run(7, {"policy/ppo_kl": ppo_kl}, falls=False))
    assert fired == {"policy ratio jumping": [170]}


def test_a_mismatch_that_creeps_up_over_hundreds_of_steps_is_no_drift_but_a_surge_is() -> None:
    """Mismatch drift asks the KL's recent rise (its 10-step average 3x its 50-step one) of
    a co-climb: a KL and ratio tail that creep up tenfold over 600 steps of a run that learns
    accumulate a CUSUM, and are not paged; the same climb over 20 steps is."""

    def rows(surge: bool) -> list[Row]:
        rng = random.Random(8)
        out = []
        for step in range(800):
            creep = math.exp(max(0, step - 150) / 260)  # 10x by step 750
            if surge and step >= 600:
                creep = math.exp(450 / 260) * math.exp((step - 600) / 8)
            kl = 0.01 * creep * math.exp(rng.gauss(0, 0.2))
            values = {
                "reward/mean": 0.1 + 0.6 * min(1.0, step / 100) + rng.gauss(0, 0.03), "reward/std": 0.15,
                "mismatch/kl": kl, "mismatch/ratio_max": 3 * creep ** 0.5 * math.exp(rng.gauss(0, 0.2)),
            }
            out.append(Row(step=step, time=None, values=values))
        return out

    assert "mismatch drift" not in _fired(rows(surge=False))
    surged = _fired(rows(surge=True)).get("mismatch drift")
    assert surged and 600 < surged[0] < 630, surged


def test_a_framework_that_logs_its_mismatch_and_no_ratio_tail_gets_mismatch_drift_on_the_mismatch_alone() -> None:
    """slime logs a per-sample mean of |Δ log p| and no largest ratio: its names go through
    slime's map (as `keel import --framework slime` stores them), and mismatch drift watches
    that mismatch alone, with its surge: a creep over hundreds of steps is not paged, the same
    mismatch surging is, and the message says the ratio tail was not logged."""
    from trainer_hooks.integrations.names import MAPS

    slime = MAPS["slime"]

    def rows(surge: bool) -> list[Row]:
        rng = random.Random(10)
        out = []
        for step in range(800):
            creep = math.exp(max(0, step - 150) / 260)
            if surge and step >= 600:
                creep = math.exp(450 / 260) * math.exp((step - 600) / 8)
            logged = {
                "rollout/raw_reward": 0.1 + 0.6 * min(1.0, step / 100) + rng.gauss(0, 0.03),
                "train/train_rollout_logprob_abs_diff": 0.03 * creep * math.exp(rng.gauss(0, 0.2)),
                "train/grad_norm": 0.5 * math.exp(rng.gauss(0, 0.2)),
            }
            out.append(Row(step=step, time=None, values={slime.keel_name(name): value for name, value in logged.items()}))
        return out

    assert set(rows(False)[0].values) == {"reward/mean", "mismatch/log_ratio_abs_seq_mean", "grad/norm"}
    assert "mismatch drift" not in _fired(rows(surge=False))
    results = {result.rule.name: result for result in backtest(DEFAULT_RULES, rows(surge=True))}
    surged = results["mismatch drift"].fired_steps
    assert surged and 600 < surged[0] < 630, surged
    message = results["mismatch drift"].episodes[0].message
    assert "mismatch/log_ratio_abs_seq_mean climbing" in message and "mismatch/ratio_max not logged by this run" in message
    assert not results["ratio tail climbing"].fired_steps


def test_answers_cut_at_the_cap_page_a_run_whose_answers_stop_finishing_and_no_run_that_finishes_most() -> None:
    """A mismatch A/B with slime's names, 8 answers a step (the shape of the one issue 44
    describes): in the mismatch arm, which never learned, the truncated share climbs from about
    0.55 to nearly 1 while the reward slides from 0.46 towards 0; "answers cut at the cap" pages
    it once the share's 10-step mean passes 0.9, before the reward's 20-step mean has halved.
    The exact arm, an arm whose share hovers at 0.7 (its noise over 8 answers included), and one
    whose answers were nearly all cut from its first step and that learns to finish them, are
    never paged: what pages is a run whose answers stopped finishing, 9 in 10 of them."""
    from trainer_hooks.integrations.names import MAPS

    slime = MAPS["slime"]

    def arm(truncated: Callable[[int], float], reward: Callable[[int], float], seed: int) -> list[Row]:
        rng = random.Random(seed)
        out = []
        for step in range(200):
            rewards = [1.0 if rng.random() < reward(step) else 0.0 for _ in range(8)]
            spread = len(set(rewards)) > 1
            logged = {
                "rollout/raw_reward": sum(rewards) / 8,
                "rollout/truncated_ratio": sum(rng.random() < truncated(step) for _ in range(8)) / 8,
                "train/grad_norm": math.exp(rng.gauss(0, 0.3)) * (1.0 if spread else 0.001),
                "train/pg_loss": rng.gauss(0, 0.1) if spread else 0.0,
            }
            out.append(Row(step=step, time=None, values={slime.keel_name(name): value for name, value in logged.items()}))
        return out

    def sliding(step: int) -> float:
        return max(0.03, 0.46 - 0.43 * max(0, step - 30) / 60)

    def to_the_cap(step: int) -> float:
        return min(0.99, 0.55 + 0.13 * min(1.0, step / 40) + 0.31 * min(1.0, max(0, step - 40) / 15))

    for seed in range(5):
        mismatch = arm(to_the_cap, sliding, seed)
        fired = _fired(mismatch)
        assert list(fired) == ["answers cut at the cap"], fired
        paged = fired["answers cut at the cap"][0]
        shares = [row.values["response/truncated_frac"] for row in mismatch]
        rewards = [row.values["reward/mean"] for row in mismatch]
        assert statistics.fmean(shares[paged - 9 : paged + 1]) > 0.9 >= statistics.fmean(shares[paged - 10 : paged]), seed
        halved = next(step for step in range(20, 200) if statistics.fmean(rewards[step - 19 : step + 1]) < 0.23)
        assert paged < halved, (seed, paged, halved)
        assert _fired(arm(lambda step: 0.55 - 0.2 * min(1.0, step / 100), lambda step: 0.46 + 0.1 * min(1.0, step / 100), seed)) == {}
        assert _fired(arm(lambda step: 0.7, lambda step: 0.4, seed)) == {}
        # A thinking model under too short a cap: nearly every answer cut from the start, and
        # the run learns to finish them (its reward rising): it started there, it is not paged.
        assert _fired(arm(lambda step: 0.97 - 0.6 * min(1.0, step / 120), lambda step: 0.1 + 0.5 * min(1.0, step / 120), seed)) == {}


def test_a_mismatch_surge_while_the_run_still_learns_fast_is_no_drift_but_the_same_later_is() -> None:
    """Mismatch drift's baseline is taken when the reward first gained 2.5 spreads, in the
    middle of the run's fastest learning; a stale sampler's KL and ratio tail can surge then
    and settle (the regime corpus's ppo-lag11-bf16-lr0.002-clip0-d4-s11: 6.7x its level 24
    steps after the baseline, paged, and the run went on learning). `settle` (30) holds the
    climb for 30 values after the baseline: that surge, 12-24 steps after it, is no longer
    paged (it was, at its peak); the same surge 160 steps later still is."""

    def rows(at: int) -> list[Row]:
        rng = random.Random(9)
        out = []
        for step in range(400):
            excursion = max(1.0, min(12.0, math.exp(min(step - at, at + 24 - step) / 4))) if at <= step < at + 24 else 1.0
            values = {
                "reward/mean": 0.1 + 0.6 * min(1.0, step / 100) + rng.gauss(0, 0.03), "reward/std": 0.15,
                "mismatch/kl": 0.05 * excursion * math.exp(rng.gauss(0, 0.3)),
                "mismatch/ratio_max": 3 * excursion**0.7 * math.exp(rng.gauss(0, 0.3)),
            }
            out.append(Row(step=step, time=None, values=values))
        return out

    drift = next(rule for rule in DEFAULT_RULES if rule.name == "mismatch drift")
    detector = build_detector(drift.detector, drift.metric, drift.params)
    assert detector.params["settle"] == 30
    state = detector.initial_state()
    baseline = next(row.step for row in rows(80) if detector.update(state, row.step, row.values) and "median" in state["mismatch/ratio_max"])
    assert 60 <= baseline <= 70, baseline  # the excursion at 80 peaks 12 steps after it
    early = _fired(rows(80))
    assert "mismatch drift" not in early and early.get("mismatch climbing"), early  # the warning still says so
    old = build_detector(drift.detector, drift.metric, {**drift.params, "settle": 0})
    state = old.initial_state()
    assert any(getattr(old.update(state, row.step, row.values), "active", False) for row in rows(80))
    later = _fired(rows(240)).get("mismatch drift")
    assert later and 240 < later[0] < 264, later


def test_entropy_falling_is_watched_when_asked_and_says_by_how_much() -> None:
    detector = build_detector("climb", "policy/entropy", {"direction": "down", "min_scale": 0.35, "k": 2.0, "h": 10.0, "after_gain": 0})
    state = detector.initial_state()
    signals = [detector.update(state, step, {"policy/entropy": 1.0 if step < 60 else 0.05}) for step in range(80)]
    active = [step for step, signal in enumerate(signals) if signal is not None and signal.active]
    assert active and active[0] == 61, active
    message = signals[active[0]].message  # type: ignore[union-attr]
    assert message.startswith("policy/entropy falling: 0.05 is 0.05× the level it had once the run learned (1)"), message


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"direction": "sideways"}, "direction"),
        ({"of": "sign"}, "'of'"),
        ({"adapt": 2}, "adapt"),
        ({"surge": -1}, "surge"),
        ({"settle": -5}, "settle"),
        ({"fallback": -1}, "fallback"),
        ({"fallback_drop": 0}, "fallback_drop"),
        ({"surge_fast": 60, "surge_slow": 50}, "surge_fast"),
    ],
)
def test_a_climb_refuses_parameters_that_make_no_sense(params: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        build_detector("climb", "policy/entropy", params)


def test_a_jump_refuses_a_factor_of_one() -> None:
    with pytest.raises(ValueError, match="factor"):
        build_detector("jump", "policy/ppo_kl", {"factor": 1})
