"""How points are written, on either database, and the one interface the two differ behind.

Points go in with bulk statements that ignore (series, step) pairs already stored
(resends are no-ops, a point keeps its first value). A frame is written in transactions
of at most `POINTS_PER_TRANSACTION` points, so one huge frame never holds the database
(SQLite's single writer) from other clients for long; the writer's `acked_seq` moves in
the last one, so an ack always means "every row of the frame is committed".

Points carry no foreign key (checking one per inserted row doubled PostgreSQL's insert cost):
a write locks its run's row first (server/storage/admission.py), `retention.delete_run` takes
the same lock before it deletes a run's last points, and cached series ids are keyed by the
run's incarnation (`SeriesCache`), so a run deleted and created again on another replica is
never written into with its old series ids.

What differs between the databases is a `WritePath` (server/storage/sqlite.py,
server/storage/postgres.py), chosen once by the `Store`: the write transaction, the
statements that insert series and points and keep the rollups, PostgreSQL's
one-statement frame, and the INSERT construct other modules build their upserts with.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from server.errors import UnknownRun
from server.models import Command, Run, Series
from server.storage.admission import FrameRef, admit, advance
from server.storage.bounds import check_config, check_new_keys
from server.storage.details import has_details, insert_details
from server.storage.rollups import Dialect
from wire import Row

__all__ = [
    "POINTS_PER_TRANSACTION", "SERIES_PER_STATEMENT", "RunUpdate", "SeriesCache", "WritePath", "WriteResult",
    "finish_run", "last_step", "set_actions", "reject_frame", "update_config", "write_points",
]

POINTS_PER_TRANSACTION = 5_000
"""Points written per transaction of one frame: about 20 ms of SQLite's write lock, so other
clients' frames go in between those of a huge one."""
SERIES_PER_STATEMENT = 5_000
"""Series made (and their ids read back) per statement: SQLite binds at most 32,766 values
in one, and the first transaction of a frame makes the series of all its keys."""


@dataclass(frozen=True)
class WriteResult:
    stored: bool
    """False when the frame's seq was already acknowledged (nothing written)."""
    acked_seq: int
    last_step: int | None
    started_at: float
    """The incarnation of the run written to (`Head.started_at`, server/storage/admission.py)."""


@dataclass(frozen=True)
class RunUpdate:
    """What the last transaction of a write sets on its run: the last step and last-seen
    time; for a websocket frame also its writer's acked seq (and the run's, if higher), and
    "running" again (a trainer streaming again resumes its run; a REST backfill does not).
    On PostgreSQL the statement that inserts the points makes these updates too; on SQLite
    they follow it."""

    run_id: str
    last_step: int | None
    frame: FrameRef | None


class SeriesCache:
    """Series ids of the runs this process wrote, keyed by the run's incarnation (its
    `started_at`), and the incarnation of each run it last wrote. Ids are only added once
    the transaction that found them has committed."""

    def __init__(self) -> None:
        self._ids: dict[tuple[str, float, str], int] = {}
        self._started_at: dict[str, float] = {}

    def get(self, run_id: str, started_at: float, key: str) -> int | None:
        return self._ids.get((run_id, started_at, key))

    def last_written(self, run_id: str, rows: list[Row]) -> tuple[float, dict[str, int]] | None:
        """The incarnation of the run this process last wrote, and the id of every key
        `rows` name in it; None unless all are known."""
        started_at = self._started_at.get(run_id)
        if started_at is None:
            return None
        series_ids: dict[str, int] = {}
        for row in rows:
            for key in row.values:
                if key not in series_ids:
                    series_id = self._ids.get((run_id, started_at, key))
                    if series_id is None:
                        return None
                    series_ids[key] = series_id
        return started_at, series_ids

    def remember(self, run_id: str, started_at: float, series_ids: dict[str, int]) -> None:
        for key, series_id in series_ids.items():
            self._ids[(run_id, started_at, key)] = series_id
        self._started_at[run_id] = started_at

    def forget(self, run_id: str) -> None:
        self._started_at.pop(run_id, None)
        for key in [key for key in self._ids if key[0] == run_id]:
            del self._ids[key]


