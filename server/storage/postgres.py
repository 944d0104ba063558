"""The PostgreSQL write path: points inserted and merged into their rollup blocks by one
statement (RETURNING tells it exactly which rows it inserted), and a websocket frame, in the
steady state, written whole by one autocommit statement on a psycopg pool of its own
(`FRAME_SQL`). Any replica may write any run: every write locks the run's row.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from functools import cache
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from server import db
from server.errors import UnknownRun
from server.models import Series
from server.storage.admission import FrameRef, check_frame
from server.storage.rollups import Dialect, postgres_merge_sql
from server.storage.writes import (
    POINTS_PER_TRANSACTION,
    RunUpdate,
    SeriesCache,
    WriteResult,
    last_step,
)
from wire import Row

__all__ = ["FRAME_CONNECTIONS", "FRAME_SQL", "PostgresWritePath"]

_INSERT_POINTS_SQL = (
    "INSERT INTO points (series_id, step, value, wall_time)"
    " SELECT * FROM unnest(CAST(:series_ids AS int4[]), CAST(:steps AS int8[]),"
    " CAST(:vals AS float8[]), CAST(:times AS float8[]))"
)
"""The points given as array literals (`_point_arrays`)."""

_TAILS = {
    "": "",
    # The last transaction of a REST write: the run's last step.
    "rest": ", run_update AS (UPDATE runs SET last_step = CAST(:last_step AS bigint),"
    " last_seen_at = CAST(:now AS double precision) WHERE id = :run_id)",
    # The last transaction of a websocket frame: the writer's acked seq, and the run's (if
    # higher); a trainer streaming again resumes its run.
    "frame": ", writer_update AS (UPDATE run_writers SET acked_seq = CAST(:seq AS bigint)"
    " WHERE run_id = :run_id AND writer = :writer),"
    " run_update AS (UPDATE runs SET last_step = CAST(:last_step AS bigint),"
    " last_seen_at = CAST(:now AS double precision), status = 'running', finished_at = NULL,"
    " acked_seq = GREATEST(acked_seq, CAST(:seq AS bigint)) WHERE id = :run_id)",
}
"""What the statement that inserts a chunk's points also updates (`RunUpdate`): one round
trip instead of three. Each data-modifying WITH runs once, to completion, read or not, also
when there are no points to insert."""


@cache
def _write_points_sql(tail: str = "") -> Any:
    """Insert the points given as array literals and merge the ones inserted into their
    blocks, then `_TAILS[tail]`."""
    return text(
        f"WITH inserted AS ({_INSERT_POINTS_SQL} ON CONFLICT DO NOTHING RETURNING series_id, step, value),"
        f" {postgres_merge_sql()}{_TAILS[tail]} SELECT 1"
    )


def _psycopg(sql: str) -> str:
    """A statement with `:name` parameters in psycopg's `%(name)s` style (for a statement
    run on a psycopg connection of its own, not through SQLAlchemy)."""
    return str(text(sql).compile(dialect=psycopg_dialect()))


FRAME_SQL = _psycopg(
    "WITH head AS (SELECT r.last_step, r.started_at, w.acked_seq, w.session FROM runs r"
    " LEFT JOIN run_writers w ON w.run_id = r.id AND w.writer = :writer"
    " WHERE r.id = :run_id FOR UPDATE OF r),"
    " admitted AS (SELECT 1 FROM head WHERE session = :session AND acked_seq + 1 = CAST(:seq AS int8)"
    " AND started_at = CAST(:started_at AS float8)),"
    f" inserted AS ({_INSERT_POINTS_SQL} WHERE EXISTS (TABLE admitted)"
    " ON CONFLICT DO NOTHING RETURNING series_id, step, value), "
    + postgres_merge_sql()
    + ", writer_update AS (UPDATE run_writers SET acked_seq = CAST(:seq AS int8)"
    " WHERE run_id = :run_id AND writer = :writer AND EXISTS (TABLE admitted)),"
    " run_update AS (UPDATE runs SET last_step = GREATEST(last_step, CAST(:max_step AS int8)),"
    " last_seen_at = CAST(:now AS float8), status = 'running', finished_at = NULL,"
    " acked_seq = GREATEST(acked_seq, CAST(:seq AS int8))"
    " WHERE id = :run_id AND EXISTS (TABLE admitted))"
    " SELECT last_step, started_at, acked_seq, session FROM head"
)
"""A whole websocket frame in one autocommit statement (the steady state): lock the run's
row and read it with the writer's (`head`), and only if the frame is that writer's next
over this connection, of this incarnation of the run (`admitted`), insert its points and
merge them into their rollup blocks, advance the writer's acked seq (and the run's, if
higher) and move the run's last step; returns `head` as it was before, so the caller tells
a resend, a gap or a superseded connection apart exactly as `admission.admit` does. One
round trip instead of four (BEGIN, admit, write, COMMIT). Kept under psycopg's
`MAX_CACHED_STATEMENT_LENGTH` (4,096 characters): a longer query is parsed again on every
execution, which cost a third of the write's CPU."""

