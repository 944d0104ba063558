"""The learned level of a run's entropy and its start: the alert detectors' baselines, from the
points as logged, and read from a real server in pieces."""

from __future__ import annotations

import asyncio
import math
import statistics

import httpx
import pytest

from dashboard.data import KeelApi
from dashboard.learned_level import START_VALUES, learned_level, start_level
from dashboard.views import charts as chart_views
from tests.support.toy_runs import LiveRun

LEARNED_AT = 100
"""reward/mean steps from 0 to 1 here; its spread is 0.1, so its EWMA (0.3) is 0.3 = 3 initial
spreads above its start at once: the run has learned at step 100."""


def learning_rows(steps: int = 200) -> list[dict]:
    """Entropy 3.0 over the first 50 steps, 1.5 until the reward rises at LEARNED_AT, then
    0.2 (a collapse): the learned level is 1.5, not the first steps' 3.0."""
    rows = []
    for step in range(steps):
        entropy = 3.0 if step < 50 else 1.5 if step <= LEARNED_AT else 0.2
        reward = 0.0 if step < LEARNED_AT else 1.0
        rows.append({"step": step, "values": {"policy/entropy": entropy, "reward/mean": reward, "reward/std": 0.1}})
    return rows


def _pairs(rows: list[dict]) -> list[tuple[int, dict]]:
    return [(row["step"], row["values"]) for row in rows]


def test_the_level_is_the_median_of_the_last_50_values_before_the_reward_rose() -> None:
    assert learned_level({}, _pairs(learning_rows())) == pytest.approx(1.5, rel=1e-12)
    # Before the reward rose there is none yet; fed the rest, the same state settles it.
    state: dict = {}
    rows = _pairs(learning_rows())
    assert learned_level(state, rows[:LEARNED_AT]) is None
    assert learned_level(state, rows[LEARNED_AT:]) == pytest.approx(1.5, rel=1e-12)
    # The window is the last 50 values before the reward rose, in any order: 24 below 1.7, two
    # at 1.7, 24 above, so the step the level is settled at (3.5 here) leaves it at 1.7, and a
    # window one step later (without the smallest, with 3.5) would give √(1.7 × 2.0).
    below, above = [1.0 + i * 0.02 for i in range(24)], [2.0 + i * 0.03 for i in range(24)]
    window = [*below, 1.7, 1.7, *above]
    varied = []
    for step, values in rows:
        entropy = window[(step - 50) * 7 % 50] if 50 <= step < LEARNED_AT else 3.5 if step == LEARNED_AT else values["policy/entropy"]
        varied.append((step, {**values, "policy/entropy": entropy}))
    assert learned_level({}, varied) == pytest.approx(1.7, rel=1e-12)


def test_a_run_without_reward_takes_its_first_50_values() -> None:
    rows = [(step, {"policy/entropy": 0.5 + step / 100}) for step in range(80)]
    expected = math.exp(statistics.median(math.log(0.5 + step / 100) for step in range(50)))
    assert learned_level({}, rows) == pytest.approx(expected, rel=1e-12)
    assert learned_level({}, rows[:49]) is None  # 49 values: not yet


def test_a_run_whose_reward_never_rises_has_no_level() -> None:
    rows = [(step, {"policy/entropy": 1.0, "reward/mean": 0.5, "reward/std": 0.2}) for step in range(300)]
    assert learned_level({}, rows) is None


