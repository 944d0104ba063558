"""The rollup SQL of server/storage/rollups.py, per level and per database: what each statement
reads and writes, and what it answers on a small hand-made series, run on real SQLite and real
PostgreSQL (the statements alone, not through the Store)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any, get_args

import pytest
from sqlalchemy import insert, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from server import db
from server.models import PointRollup, Run, Series
from server.storage.rollups import (
    ROLLUP_BITS,
    ROLLUP_LEVELS,
    Dialect,
    buckets_sql,
    count_sql,
    cover_sql,
    postgres_merge_sql,
    read_level,
    sqlite_refresh_sql,
)

DIALECTS: tuple[Dialect, ...] = get_args(Dialect)
LEVELS = range(ROLLUP_LEVELS + 1)

# -- the statements, read ---------------------------------------------------------------------


def test_the_scheme_is_five_levels_of_sixteen_children() -> None:
    """Frozen in migration 0005's backfill: changing either needs a migration."""
    assert (ROLLUP_BITS, ROLLUP_LEVELS) == (4, 5)


@pytest.mark.parametrize("width, level", [(1, 0), (15, 0), (16, 1), (255, 1), (256, 2), (4095, 2),
                                          (4096, 3), (65536, 4), (16**5 - 1, 4), (16**5, 5), (16**7, 5)])
def test_a_read_uses_the_coarsest_level_whose_blocks_fit_in_a_bucket(width: int, level: int) -> None:
    assert read_level(width) == level


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("level", LEVELS)
def test_a_cover_reads_its_level_and_the_finer_ones_in_blocks_of_16_to_the_level(level: int, dialect: Dialect) -> None:
    sql = cover_sql(level, dialect)
    for finer in range(1, level + 1):
        assert f"c.level = {finer} AND c.block BETWEEN" in sql
        # a level-L block's last step is its first + 16**L - 1, its first step block << 4L
        assert f"((c.block << {4 * finer}) + {16**finer - 1})" in sql
        assert f"parent{finer}(block)" in sql
    assert f"c.level = {level + 1}" not in sql
    assert f"parent{level + 1}" not in sql
    assert ("point_rollups" in sql) == (level > 0)
    assert "points c" in sql  # cut level-1 blocks (or a level-0 read) go down to the points
    assert sql.count("CROSS JOIN") == level  # one scan per level of cut blocks
    assert sql.count("CROSS JOIN LATERAL") == (level if dialect == "postgresql" else 0)
    assert sql.count("LIMIT 16") == (level if dialect == "postgresql" else 0)


@pytest.mark.parametrize("level", range(1, ROLLUP_LEVELS + 1))
def test_a_sqlite_refresh_writes_one_block_of_its_level_from_the_16_below(level: int) -> None:
    sql = sqlite_refresh_sql(level)
    assert sql.startswith("INSERT INTO point_rollups")
    assert f"SELECT c.series_id, {level}, ?2," in sql
    source = "FROM points c WHERE c.series_id = ?1 AND c.step BETWEEN" if level == 1 else (
        f"FROM point_rollups c WHERE c.series_id = ?1 AND c.level = {level - 1} AND c.block BETWEEN"
    )
    assert source in sql
    assert "BETWEEN (?2 << 4) AND (?2 << 4) + 15" in sql
    assert "ON CONFLICT (series_id, level, block) DO UPDATE SET min_value = excluded.min_value" in sql


def test_the_postgres_merge_adds_the_inserted_points_to_one_block_per_level() -> None:
    sql = postgres_merge_sql()
    for level in range(1, ROLLUP_LEVELS + 1):
        assert f"level{level} AS (INSERT INTO point_rollups AS b" in sql
        assert f"SELECT series_id, {level}, step >> {4 * level}, MIN(value), MAX(value)" in sql
    assert f"level{ROLLUP_LEVELS + 1}" not in sql
    assert sql.count("FROM inserted GROUP BY 1, 3") == ROLLUP_LEVELS
    assert sql.count("point_count = b.point_count + excluded.point_count") == ROLLUP_LEVELS