FRAME_CONNECTIONS = 8
"""PostgreSQL connections of the pool that runs `FRAME_SQL` (beside the engine's)."""


def _frame_pool(engine: AsyncEngine) -> AsyncConnectionPool:
    """psycopg's own pool, in autocommit, for the one statement a websocket frame costs:
    through SQLAlchemy's pool and execution that statement cost 0.5 ms of server CPU, on a
    connection of this pool 0.2 ms. Like the engine's pool (`server.db`), it pings only a
    connection that sat idle, so a database restart is found before a frame uses it."""
    idle_since: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], float] = weakref.WeakKeyDictionary()

    async def check(connection: psycopg.AsyncConnection[Any]) -> None:
        since = idle_since.get(connection)
        if since is not None and time.monotonic() - since >= db.PING_AFTER_IDLE_S:
            await AsyncConnectionPool.check_connection(connection)

    async def returned(connection: psycopg.AsyncConnection[Any]) -> None:
        idle_since[connection] = time.monotonic()

    return AsyncConnectionPool(
        engine.url.set(drivername="postgresql").render_as_string(hide_password=False),
        min_size=1, max_size=FRAME_CONNECTIONS, kwargs={"autocommit": True},
        check=check, reset=returned, open=False, name="keel-frames",
    )


def _array(items: Iterable[Any]) -> str:
    """A PostgreSQL array literal of numbers: formatting it is several times cheaper than
    the driver adapting a list element by element. Floats keep their repr ("inf" and "-inf"
    are valid float8); NaN becomes NULL, as it is stored."""
    return "{" + ",".join(map(repr, items)).replace("nan", "NULL") + "}"


def _point_arrays(rows: list[Row], series_ids: dict[str, int], now: float) -> dict[str, Any]:
    """The parameters of `_INSERT_POINTS_SQL`."""
    sids: list[int] = []
    steps: list[int] = []
    vals: list[float] = []
    times: list[float] = []
    for row in rows:
        count = len(row.values)
        sids.extend([series_ids[key] for key in row.values])
        steps.extend([row.step] * count)
        vals.extend(map(float, row.values.values()))
        times.extend([float(row.time or now)] * count)
    return {"series_ids": _array(sids), "steps": _array(steps), "vals": _array(vals), "times": _array(times)}


class PostgresWritePath:
    dialect: Dialect = "postgresql"
    shared = True
    insert = staticmethod(pg_insert)

    def __init__(self, engine: AsyncEngine, sessions: async_sessionmaker[AsyncSession]):
        self.sessions = sessions
        self._frames = _frame_pool(engine)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        async with self.sessions() as session, session.begin():
            yield session

    async def add_series(self, session: AsyncSession, run_id: str, keys: list[str]) -> None:
        await session.execute(
            pg_insert(Series)
            .values([{"run_id": run_id, "key": key} for key in keys])
            .on_conflict_do_nothing(index_elements=["run_id", "key"])
        )

    async def insert_points(
        self, session: AsyncSession, rows: list[Row], series_ids: dict[str, int], now: float, update: RunUpdate | None
    ) -> None:
        """Insert the points not stored yet, merge them into their rollup blocks and make
        `update`, in one statement."""
        if update is None and not any(row.values for row in rows):
            return
        params = _point_arrays(rows, series_ids, now)
        tail = ""
        if update is not None:
            tail = "rest" if update.frame is None else "frame"
            params.update(run_id=update.run_id, last_step=update.last_step, now=now)
            if update.frame is not None:
                params.update(seq=update.frame.seq, writer=update.frame.writer)
        await session.execute(_write_points_sql(tail), params)

    async def write_frame(
        self, run_id: str, rows: list[Row], now: float, frame: FrameRef, series: SeriesCache
    ) -> WriteResult | None:
        """The frame in one statement (`FRAME_SQL`), when it fits in one transaction and
        every series it names is known for the incarnation of the run this process last
        wrote; else, or when the run turns out to be another incarnation, None."""
        if sum(len(row.values) for row in rows) > POINTS_PER_TRANSACTION:
            return None
        known = series.last_written(run_id, rows)
        if known is None:
            return None
        started_at, series_ids = known
        params = _point_arrays(rows, series_ids, now)
        params.update(
            run_id=run_id, writer=frame.writer, session=frame.session, seq=frame.seq,
            started_at=started_at, max_step=last_step(None, rows), now=now,
        )
        if self._frames.closed:
            await self._frames.open()
        async with self._frames.connection() as connection:
            head: Any = await (await connection.execute(FRAME_SQL, params)).fetchone()
        if head is None:
            raise UnknownRun(run_id)
        stored_last_step, stored_started_at, acked_seq, writer_session = head
        if stored_started_at != started_at:
            series.forget(run_id)
            return None
        check_frame(run_id, frame, acked_seq, writer_session)
        if frame.seq <= acked_seq:
            return WriteResult(stored=False, acked_seq=acked_seq, last_step=stored_last_step, started_at=started_at)
        return WriteResult(
            stored=True, acked_seq=frame.seq, last_step=last_step(stored_last_step, rows), started_at=started_at
        )

    async def close(self) -> None:
        await self._frames.close()