class WritePath(Protocol):
    """The one place storage differs between SQLite and PostgreSQL: `SqliteWritePath`
    (one writer at a time, rollups recomputed from their children) and `PostgresWritePath`
    (rollups merged by the inserting statement, a frame in one statement), one of them
    chosen when the `Store` is built."""

    dialect: Dialect
    """Which database's SQL the reads use (server/storage/rollups.py)."""
    shared: bool
    """Whether several server processes may share this database (PostgreSQL's replicas):
    what live fan-out and the alerts' coordination are chosen by (server/components.py).
    SQLite's belongs to one process, whose writer lock is in memory."""

    insert: Callable[..., Any]
    """This database's INSERT of a table, the one with ON CONFLICT (SQLAlchemy's core INSERT
    has none): what an upsert outside storage is built with (server/alerts/repository.py)."""

    def transaction(self) -> AbstractAsyncContextManager[AsyncSession]:
        """A write transaction, committed when the block exits."""

    async def add_series(self, session: AsyncSession, run_id: str, keys: list[str]) -> None:
        """Insert these series of the run, leaving the ones that exist alone."""

    async def insert_points(
        self, session: AsyncSession, rows: list[Row], series_ids: dict[str, int], now: float, update: RunUpdate | None
    ) -> None:
        """Insert the points of `rows` not stored yet, bring their rollup blocks up to date,
        and make `update` (if any), in the caller's transaction."""

    async def write_frame(
        self, run_id: str, rows: list[Row], now: float, frame: FrameRef, series: SeriesCache
    ) -> WriteResult | None:
        """The whole frame in one statement, where this database has one; None when not
        (nothing written: the transactional path follows)."""

    async def close(self) -> None:
        """Close what the write path holds beside the engine."""


async def write_points(
    path: WritePath,
    series: SeriesCache,
    run_id: str,
    rows: list[Row],
    now: float,
    frame: FrameRef | None,
    max_keys: int,
) -> WriteResult:
    """`Store.write_points`: the frame in one statement if the database can, else in
    transactions of at most `POINTS_PER_TRANSACTION` points, the last one acking it.

    The first transaction makes the series of every key of the frame, after checking that
    the new ones keep the run within `max_keys` (server/storage/bounds.py): a frame that
    would pass it raises TooLarge with nothing stored, and one cut into several
    transactions cannot be pushed past it by another writer's keys between them."""
    details = has_details(rows)
    if frame is not None and not details:
        written = await path.write_frame(run_id, rows, now, frame, series)
        if written is not None:
            return written
    chunks = _chunks(rows, POINTS_PER_TRANSACTION)
    result = WriteResult(stored=True, acked_seq=-1, last_step=None, started_at=math.nan)
    for index, chunk in enumerate(chunks):
        keys = {key for row in (rows if index == 0 else chunk) for key in row.values}
        result = await _write_chunk(
            path, series, run_id, rows, chunk, keys, index == len(chunks) - 1, now, frame, details, max_keys
        )
        if not result.stored:
            return result
    return result


async def _write_chunk(
    path: WritePath,
    series: SeriesCache,
    run_id: str,
    rows: list[Row],
    chunk: list[Row],
    keys: set[str],
    last: bool,
    now: float,
    frame: FrameRef | None,
    details: bool,
    max_keys: int,
) -> WriteResult:
    """One transaction of `write_points`; the last one also moves the writer's acked seq.
    `keys`: the series it makes sure of (the chunk's, or the whole frame's in the first);
    `details`: whether any row of the frame has step details."""
    async with path.transaction() as session:
        head = await admit(session, run_id, frame)
        acked_seq, stored_last_step = head.acked_seq, head.last_step
        if frame is not None and frame.seq <= acked_seq:
            return WriteResult(stored=False, acked_seq=acked_seq, last_step=stored_last_step, started_at=head.started_at)
        series_ids = await _ensure_series(path, series, session, run_id, head.started_at, keys, max_keys)
        update = None
        if last:
            stored_last_step = last_step(stored_last_step, rows)
            update = RunUpdate(run_id, stored_last_step, frame)
            if frame is not None:
                acked_seq = frame.seq
        if details:
            await insert_details(session, run_id, chunk)
        await path.insert_points(session, chunk, series_ids, now, update)
    series.remember(run_id, head.started_at, series_ids)  # committed
    return WriteResult(stored=True, acked_seq=acked_seq, last_step=stored_last_step, started_at=head.started_at)


