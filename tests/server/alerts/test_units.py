"""Pure pieces of alerting: lifecycle, detectors, the catalog of detectors and default rules."""

from __future__ import annotations

import json
import math
import random
import statistics

import pytest

from server.alerts.catalog import DEFAULT_RULES, build_detector
from server.alerts.detectors import JOINED, AboveStart, Climb, CoClimb, NonFinite, Threshold
from server.alerts.lifecycle import Lifecycle, Phase, Transition


def _run(
    lifecycle: Lifecycle, pattern: str, *, for_steps: int, keep: int
) -> list[tuple[int, Transition]]:
    out = []
    for step, char in enumerate(pattern):
        for transition in lifecycle.step(
            char == "1", step, for_steps=for_steps, keep_firing_for=keep
        ):
            out.append((step, transition))
    return out


def test_lifecycle_pending_firing_resolved_with_for_and_hysteresis() -> None:
    lc = Lifecycle()
    events = _run(lc, "0110111100010001", for_steps=3, keep=3)
    assert events == [
        (1, Transition.PENDING),
        (3, Transition.CANCELLED),  # held 2 < 3 steps: never fired
        (4, Transition.PENDING),
        (6, Transition.FIRING),  # fires on the 3rd consecutive true step
        (10, Transition.RESOLVED),  # after 3 consecutive clear steps (8, 9, 10)
        (11, Transition.PENDING),
        (12, Transition.CANCELLED),
        (15, Transition.PENDING),
    ]
    assert lc.phase is Phase.PENDING and lc.started_step == 15


def test_lifecycle_fires_at_once_with_for_zero_and_round_trips_json() -> None:
    lc = Lifecycle()
    assert lc.step(True, 7, for_steps=0, keep_firing_for=2) == [
        Transition.PENDING,
        Transition.FIRING,
    ]
    assert lc.started_step == 7
    restored = Lifecycle.from_json(lc.to_json())
    assert restored == lc
    assert restored.step(False, 8, for_steps=0, keep_firing_for=2) == []
    assert restored.step(True, 9, for_steps=0, keep_firing_for=2) == []  # clear count resets
    assert restored.step(False, 10, for_steps=0, keep_firing_for=2) == []
    assert restored.step(False, 11, for_steps=0, keep_firing_for=2) == [Transition.RESOLVED]


def test_non_finite_detector_watches_glob_list() -> None:
    det = NonFinite("reward/mean,loss/*")
    state = det.initial_state()
    assert det.update(state, 0, {"other": math.nan}) is None
    assert det.update(state, 1, {"reward/mean": 0.5, "loss/pg": 1.0}).active is False
    signal = det.update(state, 2, {"reward/mean": 0.5, "loss/pg": math.inf})
    assert signal.active and signal.value == math.inf and "loss/pg=inf" in signal.message
    assert det.update(state, 3, {"reward/mean": math.nan}).active


def test_threshold_detector_hysteresis() -> None:
    det = Threshold("mismatch/kl", {"op": ">", "threshold": 1.0, "resolve_at": 0.5})
    state = det.initial_state()
    actives = [
        det.update(state, i, {"mismatch/kl": v}).active
        for i, v in enumerate([0.2, 1.5, 0.8, 0.6, 0.4, 0.9])
    ]
    assert actives == [False, True, True, True, False, False]
    with pytest.raises(ValueError, match="op"):
        Threshold("x", {"op": "=="})
    with pytest.raises(ValueError, match="unknown parameter"):
        Threshold("x", {"treshold": 1})


def test_threshold_over_a_window_judges_the_mean_of_the_last_values() -> None:
    """With `window`, the mean of the metric's last `window` values is what crosses the
    threshold (a share over 8 answers a step: 7/8 on one step and 8/8 on the next), and nothing
    fires before there are that many; NaN is skipped, not counted."""
    det = Threshold("response/truncated_frac", {"op": ">", "threshold": 0.9, "resolve_at": 0.7, "window": 4})
    state = det.initial_state()
    signals = [det.update(state, i, {"response/truncated_frac": v}) for i, v in enumerate([1.0, 1.0, 1.0, 0.875, math.nan, 0.875, 0.5, 0.5, 0.5])]
    assert [None if s is None else s.active for s in signals] == [False, False, False, True, None, True, True, False, False]
    assert signals[3].value == pytest.approx(0.96875) and signals[3].message.startswith(
        "the mean of response/truncated_frac's last 4 values = 0.9688 > 0.9"
    )
    assert signals[0].message == "1 of the 4 values its mean is taken over"
    for bad in (0, 1.5, True, 10_001):
        with pytest.raises(ValueError, match="window"):
            Threshold("x", {"window": bad})