# -- the statements, run -------------------------------------------------------------------------


def run_on(database_url: str, body: Callable[[AsyncConnection, Dialect, int], Awaitable[None]]) -> None:
    """`body(connection, dialect, series_id)` on a migrated database holding one empty series."""
    db.upgrade(database_url)

    async def go() -> None:
        engine = db.create_engine(database_url)
        try:
            async with engine.begin() as conn:
                await conn.execute(insert(Run).values(
                    id="r", name="r", project="p", group=None, config={}, tags=[], status="running",
                    acked_seq=-1, last_step=None, started_at=0.0, last_seen_at=0.0, finished_at=None,
                ))
                series_id = (await conn.execute(insert(Series).values(run_id="r", key="x").returning(Series.id))).scalar_one()
                dialect = engine.dialect.name
                assert dialect in DIALECTS
                await body(conn, dialect, series_id)  # type: ignore[arg-type]
        finally:
            await engine.dispose()

    asyncio.run(go())


async def write(conn: AsyncConnection, dialect: Dialect, series_id: int, points: dict[int, float]) -> None:
    """Store the points not stored yet and keep the rollups, as the database's write path does."""
    stored = [None if math.isnan(value) else value for value in points.values()]
    if dialect == "sqlite":
        await conn.exec_driver_sql(
            "INSERT OR IGNORE INTO points (series_id, step, value, wall_time) VALUES (?, ?, ?, 0.0)",
            [(series_id, step, value) for step, value in zip(points, stored, strict=True)],
        )
        blocks = {(series_id, step >> ROLLUP_BITS) for step in points}  # every block touched, resends too
        for level in range(1, ROLLUP_LEVELS + 1):
            await conn.exec_driver_sql(sqlite_refresh_sql(level), list(blocks))
            blocks = {(sid, block >> ROLLUP_BITS) for sid, block in blocks}
        return
    values = ", ".join(f"(:sid, CAST(:s{i} AS bigint), CAST(:v{i} AS float8), 0.0)" for i in range(len(points)))
    params: dict[str, Any] = {"sid": series_id}
    for i, (step, value) in enumerate(zip(points, stored, strict=True)):
        params.update({f"s{i}": step, f"v{i}": value})
    await conn.execute(text(
        f"WITH inserted AS (INSERT INTO points (series_id, step, value, wall_time) VALUES {values}"
        f" ON CONFLICT DO NOTHING RETURNING series_id, step, value), {postgres_merge_sql()} SELECT 1"
    ), params)


async def rollups(conn: AsyncConnection) -> set[tuple[Any, ...]]:
    result = await conn.execute(select(
        PointRollup.level, PointRollup.block, PointRollup.min_value, PointRollup.max_value,
        PointRollup.nan_count, PointRollup.point_count, PointRollup.last_step,
    ))
    return {tuple(row) for row in result}


def test_the_write_statements_keep_every_block_equal_to_its_points(database_url: str) -> None:
    """(level, block, min, max, NaNs, points, last step), worked out by hand. A resent step
    keeps its first value and is counted once; a block of NaNs alone has no min or max."""
    async def body(conn: AsyncConnection, dialect: Dialect, series_id: int) -> None:
        await write(conn, dialect, series_id, {1: 2.0, 15: math.nan, 16: -1.0, 40: math.nan, 300: 4.0})
        assert await rollups(conn) == {
            (1, 0, 2.0, 2.0, 1, 2, 15), (1, 1, -1.0, -1.0, 0, 1, 16), (1, 2, None, None, 1, 1, 40),
            (1, 18, 4.0, 4.0, 0, 1, 300),
            (2, 0, -1.0, 2.0, 2, 4, 40), (2, 1, 4.0, 4.0, 0, 1, 300),
            (3, 0, -1.0, 4.0, 2, 5, 300), (4, 0, -1.0, 4.0, 2, 5, 300), (5, 0, -1.0, 4.0, 2, 5, 300),
        }
        # resends of steps 1, 16 and 40 with other values, and two new points
        await write(conn, dialect, series_id, {1: 100.0, 16: -50.0, 40: 3.0, 17: 5.0, 2**20: -7.0})
        assert await rollups(conn) == {
            (1, 0, 2.0, 2.0, 1, 2, 15), (1, 1, -1.0, 5.0, 0, 2, 17), (1, 2, None, None, 1, 1, 40),
            (1, 18, 4.0, 4.0, 0, 1, 300), (1, 2**16, -7.0, -7.0, 0, 1, 2**20),
            (2, 0, -1.0, 5.0, 2, 5, 40), (2, 1, 4.0, 4.0, 0, 1, 300), (2, 2**12, -7.0, -7.0, 0, 1, 2**20),
            (3, 0, -1.0, 5.0, 2, 6, 300), (3, 2**8, -7.0, -7.0, 0, 1, 2**20),
            (4, 0, -1.0, 5.0, 2, 6, 300), (4, 2**4, -7.0, -7.0, 0, 1, 2**20),
            (5, 0, -1.0, 5.0, 2, 6, 300), (5, 1, -7.0, -7.0, 0, 1, 2**20),
        }

    run_on(database_url, body)