async def _ensure_series(
    path: WritePath,
    series: SeriesCache,
    session: AsyncSession,
    run_id: str,
    started_at: float,
    keys: Iterable[str],
    max_keys: int,
) -> dict[str, int]:
    """The series id of each of `keys`, making the series the run lacks; TooLarge (nothing
    made) if they would give the run more than `max_keys` keys."""
    ids: dict[str, int] = {}
    missing: list[str] = []
    for key in keys:
        cached = series.get(run_id, started_at, key)
        if cached is None:
            missing.append(key)
        else:
            ids[key] = cached
    if missing:
        await check_new_keys(session, run_id, missing, max_keys)
    for start in range(0, len(missing), SERIES_PER_STATEMENT):
        batch = missing[start : start + SERIES_PER_STATEMENT]
        await path.add_series(session, run_id, batch)
        found = await session.execute(select(Series.key, Series.id).where(Series.run_id == run_id, Series.key.in_(batch)))
        ids.update({key: series_id for key, series_id in found})
    return ids


async def reject_frame(path: WritePath, run_id: str, frame: FrameRef, now: float) -> None:
    """`Store.reject_frame`: use up `frame.seq` without storing anything."""
    async with path.transaction() as session:
        head = await admit(session, run_id, frame)
        if frame.seq > head.acked_seq:
            await advance(session, run_id, frame, last_seen_at=now)


async def finish_run(session: AsyncSession, run_id: str, status: str, now: float, unsent: int | None = None) -> None:
    """The run ended: its status, the frames its trainer ended without (None: none), and
    what its trainer had not answered of its commands will not be answered (`failed`)."""
    result = await session.execute(
        update(Run)
        .where(Run.id == run_id)
        .values(status=status, finished_at=now, last_seen_at=now, unsent=unsent or None)
        .returning(Run.id)
    )
    if result.first() is None:
        raise UnknownRun(run_id)
    await session.execute(
        update(Command)
        .where(Command.run_id == run_id, Command.state.in_(("pending", "delivered")))
        .values(state="failed", finished_at=now, message=f"the run ended ({status}) before its trainer answered")
    )


async def set_actions(session: AsyncSession, run_id: str, actions: dict[str, str] | None) -> None:
    """What the run's trainer says it takes of commands (models.Run.actions)."""
    await session.execute(update(Run).where(Run.id == run_id).values(actions=actions))


async def update_config(session: AsyncSession, run_id: str, config: dict[str, Any], max_bytes: int) -> Run:
    """`Store.update_config`: the run's config with the top-level keys of `config` set to
    its values (the others kept), under the run's lock (as a write of its points takes it);
    TooLarge, nothing changed, if the merged config would be over `max_bytes` as JSON."""
    run = await session.get(Run, run_id, with_for_update=True)
    if run is None:
        raise UnknownRun(run_id)
    merged = {**(run.config or {}), **config}
    check_config(run_id, merged, max_bytes, "this update")
    # A new dict, not the stored one changed in place: a JSON column only writes what is
    # assigned to it (SQLAlchemy does not see a mutation inside the value).
    run.config = merged
    return run


def last_step(stored: int | None, rows: list[Row]) -> int | None:
    """The run's last step once `rows` are stored on top of `stored`."""
    steps = [row.step for row in rows]
    return max(steps if stored is None else [stored, *steps], default=None)


def _chunks(rows: list[Row], points: int) -> list[list[Row]]:
    """`rows` cut into runs of about `points` values each (at least one chunk, maybe empty)."""
    chunks: list[list[Row]] = [[]]
    count = 0
    for row in rows:
        if count and count + len(row.values) > points:
            chunks.append([])
            count = 0
        chunks[-1].append(row)
        count += len(row.values)
    return chunks
