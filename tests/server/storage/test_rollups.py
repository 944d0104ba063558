"""Rollup-served series reads are exact: the same buckets a scan of every point gives.

Each test writes through `Store.write_points` (the ingest path) and checks against a
brute-force computation in Python from what must be stored: the FIRST value sent for each
(series, step).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import select, text

from server import db
from server.models import PointRollup, Series
from server.storage import ROLLUP_BITS, ROLLUP_LEVELS, SeriesData, Store
from server.storage.rollups import bucket_width
from wire import Row, RunInfo

SPECIALS = [math.nan, math.inf, -math.inf]


def expected_series(stored: dict[int, float], *, max_points: int, start: int | None, end: int | None) -> SeriesData:
    """What `Store.series` must answer, computed from every point (the old full scan's semantics)."""
    steps = sorted(s for s in stored if (start is None or s >= start) and (end is None or s <= end))
    if len(steps) <= max_points:
        return SeriesData(key="x", downsampled=False, steps=steps, values=[stored[s] for s in steps])
    lo, hi = steps[0], steps[-1]
    width = bucket_width(hi - lo + 1, max_points)  # the width rule; the buckets' contents are checked here
    buckets: dict[int, list[int]] = {}
    for step in steps:
        buckets.setdefault((step - lo) // width, []).append(step)
    out = SeriesData(key="x", downsampled=True, steps=[], values=[], mins=[], maxs=[])
    for bucket in sorted(buckets):
        values = [stored[s] for s in buckets[bucket]]
        finite = [v for v in values if not math.isnan(v)]
        out.steps.append(buckets[bucket][-1])
        out.values.append(stored[buckets[bucket][-1]])
        assert out.mins is not None and out.maxs is not None
        out.mins.append(min(finite) if finite else math.nan)
        # NaN orders above +inf: a bucket holding a NaN has max NaN.
        out.maxs.append(math.nan if len(finite) < len(values) else max(finite))
    return out


def _comparable(data: SeriesData) -> tuple[Any, ...]:
    def norm(values: list[float] | None) -> list[Any] | None:
        return None if values is None else [("nan" if math.isnan(v) else v) for v in values]

    return (data.downsampled, data.steps, norm(data.values), norm(data.mins), norm(data.maxs))


def expected_rollups(stored: dict[int, float]) -> set[tuple[Any, ...]]:
    """(level, block, min, max, nans, count, last step) of every block holding a point."""
    rows = set()
    for level in range(1, ROLLUP_LEVELS + 1):
        blocks: dict[int, list[int]] = {}
        for step in stored:
            blocks.setdefault(step >> (ROLLUP_BITS * level), []).append(step)
        for block, steps in blocks.items():
            finite = [stored[s] for s in steps if not math.isnan(stored[s])]
            rows.add((
                level, block, min(finite) if finite else None, max(finite) if finite else None,
                len(steps) - len(finite), len(steps), max(steps),
            ))
    return rows


async def stored_rollups(store: Store, run_id: str, key: str = "x") -> set[tuple[Any, ...]]:
    async with store.sessions() as session:
        result = await session.execute(
            select(
                PointRollup.level, PointRollup.block, PointRollup.min_value, PointRollup.max_value,
                PointRollup.nan_count, PointRollup.point_count, PointRollup.last_step,
            )
            .join(Series, Series.id == PointRollup.series_id)
            .where(Series.run_id == run_id, Series.key == key)
        )
        return {tuple(row) for row in result}


def run_store(database_url: str, body: Callable[[Store], Awaitable[None]]) -> None:
    db.upgrade(database_url)

    async def go() -> None:
        store = Store(db.create_engine(database_url))
        try:
            await body(store)
        finally:
            await store.close()

    asyncio.run(go())


def random_value(rng: random.Random) -> float:
    return rng.choice(SPECIALS) if rng.random() < 0.02 else rng.gauss(0.0, 1.0)


def frames_of(rng: random.Random, steps: list[int], rows_per_frame: int) -> list[list[Row]]:
    """The steps in frames, each frame shuffled a little and holding a few repeated steps."""
    frames = []
    for first in range(0, len(steps), rows_per_frame):
        chunk = steps[first:first + rows_per_frame]
        rows = [Row(step=s, time=1.0, values={"x": random_value(rng)}) for s in chunk]
        rows += [Row(step=s, time=1.0, values={"x": random_value(rng)}) for s in rng.sample(chunk, min(3, len(chunk)))]
        rng.shuffle(rows)
        frames.append(rows)
    return frames


def remember_first(stored: dict[int, float], rows: list[Row]) -> None:
    for row in rows:
        for value in row.values.values():
            stored.setdefault(row.step, value)


SHAPES = {
    # dense: every step, so edges cut blocks of every level below the bucket width
    "dense": lambda rng: list(range(rng.randrange(1000), 20_000)),
    # gaps of 1..300 steps: blocks partly filled, buckets partly empty
    "gappy": lambda rng: sorted(set(rng.sample(range(3_000_000), 4000)) | set(range(50_000, 52_000))),
    # a few points anywhere up to 2**62: every level's blocks hold one point or two
    "sparse": lambda rng: sorted({rng.randrange(2**62) for _ in range(600)} | {0, 2**62 - 1}),
}


def test_rollup_reads_equal_a_brute_force_scan(database_url: str) -> None:
    """Random series (NaN, +-Inf), sparse and dense, random zooms and bucket counts, frames that
    resend stored steps with other values: every read equals the brute-force buckets, and
    every rollup block equals its points' summary."""

    async def body(store: Store) -> None:
        rng = random.Random(20260)
        for shape, make_steps in SHAPES.items():
            run_id = f"run-{shape}"
            await store.open_run(RunInfo(id=run_id, name=shape), time.time())
            steps = make_steps(rng)
            stored: dict[int, float] = {}
            frames = frames_of(rng, steps, rows_per_frame=rng.choice([250, 999]))
            rng.shuffle(frames)  # out of order, as two writers' frames may land
            for frame in frames:
                await store.write_points(run_id, frame, time.time())
                remember_first(stored, frame)
            # Resends: stored steps again with new values (all kept out), mixed with new steps.
            resend = [Row(step=s, time=1.0, values={"x": 1e300}) for s in rng.sample(steps, 200)]
            fresh = [Row(step=steps[-1] + 1 + i, time=1.0, values={"x": random_value(rng)}) for i in range(5)]
            await store.write_points(run_id, resend + fresh, time.time())
            remember_first(stored, resend + fresh)
            assert await stored_rollups(store, run_id) == expected_rollups(stored), shape

            lo, hi = min(stored), max(stored)
            reads: list[tuple[int | None, int | None, int]] = [(None, None, 1000), (None, None, 1), (None, None, 7)]
            for _ in range(25):
                a, b = sorted(rng.randint(lo, hi) for _ in range(2))
                reads.append((rng.choice([a, None]), rng.choice([b, None]), rng.choice([1, 2, 10, 100, 333, 1000])))
            for start, end, max_points in reads:
                got = await store.series(run_id, "x", max_points=max_points, start=start, end=end)
                want = expected_series(stored, max_points=max_points, start=start, end=end)
                assert _comparable(got) == _comparable(want), (shape, start, end, max_points)
            assert [(k.key, k.count, k.last_step) for k in await store.keys(run_id)] == [("x", len(stored), hi)]

    run_store(database_url, body)


def test_a_frame_of_stored_points_changes_no_rollup(database_url: str) -> None:
    """Points keep their first value; a frame that inserts nothing leaves every summary as it was
    (no count doubles, no min/max/last moves to the values resent)."""

    async def body(store: Store) -> None:
        await store.open_run(RunInfo(id="r", name="r"), time.time())
        first = [Row(step=s, time=1.0, values={"x": float(s % 17), "y": math.nan}) for s in range(5000)]
        await store.write_points("r", first, time.time())
        before = (await stored_rollups(store, "r", "x"), await stored_rollups(store, "r", "y"))
        read_before = await store.series("r", "x", max_points=100)
        again = [Row(step=s, time=2.0, values={"x": -math.inf if s % 2 else math.inf, "y": 0.0}) for s in range(5000)]
        await store.write_points("r", again, time.time())
        assert (await stored_rollups(store, "r", "x"), await stored_rollups(store, "r", "y")) == before
        assert _comparable(await store.series("r", "x", max_points=100)) == _comparable(read_before)
        assert sorted((k.key, k.count) for k in await store.keys("r")) == [("x", 5000), ("y", 5000)]
        nan_only = await store.series("r", "y", max_points=10)
        assert nan_only.downsampled and nan_only.mins is not None and nan_only.maxs is not None
        assert len(nan_only.mins) == 10 and all(math.isnan(v) for v in nan_only.mins + nan_only.maxs)

    run_store(database_url, body)


def test_migration_0005_summarises_existing_points(empty_database_url: str) -> None:
    """Points stored before rollups existed are summarised by the migration."""
    database_url = empty_database_url  # from nothing: the conftest's database_url is at head
    db.upgrade(database_url, "0004")
    rng = random.Random(5)
    stored = {s: random_value(rng) for s in sorted(rng.sample(range(200_000), 3000))}

    async def seed() -> None:
        engine = db.create_engine(database_url)
        try:
            async with engine.begin() as conn:
                await conn.execute(text(
                    "INSERT INTO runs (id, name, project, config, tags, status, acked_seq, started_at, last_seen_at)"
                    " VALUES ('old', 'old', 'default', '{}', '[]', 'finished', -1, 0, 0)"
                ))
                await conn.execute(text("INSERT INTO series (run_id, key) VALUES ('old', 'x')"))
                sid = await conn.scalar(text("SELECT id FROM series"))
                await conn.execute(
                    text("INSERT INTO points (series_id, step, value, wall_time) VALUES (:s, :t, :v, 0)"),
                    [{"s": sid, "t": s, "v": None if math.isnan(v) else v} for s, v in stored.items()],
                )
        finally:
            await engine.dispose()

    asyncio.run(seed())

    async def body(store: Store) -> None:
        assert await stored_rollups(store, "old") == expected_rollups(stored)
        got = await store.series("old", "x", max_points=50, start=1000, end=150_000)
        assert _comparable(got) == _comparable(expected_series(stored, max_points=50, start=1000, end=150_000))

    run_store(database_url, body)