def test_threshold_with_a_rise_fires_for_a_run_that_went_there_not_one_that_started_there() -> None:
    """`rise`: the (windowed) value must have come at least that far from the lowest it had: a
    share that climbed from 0.5 to 0.95 fires (its message says from where); one that was 0.95
    from the start does not, nor when it climbs from there to 0.99."""
    params = {"op": ">", "threshold": 0.9, "resolve_at": 0.7, "window": 2, "rise": 0.2}
    climbed = Threshold("s", params)
    state = climbed.initial_state()
    signals = [climbed.update(state, i, {"s": v}) for i, v in enumerate([0.5, 0.5, 0.7, 0.95, 0.95, 0.95, 0.8, 0.5])]
    assert [s.active for s in signals] == [False, False, False, False, True, True, True, False]
    assert signals[4].message == "the mean of s's last 2 values = 0.95 > 0.9, up from 0.5"
    started = Threshold("s", params)
    state = started.initial_state()
    assert not any(started.update(state, i, {"s": v}).active for i, v in enumerate([0.95] * 5 + [0.99] * 10))
    with pytest.raises(ValueError, match="rise"):
        Threshold("s", {"rise": 0})
    # A non-finite value is left out: no mean of inf and -inf, no rise through inf, and the
    # state stays JSON a database keeps (finite numbers only).
    for values in ([0.95] * 5 + [math.inf, -math.inf] + [0.95] * 5, [0.5] * 5 + [math.inf] + [0.5] * 5):
        detector = Threshold("s", params)
        state = detector.initial_state()
        signals = [detector.update(state, i, {"s": v}) for i, v in enumerate(values)]
        assert [s for s, v in zip(signals, values, strict=True) if not math.isfinite(v)] == [None] * sum(not math.isfinite(v) for v in values)
        assert not any(s is not None and s.active for s in signals)
        assert json.loads(json.dumps(state, allow_nan=False)) == state


def test_threshold_with_a_reward_fall_fires_only_while_the_reward_has_fallen_from_its_best() -> None:
    """`reward_fall`: the metric over its threshold is active only while the mean of the
    reward's last 10 values is at least that share of its best such mean below it; the
    message says from where. A run whose reward holds is never active; one that logs no reward
    is judged on the metric alone; the parameter must be in (0, 1]."""
    params = {"op": ">", "threshold": 0.9, "reward_fall": 0.3}
    det = Threshold("s", params)
    state = det.initial_state()
    rewards = [0.8] * 20 + [0.6] * 5 + [0.4] * 10
    signals = [det.update(state, i, {"s": 1.0, "reward/mean": r}) for i, r in enumerate(rewards)]
    first = next(i for i, s in enumerate(signals) if s.active)
    assert first == 28 and statistics.fmean(rewards[first - 9 : first + 1]) <= 0.56 < statistics.fmean(rewards[first - 10 : first])
    assert signals[first].message == "s = 1 > 0.9; the reward's last 10 average 0.54, down from 0.8"
    held = Threshold("s", params)
    state = held.initial_state()
    assert not any(held.update(state, i, {"s": 1.0, "reward/mean": 0.8 + 0.05 * (i % 2)}).active for i in range(40))
    rewardless = Threshold("s", params)
    state = rewardless.initial_state()
    assert [rewardless.update(state, i, {"s": v}).active for i, v in enumerate([0.5, 1.0])] == [False, True]
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="reward_fall"):
            Threshold("s", {"reward_fall": bad})

