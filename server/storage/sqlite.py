"""The SQLite write path: one writer at a time, taken fairly between clients
(server/fairlock.py), so a write never waits on SQLite's own lock. Points are inserted with
INSERT OR IGNORE, then the rollup blocks the write touched are recomputed from their
children, level by level; the run's row is updated last. One server process owns the file.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from server.fairlock import FairLock
from server.models import Series
from server.storage.admission import FrameRef, advance, update_run
from server.storage.rollups import ROLLUP_BITS, ROLLUP_LEVELS, Dialect, sqlite_refresh_sql
from server.storage.writes import RunUpdate, SeriesCache, WriteResult
from wire import Row

__all__ = ["SqliteWritePath"]

_INSERT_POINTS = "INSERT OR IGNORE INTO points (series_id, step, value, wall_time) VALUES (?, ?, ?, ?)"


def _stored(value: float) -> float | None:
    """NaN is stored as NULL (SQLite cannot hold NaN)."""
    return None if math.isnan(value) else value


class SqliteWritePath:
    dialect: Dialect = "sqlite"
    shared = False
    insert = staticmethod(sqlite_insert)

    def __init__(self, sessions: async_sessionmaker[AsyncSession]):
        self.sessions = sessions
        # SQLite has a single writer; serialising here avoids lock-timeout errors.
        self._lock = FairLock()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        async with self._lock.hold(), self.sessions() as session, session.begin():
            yield session

    async def add_series(self, session: AsyncSession, run_id: str, keys: list[str]) -> None:
        await session.execute(
            sqlite_insert(Series)
            .values([{"run_id": run_id, "key": key} for key in keys])
            .on_conflict_do_nothing(index_elements=["run_id", "key"])
        )

    async def insert_points(
        self, session: AsyncSession, rows: list[Row], series_ids: dict[str, int], now: float, update: RunUpdate | None
    ) -> None:
        """Insert the points not stored yet, recompute the rollup blocks they touched, then
        make `update`."""
        if any(row.values for row in rows):
            await self._insert(session, rows, series_ids, now)
        if update is None:
            return
        if update.frame is None:
            await update_run(session, update.run_id, None, last_step=update.last_step, last_seen_at=now)
        else:
            await advance(
                session, update.run_id, update.frame, last_step=update.last_step, last_seen_at=now, status="running", finished_at=None
            )

    async def _insert(self, session: AsyncSession, rows: list[Row], series_ids: dict[str, int], now: float) -> None:
        # (series, level-1 block) of every point sent: the blocks whose summaries may change.
        touched: set[tuple[int, int]] = set()
        params = []
        for row in rows:
            wall_time, block = row.time or now, row.step >> ROLLUP_BITS
            for key, value in row.values.items():
                series_id = series_ids[key]
                params.append((series_id, row.step, _stored(value), wall_time))
                touched.add((series_id, block))
        # Driver-level executemany: SQLAlchemy's per-row parameter processing cost more than SQLite.
        connection = await session.connection()
        await connection.exec_driver_sql(_INSERT_POINTS, params)
        blocks = touched
        for level in range(1, ROLLUP_LEVELS + 1):
            await connection.exec_driver_sql(sqlite_refresh_sql(level), list(blocks))
            blocks = {(series_id, block >> ROLLUP_BITS) for series_id, block in blocks}

    async def write_frame(
        self, run_id: str, rows: list[Row], now: float, frame: FrameRef, series: SeriesCache
    ) -> WriteResult | None:
        return None  # no one-statement frame: every write is a transaction under the lock

    async def close(self) -> None:
        pass  # nothing beside the engine