def test_the_level_is_read_from_every_point_in_pieces(server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Read in short pieces (7 steps, then 14, …) the level is the one of all the points at
    once; a run that logs no entropy has none, and one whose reward has not risen has none."""
    monkeypatch.setattr(chart_views, "LEVEL_READ", 7)
    learning = LiveRun(server, "learning", "g")
    learning.send(learning_rows())
    flat = LiveRun(server, "flat", "g")
    flat.send([{"step": s, "values": {"policy/entropy": 1.0, "reward/mean": 0.5, "reward/std": 0.2}} for s in range(120)])
    plain = LiveRun(server, "plain", "g")
    plain.send([{"step": s, "values": {"reward/mean": 0.5}} for s in range(60)])

    async def read() -> dict:
        return await chart_views.learned_levels(KeelApi(httpx.AsyncClient(base_url=server.url)), [learning.id, flat.id, plain.id])

    levels = asyncio.run(read())
    assert levels[learning.id] == pytest.approx(1.5, rel=1e-12)
    assert levels[flat.id] is None and levels[plain.id] is None
    for run in (learning, flat, plain):
        run.close()


def test_the_steps_read_stay_read_and_a_set_level_is_not_read_again(server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A run read before is read from the first step some key has not passed; once its level
    is set, not at all. The level is the one of every point read at once."""
    reads: list[tuple[str, int | None]] = []
    series_of_runs = KeelApi.series_of_runs

    async def counted(self, run_ids, key, **options):  # type: ignore[no-untyped-def]
        reads.append((key, options.get("start")))
        return await series_of_runs(self, run_ids, key, **options)

    monkeypatch.setattr(KeelApi, "series_of_runs", counted)
    rows = learning_rows()
    run = LiveRun(server, "growing", "g")
    # Steps 0-79 of every key, and the entropy of steps 80-89 alone: 80-89 are not complete.
    run.send(rows[:80] + [{"step": r["step"], "values": {"policy/entropy": r["values"]["policy/entropy"]}} for r in rows[80:90]])

    def level() -> float | None:
        return asyncio.run(chart_views.learned_levels(KeelApi(httpx.AsyncClient(base_url=server.url)), [run.id]))[run.id]

    assert level() is None  # the reward has not risen yet
    assert {start for _, start in reads} == {0}
    reads.clear()
    assert level() is None and {start for _, start in reads} == {80}  # steps 0-79 are not read again
    reads.clear()
    run.send([{"step": r["step"], "values": {k: v for k, v in r["values"].items() if k != "policy/entropy"}} for r in rows[80:90]])
    run.send(rows[90:])
    assert level() == pytest.approx(learned_level({}, _pairs(rows)), rel=1e-12) == pytest.approx(1.5, rel=1e-12)
    assert {start for _, start in reads} == {80}
    reads.clear()
    assert level() == pytest.approx(1.5, rel=1e-12) and reads == []  # set: never read again
    run.close()


def test_the_start_is_the_median_of_the_first_ten_values_floored_as_the_rule_floors_them() -> None:
    """The level "entropy far above its start" measures from: its own detector's (the rule's
    `start` values, values under its floor of 0.2 counted as 0.2, non-finite ones left out)."""
    assert START_VALUES == 10
    assert start_level([0.3, 0.1, 0.5, 0.3, 0.4, 0.05, 0.3, 0.2, 0.35, 0.3, 9.0]) == pytest.approx(0.3)
    assert start_level([0.05] * 10) == pytest.approx(0.2)  # a sharp model's start is the floor
    assert start_level([math.nan, math.inf, *[0.5] * 10]) == pytest.approx(0.5)
    assert start_level([0.5] * 9) is None


def test_the_start_is_read_from_the_first_points_and_once_known_never_again(server, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Read in pieces of 7 steps (a run that logs every third step needs several), the start is
    the one of its first ten points; a run with fewer has none and is read again, one that logs
    no entropy has none; once known a start is not read again."""
    monkeypatch.setattr(chart_views, "LEVEL_READ", 7)
    reads: list[str] = []
    series_of_runs = KeelApi.series_of_runs

    async def counted(self, run_ids, key, **options):  # type: ignore[no-untyped-def]
        reads.append(key)
        return await series_of_runs(self, run_ids, key, **options)

    monkeypatch.setattr(KeelApi, "series_of_runs", counted)
    sparse = LiveRun(server, "sparse", "g")
    sparse.send([{"step": 3 * i, "values": {"policy/entropy": 0.1 * (i + 1)}} for i in range(30)])
    young = LiveRun(server, "young", "g")
    young.send([{"step": i, "values": {"policy/entropy": 0.5}} for i in range(4)])
    plain = LiveRun(server, "plain", "g")
    plain.send([{"step": s, "values": {"reward/mean": 0.5}} for s in range(20)])

    def starts() -> dict:
        return asyncio.run(chart_views.start_levels(KeelApi(httpx.AsyncClient(base_url=server.url)), [sparse.id, young.id, plain.id]))

    assert starts() == {sparse.id: pytest.approx(statistics.median(0.1 * (i + 1) for i in range(10))), young.id: None, plain.id: None}
    assert reads.count("policy/entropy") >= 3  # steps 0-6, 7-20, 21-48 for the sparse run
    reads.clear()
    found = starts()
    assert found[sparse.id] == pytest.approx(0.55) and reads == ["policy/entropy"]  # the young run alone
    young.send([{"step": i, "values": {"policy/entropy": 0.8}} for i in range(4, 12)])
    assert starts()[young.id] == pytest.approx(0.8)  # its first ten: four 0.5s and six 0.8s
    for run in (sparse, young, plain):
        run.close()
