"""wire.labels: a collapse is a fall that lasts; a fall that regains is a dip."""

from __future__ import annotations

from wire.labels import Falls, falls, smoothed


def test_a_fall_that_does_not_regain_within_100_steps_is_a_collapse() -> None:
    rewards = [0.2] * 50 + [0.7] * 100 + [0.45] * 150
    assert falls(rewards) == Falls(150, [], None)


def test_a_fall_that_regains_within_0_1_of_its_peak_is_a_dip() -> None:
    rewards = [0.7] * 100 + [0.45] * 99 + [0.61] * 200  # back within 0.1 at step 199
    assert falls(rewards) == Falls(None, [100], None)
    not_enough = [0.7] * 100 + [0.45] * 99 + [0.59] * 200  # 0.59 < 0.7 - 0.1
    assert falls(not_enough) == Falls(100, [], None)
    too_late = [0.7] * 100 + [0.45] * 101 + [0.7] * 200  # regains at step 201: 101 steps after
    assert falls(too_late) == Falls(100, [], None)


def test_after_a_dip_the_next_fall_is_judged_against_the_same_peak() -> None:
    rewards = [0.8] * 50 + [0.55] * 10 + [0.75] * 100 + [0.58] * 200
    # The second fall: 0.58 <= 0.8 - 0.2, and the run never regains 0.7.
    assert falls(rewards) == Falls(160, [50], None)


def test_a_fall_too_near_the_end_to_judge_is_unjudged() -> None:
    rewards = [0.7] * 300 + [0.4] * 50
    assert falls(rewards) == Falls(None, [], 300)
    assert falls([0.1, 0.45] + [0.2] * 200) == Falls(None, [], None)  # never reached 0.5


def test_smoothed_is_the_trailing_mean() -> None:
    assert smoothed([1.0, 3.0, 5.0, 7.0], window=2) == [1.0, 2.0, 4.0, 6.0]