def test_above_start_compares_a_recent_median_with_the_median_of_the_first_values() -> None:
    """The level is the median of the first `start` values (floored), then frozen; the rule is
    active while the median of the last `window` values is at least `factor` times it. A burst
    shorter than half the window moves no median; values under the floor count as the floor;
    a non-finite value is left out; the state stays JSON a database keeps."""
    params = {"start": 4, "window": 5, "factor": 3.0, "floor": 0.2}
    det = AboveStart("policy/entropy", params)
    state = det.initial_state()
    values = [0.3, 0.1, 0.3, 0.3, 0.3, 9.0, 9.0, 0.3, 0.3, 0.3, math.nan, math.inf, 0.9, 0.9, 0.9, 0.3, 0.3, 0.3]
    signals = [det.update(state, i, {"policy/entropy": v}) for i, v in enumerate(values)]
    assert [s.active if s else None for s in signals] == [False] * 10 + [None, None] + [False, False, True, True, True, False]
    assert state["level"] == 0.3  # median of 0.3, 0.2 (0.1 floored), 0.3, 0.3
    assert signals[14].value == 0.9
    assert signals[14].message == "the median of policy/entropy's last 5 values = 0.9, 3.0× its start 0.3 (the median of its first 4)"
    assert signals[0].message == "1 of the first 4 values its start is taken from"
    assert signals[3].message == "4 of the 5 values its median is taken over"
    assert json.loads(json.dumps(state, allow_nan=False)) == state
    # The level does not move once taken: a run that drifts up slowly is measured against its start.
    slow = AboveStart("e", {"start": 3, "window": 3, "factor": 2.0})
    state = slow.initial_state()
    fired = [slow.update(state, i, {"e": 10.0 + i}).active for i in range(20)]
    assert fired.index(True) == 13  # the median of 21, 22, 23 is 2x the median of 10, 11, 12
    assert all(fired[13:])
    # A start at 0 (no floor) is nothing to be a multiple of; parameters that make no sense are refused.
    zero = AboveStart("e", {"start": 2, "window": 2})
    state = zero.initial_state()
    assert [zero.update(state, i, {"e": v}).active for i, v in enumerate([0.0, 0.0, 5.0, 5.0])] == [False] * 4
    assert "not above 0" in zero.update(state, 4, {"e": 5.0}).message
    for bad, match in (({"start": 0}, "start"), ({"window": 2.5}, "window"), ({"factor": 1}, "factor"), ({"floor": -1}, "floor"), ({"level": 1}, "unknown")):
        with pytest.raises(ValueError, match=match):
            AboveStart("e", bad)
    # A detector that joined the run mid-way (the engine's JOINED) takes no start: silent there.
    joined = AboveStart("e", {"start": 2, "window": 2})
    state = {JOINED: True}
    assert not any(joined.update(state, i, {"e": v}).active for i, v in enumerate([0.1, 0.1, 5.0, 5.0, 5.0]))
    assert state == {JOINED: True, "key": "e"}
    # `|` alternatives, the first the run logs; values far beyond any scale stay finite (JSON).
    either = AboveStart("a|b", {"start": 2, "window": 2})
    state = either.initial_state()
    signals = [either.update(state, i, {"b": v}) for i, v in enumerate([1.7e308, 1.7e308, 1.7e308])]
    assert state["key"] == "b" and not signals[-1].active and json.loads(json.dumps(state, allow_nan=False)) == state


def test_a_threshold_over_huge_values_and_a_reward_stuck_at_zero_stay_sane() -> None:
    """A mean over values near the float maximum does not overflow (it would stop the run's
    evaluation); a reward at 0 from the start has not fallen."""
    det = Threshold("s", {"op": ">", "threshold": 0.9, "window": 10, "reward_fall": 0.3})
    state = det.initial_state()
    signals = [det.update(state, i, {"s": 1.7e308, "reward/mean": 1.7e308}) for i in range(12)]
    assert signals[-1].value == pytest.approx(1e15) and json.loads(json.dumps(state, allow_nan=False)) == state
    stuck = Threshold("s", {"op": ">", "threshold": 0.9, "reward_fall": 0.3})
    state = stuck.initial_state()
    assert not any(stuck.update(state, i, {"s": 1.0, "reward/mean": 0.0}).active for i in range(30))



def test_climb_detector_stays_quiet_on_noise_and_fires_on_a_climb() -> None:
    rng = random.Random(0)
    det = Climb("mismatch/kl", {"warmup": 50})
    state = det.initial_state()
    # 1000 steps of stationary log-normal noise: no alarm.
    noise = [math.exp(math.log(1e-3) + rng.gauss(0, 0.3)) for _ in range(1000)]
    assert not any(det.update(state, i, {"mismatch/kl": v}).active for i, v in enumerate(noise))
    # A steady climb of the log-KL is caught within a few dozen steps, in baseline units.
    fired = None
    for i in range(300):
        value = 1e-3 * math.exp(0.05 * i + rng.gauss(0, 0.3))
        if det.update(state, 1000 + i, {"mismatch/kl": value}).active:
            fired = i
            break
    assert fired is not None and fired < 80, fired


def test_climb_detector_is_scale_free() -> None:
    """The same relative climb fires at the same step whatever the metric's units."""
    firsts = []
    for scale in (1e-6, 1.0, 1e6):
        det = Climb("m", {"warmup": 20})
        state = det.initial_state()
        rng = random.Random(1)
        series = [scale * math.exp(rng.gauss(0, 0.2)) for _ in range(40)] + [
            scale * math.exp(0.1 * i) for i in range(100)
        ]
        firsts.append(
            next(i for i, v in enumerate(series) if det.update(state, i, {"m": v}).active)
        )
    assert len(set(firsts)) == 1