SERIES = {
    4: 100.0, 7_000_001: 99.0,  # outside every read below
    5: 1.0, 6: math.nan, 100: -2.0, 4096: 3.0, 65536: 0.25, 2**20 - 1: 7.0, 2**20: 6.0,
    2_000_000: -3.0, 2**21: 0.5, 3_145_735: -4.0,
    3_145_736: 8.0, 3_145_737: math.inf, 5_000_000: 2.0, 6_291_466: -1.0,
    6_291_467: 0.0, 6_291_468: -math.inf, 7_000_000: 5.0,
}
READS = {  # (lo, hi, width): points in [lo, hi], then per bucket: last step, its value, min, max, NaNs
    # Buckets [5, 3145735], [3145736, 6291466], [6291467, 9437197]: unaligned edges cut a
    # block of every level; level-5 blocks 1, 2 (bucket 0) and 4 (bucket 1) lie whole in one.
    (5, 7_000_000, 3 * 2**20 + 3): (17, [
        (3_145_735, -4.0, -4.0, 7.0, 1),
        (6_291_466, -1.0, -1.0, math.inf, 0),
        (7_000_000, 5.0, -math.inf, 5.0, 0),
    ]),
    # One bucket that ends where level-5 block 1 does: the block lies whole in it.
    (5, 2**21 - 1, 2**21 - 5): (8, [(2_000_000, -3.0, -3.0, 7.0, 1)]),
    # Buckets [2**20, 3145727], [3145728, ...] that start where level-5 blocks 1 and 3 do.
    (2**20, 3_145_735, 2**21): (4, [(2**21, 0.5, -3.0, 6.0, 0), (3_145_735, -4.0, -4.0, -4.0, 0)]),
}


@pytest.mark.parametrize("lo, hi, width", list(READS))
def test_every_level_covers_the_buckets_exactly(database_url: str, lo: int, hi: int, width: int) -> None:
    """A read from any level's blocks (down to the points at the cuts) gives what a scan of
    the points gives: the same count, min, max, NaNs and last value per bucket."""
    count, expected = READS[(lo, hi, width)]
    assert read_level(width) == ROLLUP_LEVELS  # the level a read of these buckets uses

    async def body(conn: AsyncConnection, dialect: Dialect, series_id: int) -> None:
        await write(conn, dialect, series_id, SERIES)
        buckets = {"sid": series_id, "lo": lo, "hi": hi, "width": width, "last_bucket": (hi - lo) // width}
        whole = {"sid": series_id, "lo": lo, "hi": hi, "width": hi - lo + 1, "last_bucket": 0}
        for level in LEVELS:
            assert (await conn.execute(count_sql(level, dialect), buckets)).scalar_one() == count, level
            assert (await conn.execute(count_sql(level, dialect), whole)).scalar_one() == count, level
            rows = [tuple(row) for row in await conn.execute(buckets_sql(level, dialect), buckets)]
            assert rows == expected, level

    run_on(database_url, body)