def _learning_run(n: int, kl_after: float, seed: int = 0) -> list[dict[str, float]]:
    """Reward 0.1 -> 0.9 over 400 steps (spread 0.1: 2.5 spreads gained near step 130); the KL
    rises 10x over the first 100 (1e-3 -> 1e-2, a sharper policy under the same stale
    sampler), holds, and is `kl_after` times that from step 200 on."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        level = 1e-3 * 10 ** min(1.0, i / 100) * (kl_after if i >= 200 else 1.0)
        rows.append({"reward/mean": min(0.9, 0.1 + 0.002 * i), "reward/std": 0.1, "mismatch/kl": level * math.exp(rng.gauss(0, 0.2))})
    return rows


def _fired(det: Climb | CoClimb, rows: list[dict[str, float]]) -> list[int]:
    state = det.initial_state()
    return [i for i, row in enumerate(rows) if (signal := det.update(state, i, row)) is not None and signal.active]


def test_climb_baseline_is_the_level_once_the_run_learned() -> None:
    """The KL's rise while the policy learns is no climb; a rise after it is. Against the first
    50 steps' baseline (after_gain 0), the learning itself pages."""
    flat, climbs = _learning_run(400, kl_after=1.0), _learning_run(400, kl_after=4.0)
    learned = Climb("mismatch/kl")
    assert learned.params["after_gain"] == 2.5
    assert _fired(learned, flat) == []
    fired = _fired(learned, climbs)
    assert fired and 200 <= fired[0] < 220, fired[:3]
    assert _fired(Climb("mismatch/kl", {"after_gain": 0}), flat)  # the old baseline: the learning is a "climb"
    # A run that logs no reward: the first warm-up values, as with after_gain 0.
    no_reward = [{"mismatch/kl": row["mismatch/kl"]} for row in flat]
    assert _fired(Climb("mismatch/kl"), no_reward) == _fired(Climb("mismatch/kl", {"after_gain": 0}), no_reward) != []


def test_co_climb_fires_only_while_every_metric_climbs() -> None:
    rows = _learning_run(400, kl_after=4.0, seed=1)
    rng = random.Random(2)
    flat_tail = [{**row, "mismatch/ratio_max": 20 * math.exp(rng.gauss(0, 0.2))} for row in rows]
    climbing_tail = [{**row, "mismatch/ratio_max": row["mismatch/kl"] * 2000} for row in rows]
    det = CoClimb("mismatch/kl,mismatch/ratio_max", {"surge": 0})  # the conjunction alone (the surge: test_signatures.py)
    assert _fired(det, flat_tail) == []
    both = _fired(det, climbing_tail)
    assert both and both[0] >= _fired(Climb("mismatch/kl"), rows)[0]
    state = det.initial_state()
    for i, row in enumerate(climbing_tail[: both[0] + 1]):
        signal = det.update(state, i, row)
    assert signal.active and signal.metric == "mismatch/kl,mismatch/ratio_max"
    assert "mismatch/kl climbing" in signal.message and "mismatch/ratio_max climbing" in signal.message
    for metric in ("mismatch/kl", "mismatch/kl,mismatch/kl"):
        with pytest.raises(ValueError, match="two or more"):
            CoClimb(metric)


def test_co_climb_leaves_out_a_member_the_run_never_logged() -> None:
    """A framework that logs its mismatch and no largest ratio gets the mismatch's climb alone
    (the first member's, at its steps, and says so); a run that logs neither gets nothing; a
    member logged from some step on counts from then, and holds the co-climb back while it has
    not climbed."""
    rows = _learning_run(400, kl_after=4.0, seed=1)
    det = CoClimb("mismatch/kl,mismatch/ratio_max", {"surge": 0})
    alone = _fired(det, rows)
    assert alone and alone == _fired(Climb("mismatch/kl", {"surge": 0, "settle": 30}), rows)
    state = det.initial_state()
    for i, row in enumerate(rows[: alone[0] + 1]):
        signal = det.update(state, i, row)
    assert signal.active and signal.metric == "mismatch/kl"
    assert "mismatch/kl climbing" in signal.message and "mismatch/ratio_max not logged by this run" in signal.message
    assert _fired(det, [{"reward/mean": row["reward/mean"], "reward/std": 0.1} for row in rows]) == []
    # Only the second member logged: the first is the one watched, nothing fires (each step is
    # evaluated, and inactive: an alert it had fired would resolve).
    ratio_only = [{**row, "mismatch/kl": math.nan, "mismatch/ratio_max": 5.0 * (4 if i >= 200 else 1)} for i, row in enumerate(rows)]
    assert _fired(det, ratio_only) == []
    state = det.initial_state()
    signal = det.update(state, 0, ratio_only[0])
    assert signal is not None and not signal.active and signal.message == "no mismatch/kl this step"
    # The ratio logged from step 150 on, flat: it joins and holds the co-climb back.
    late_flat = [{**row, **({"mismatch/ratio_max": 20.0} if i >= 150 else {})} for i, row in enumerate(rows)]
    assert _fired(det, late_flat) == []


def test_default_rules_build_and_unknown_detector_is_refused() -> None:
    for spec in DEFAULT_RULES:
        build_detector(spec.detector, spec.metric, spec.params)
    with pytest.raises(ValueError, match="unknown detector"):
        build_detector("magic", "x")
