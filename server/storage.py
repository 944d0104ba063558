"""Storage of runs, their series and points (alert tables: server/alerts/repository.py).

Points go in with bulk statements that ignore (series, step) pairs already stored
(resends are no-ops, a point keeps its first value). A frame is written in transactions
of at most `POINTS_PER_TRANSACTION` points, so one huge frame never holds the database
(SQLite's single writer) from other clients for long; the writer's `acked_seq` moves in
the last one, so an ack always means "every row of the frame is committed".

Frames are numbered per writer (`run_writers`): a writer's next frame must carry
`acked_seq + 1` (a later one is a gap: refused, never acked), a seq at or below
`acked_seq` is a resend (acked again, nothing written), and only the connection that
said hello last for a writer may write as it (an older one is superseded).

Bucketed reads do not visit every point: `point_rollups` summarises each series per aligned
block of 16**L steps (L = 1..ROLLUP_LEVELS; min, max, NaN count, point count, last step),
kept in the transaction that stores the points, so it is a function of the stored points
alone. On PostgreSQL one statement inserts the points and merges exactly the rows it inserted
(RETURNING) into every level's blocks; on SQLite, whose writes are serialised, the blocks a
write touched are recomputed from their children, level by level. Either way a resent point
(not inserted) changes nothing, and nothing is ever counted twice. A read covers each bucket
exactly by the largest blocks that fit in it, descending to finer levels, and to points, only
where a bucket edge cuts a block (docs/operations.md, "Reads").

Points carry no foreign key (checking one per inserted row doubled PostgreSQL's insert cost):
a write locks its run's row first, `retention.delete_run` takes the same lock before it
deletes a run's last points, and cached series ids are keyed by the run's incarnation (its
`started_at`), so a run deleted and created again on another replica is never written into
with its old series ids.
"""

from __future__ import annotations

import math
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import BigInteger, bindparam, case, func, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import aliased

from server import db
from server.db import is_sqlite, session_factory
from server.errors import RunConflict, SeqGap, Superseded, UnknownRun
from server.fairlock import FairLock
from server.models import Point, PointRollup, Run, RunWriter, Series
from wire import Row, RunInfo

__all__ = [
    "FrameRef", "Store", "WriteResult", "SeriesData", "KeyInfo",
    "POINTS_PER_TRANSACTION", "ROLLUP_BITS", "ROLLUP_LEVELS",
]

POINTS_PER_TRANSACTION = 5_000
"""Points written per transaction of one frame: about 20 ms of SQLite's write lock, so other
clients' frames go in between those of a huge one."""
ROLLUP_BITS = 4
"""A rollup block of level L spans 2**(ROLLUP_BITS * L) steps: 16 children per block. Fewer
children would make a read visit fewer rows at each bucket edge, but a write refresh more
blocks (bench/README.md). Changing it needs a migration that rebuilds point_rollups."""
ROLLUP_LEVELS = 5
"""Blocks of 16 .. 2**20 steps. A 1,000-bucket read visits at most ~16,000 top-level blocks
plus ~32 rows per bucket edge while buckets are under 2**24 steps wide, i.e. for series of up
to ~1.6e10 steps; beyond that its cost grows with length again."""


@dataclass(frozen=True)
class FrameRef:
    """Which writer's frame a write is, over which connection (websocket ingest)."""

    writer: str
    session: str
    """The id `open_run` gave the connection."""
    seq: int


@dataclass(frozen=True)
class WriteResult:
    stored: bool
    """False when the frame's seq was already acknowledged (nothing written)."""
    acked_seq: int
    last_step: int | None
    started_at: float
    """The incarnation of the run written to (`_Head.started_at`)."""


@dataclass(frozen=True)
class _Head:
    """What a write reads of its run under the run's lock."""

    acked_seq: int
    """The frame's writer's (-1 for a REST write)."""
    last_step: int | None
    started_at: float
    """Tells incarnations of a run id apart (deleted and created again)."""


@dataclass(frozen=True)
class _RunUpdate:
    """What the last transaction of a write sets on its run: the last step and last-seen
    time; for a websocket frame also its writer's acked seq (and the run's, if higher), and
    "running" again (a trainer streaming again resumes its run; a REST backfill does not).
    On PostgreSQL the statement that inserts the points makes these updates too
    (`_PG_TAILS`); on SQLite they follow it (`Store._store_sqlite`)."""

    run_id: str
    last_step: int | None
    frame: FrameRef | None


@dataclass(frozen=True)
class KeyInfo:
    key: str
    count: int
    last_step: int | None


@dataclass(frozen=True)
class SeriesData:
    key: str
    downsampled: bool
    steps: list[int]
    values: list[float]
    mins: list[float] | None = None
    maxs: list[float] | None = None


@cache
def _admit_sql(with_writer: bool, lock: bool) -> Any:
    """The run's row (and the frame's writer's), built once: a statement built per frame
    costs more Python than the database takes to answer it."""
    query = select(Run.last_step, Run.started_at).where(Run.id == bindparam("run_id"))
    if with_writer:
        on = (RunWriter.run_id == Run.id) & (RunWriter.writer == bindparam("writer"))
        query = query.add_columns(RunWriter.acked_seq, RunWriter.session).outerjoin(RunWriter, on)
    return query.with_for_update(of=Run) if lock else query


_ADVANCE_WRITER_SQL = (
    update(RunWriter)
    .where(RunWriter.run_id == bindparam("b_run_id"), RunWriter.writer == bindparam("b_writer"))
    .values(acked_seq=bindparam("b_seq"))
)


@cache
def _update_run_sql(columns: tuple[str, ...], advance: bool) -> Any:
    """UPDATE runs SET `columns` (bound as `new_<column>`), and the run's acked seq to the
    frame's (`b_seq`) if higher (`advance`). (An UPDATE may not bind a column's own name.)"""
    values: dict[str, Any] = {column: bindparam(f"new_{column}") for column in columns}
    if advance:
        seq = bindparam("b_seq", type_=BigInteger)
        values["acked_seq"] = case((Run.acked_seq < seq, seq), else_=Run.acked_seq)
    return update(Run).where(Run.id == bindparam("b_run_id")).values(**values)


_PG_TAILS = {
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
"""What the statement that inserts a chunk's points also updates (PostgreSQL, `_RunUpdate`):
one round trip instead of three. Each data-modifying WITH runs once, to completion, read or
not, also when there are no points to insert."""


def _psycopg(sql: str) -> str:
    """A statement with `:name` parameters in psycopg's `%(name)s` style (for a statement
    run on a psycopg connection of its own, not through SQLAlchemy)."""
    return str(text(sql).compile(dialect=psycopg_dialect()))


def _rollup_merge_sql() -> str:
    """CTEs `level1` .. `levelN` that merge the rows of a CTE `inserted` (series_id, step,
    value) into their blocks at every level: min and max (LEAST/GREATEST skip NULL, i.e.
    NaN), counts added, last step."""
    merge = (
        " ON CONFLICT (series_id, level, block) DO UPDATE SET"
        " min_value = LEAST(b.min_value, excluded.min_value),"
        " max_value = GREATEST(b.max_value, excluded.max_value),"
        " nan_count = b.nan_count + excluded.nan_count,"
        " point_count = b.point_count + excluded.point_count,"
        " last_step = GREATEST(b.last_step, excluded.last_step)"
    )
    return ", ".join(
        f"level{level} AS (INSERT INTO point_rollups AS b"
        " (series_id, level, block, min_value, max_value, nan_count, point_count, last_step)"
        f" SELECT series_id, {level}, step >> {ROLLUP_BITS * level}, MIN(value), MAX(value),"
        " COUNT(*) - COUNT(value), COUNT(*), MAX(step)"
        f" FROM inserted GROUP BY 1, 3{merge})"
        for level in range(1, ROLLUP_LEVELS + 1)
    )


_INSERT_POINTS_SQL = (
    "INSERT INTO points (series_id, step, value, wall_time)"
    " SELECT * FROM unnest(CAST(:series_ids AS int4[]), CAST(:steps AS int8[]),"
    " CAST(:vals AS float8[]), CAST(:times AS float8[]))"
)
"""The points given as array literals (`_array`)."""


@cache
def _pg_write_points_sql(tail: str = "") -> Any:
    """Insert the points given as array literals and merge the ones inserted into their
    blocks, then `_PG_TAILS[tail]`."""
    return text(
        f"WITH inserted AS ({_INSERT_POINTS_SQL} ON CONFLICT DO NOTHING RETURNING series_id, step, value),"
        f" {_rollup_merge_sql()}{_PG_TAILS[tail]} SELECT 1"
    )


_FRAME_SQL = _psycopg(
    "WITH head AS (SELECT r.last_step, r.started_at, w.acked_seq, w.session FROM runs r"
    " LEFT JOIN run_writers w ON w.run_id = r.id AND w.writer = :writer"
    " WHERE r.id = :run_id FOR UPDATE OF r),"
    " admitted AS (SELECT 1 FROM head WHERE session = :session AND acked_seq + 1 = CAST(:seq AS int8)"
    " AND started_at = CAST(:started_at AS float8)),"
    f" inserted AS ({_INSERT_POINTS_SQL} WHERE EXISTS (TABLE admitted)"
    " ON CONFLICT DO NOTHING RETURNING series_id, step, value), "
    + _rollup_merge_sql()
    + ", writer_update AS (UPDATE run_writers SET acked_seq = CAST(:seq AS int8)"
    " WHERE run_id = :run_id AND writer = :writer AND EXISTS (TABLE admitted)),"
    " run_update AS (UPDATE runs SET last_step = GREATEST(last_step, CAST(:max_step AS int8)),"
    " last_seen_at = CAST(:now AS float8), status = 'running', finished_at = NULL,"
    " acked_seq = GREATEST(acked_seq, CAST(:seq AS int8))"
    " WHERE id = :run_id AND EXISTS (TABLE admitted))"
    " SELECT last_step, started_at, acked_seq, session FROM head"
)
"""A whole websocket frame in one autocommit statement (PostgreSQL, the steady state):
lock the run's row and read it with the writer's (`head`), and only if the frame is
that writer's next over this connection, of this incarnation of the run (`admitted`),
insert its points and merge them into their rollup blocks, advance the writer's acked
seq (and the run's, if higher) and move the run's last step; returns `head` as it was
before, so the caller tells a resend, a gap or a superseded connection apart exactly
as `Store._admit` does. One round trip instead of four (BEGIN, admit, write, COMMIT).
Kept under psycopg's `MAX_CACHED_STATEMENT_LENGTH` (4,096 characters): a longer query
is parsed again on every execution, which cost a third of the write's CPU."""


_SQLITE_INSERT_POINTS = "INSERT OR IGNORE INTO points (series_id, step, value, wall_time) VALUES (?, ?, ?, ?)"


def _array(items: Iterable[Any]) -> str:
    """A PostgreSQL array literal of numbers: formatting it is several times cheaper than
    the driver adapting a list element by element. Floats keep their repr ("inf" and "-inf"
    are valid float8); NaN becomes NULL, as it is stored."""
    return "{" + ",".join(map(repr, items)).replace("nan", "NULL") + "}"


@dataclass(frozen=True)
class _Level:
    """What a summary is made from, at one level: the points (0) or the rollup blocks (1..)."""

    level: int

    @property
    def source(self) -> str:
        return "points c" if self.level == 0 else "point_rollups c"

    def key_in(self, lo: str, hi: str) -> str:
        """The condition "a row of this level of series c.series_id, keyed within [lo, hi]"."""
        if self.level == 0:
            return f"c.step BETWEEN {lo} AND {hi}"
        return f"c.level = {self.level} AND c.block BETWEEN {lo} AND {hi}"

    def children_of(self, parent_block: str) -> str:
        """The condition "a row of this level inside the level + 1 block `parent_block`"."""
        first = f"({parent_block} << {ROLLUP_BITS})"
        return self.key_in(first, f"{first} + {(1 << ROLLUP_BITS) - 1}")

    @property
    def first_step(self) -> str:
        return "c.step" if self.level == 0 else f"(c.block << {ROLLUP_BITS * self.level})"

    @property
    def last_covered(self) -> str:
        """The last step the row's block spans (not the last it holds)."""
        if self.level == 0:
            return "c.step"
        return f"((c.block << {ROLLUP_BITS * self.level}) + {(1 << ROLLUP_BITS * self.level) - 1})"

    @property
    def row(self) -> str:
        """min, max, NaN count, point count and last step of one row of this level."""
        if self.level == 0:
            return (
                "c.value AS min_value, c.value AS max_value, CASE WHEN c.value IS NULL THEN 1 ELSE 0 END"
                " AS nan_count, 1 AS point_count, c.step AS last_step"
            )
        return "c.min_value, c.max_value, c.nan_count, c.point_count, c.last_step"

    @property
    def summary(self) -> str:
        """min, max, NaN count, point count and last step of the rows selected, as one row."""
        if self.level == 0:
            return (
                "MIN(c.value) AS min_value, MAX(c.value) AS max_value,"
                " SUM(CASE WHEN c.value IS NULL THEN 1 ELSE 0 END) AS nan_count,"
                " COUNT(*) AS point_count, MAX(c.step) AS last_step"
            )
        return (
            "MIN(c.min_value) AS min_value, MAX(c.max_value) AS max_value, SUM(c.nan_count) AS nan_count,"
            " SUM(c.point_count) AS point_count, MAX(c.last_step) AS last_step"
        )


# SQLite: refreshing the rollup blocks a write touched, one level at a time (each from the level
# below, level 1 from the points). A summary is recomputed from its children, so points the
# write did not insert (already stored) cannot count twice.
_ROLLUP_INSERT = (
    "INSERT INTO point_rollups"
    " (series_id, level, block, min_value, max_value, nan_count, point_count, last_step) "
)
_ROLLUP_UPSERT = (
    " ON CONFLICT (series_id, level, block) DO UPDATE SET min_value = excluded.min_value,"
    " max_value = excluded.max_value, nan_count = excluded.nan_count,"
    " point_count = excluded.point_count, last_step = excluded.last_step"
)


@cache
def _sqlite_refresh_sql(level: int) -> str:
    """Recompute one level-`level` block from its children: series id ?1, block ?2, one
    execution per block (a driver-level executemany)."""
    children = _Level(level - 1)
    return (
        f"{_ROLLUP_INSERT}SELECT c.series_id, {level}, ?2, {children.summary} FROM {children.source}"
        f" WHERE c.series_id = ?1 AND {children.children_of('?2')} GROUP BY c.series_id{_ROLLUP_UPSERT}"
    )


def _read_level(width: int) -> int:
    """The coarsest rollup level whose blocks fit in a bucket `width` steps wide (0: points)."""
    return min(ROLLUP_LEVELS, (width.bit_length() - 1) // ROLLUP_BITS)


_LO, _HI, _WIDTH = "CAST(:lo AS BIGINT)", "CAST(:hi AS BIGINT)", "CAST(:width AS BIGINT)"


@cache
def _cover_sql(level: int, sqlite: bool) -> str:
    """CTEs ending in `piece(bucket, min_value, max_value, nan_count, point_count, last_step)`:
    an exact cover of the steps [:lo, :hi] of series :sid, cut in buckets of :width steps
    (:last_bucket + 1 of them), by disjoint pieces each inside one bucket: level-`level`
    blocks, and where a bucket edge (or an end of the range) cuts a block, its children that
    fit, and so on down to points.

    Why it is exact: a block is cut by an edge iff it holds an edge step (a bucket's first
    step, or :hi + 1) other than its own first step; those are the `parent` blocks of each
    level. Every point lies in exactly one piece: the coarsest of its enclosing blocks (up to
    `level`) that no edge cuts.
    """
    # (step - lo) / width, not (step - lo) * n / span: steps reach 2**62, and the product overflows.
    def bucket_of(at: _Level) -> str:
        return f"({at.first_step} - {_LO}) / {_WIDTH}"

    def inside(at: _Level) -> str:
        if at.level == 0:
            return f"c.step BETWEEN {_LO} AND {_HI}"
        return (
            f"{at.first_step} >= {_LO} AND {at.last_covered} <= {_HI}"
            f" AND {bucket_of(at)} = ({at.last_covered} - {_LO}) / {_WIDTH}"
        )

    top = _Level(level)
    top_first = f"({_LO} >> {ROLLUP_BITS * level})" if level else _LO
    top_last = f"({_HI} >> {ROLLUP_BITS * level})" if level else _HI
    top_rows = f"SELECT {bucket_of(top)} AS bucket, {top.row}"
    parts = [
        f"{top_rows} FROM {top.source} WHERE c.series_id = :sid AND {top.key_in(top_first, top_last)} AND {inside(top)}"
    ]
    ctes: list[str] = []
    if level:
        ctes.append(
            "bucket(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM bucket WHERE i < CAST(:last_bucket AS BIGINT))"
        )
        ctes.append(f"edge(x) AS (SELECT {_LO} + i * {_WIDTH} FROM bucket UNION SELECT {_HI} + 1)")
    for parent in range(level, 0, -1):
        bits = ROLLUP_BITS * parent
        ctes.append(
            f"parent{parent}(block) AS (SELECT DISTINCT x >> {bits} FROM edge WHERE (x & {(1 << bits) - 1}) <> 0)"
        )
        at = _Level(parent - 1)
        if at.level == 0:
            # One range, clipped to [lo, hi]: given two ranges on step, SQLite would search the
            # index by the wide one and scan the whole series once per cut block.
            first, last = f"(p.block << {ROLLUP_BITS})", f"((p.block << {ROLLUP_BITS}) + {(1 << ROLLUP_BITS) - 1})"
            where = (
                f"c.series_id = :sid AND c.step BETWEEN CASE WHEN {first} > {_LO} THEN {first} ELSE {_LO} END"
                f" AND CASE WHEN {last} < {_HI} THEN {last} ELSE {_HI} END"
            )
        else:
            where = f"c.series_id = :sid AND {at.children_of('p.block')} AND {inside(at)}"
        if sqlite:  # CROSS JOIN: SQLite keeps this order, one index range scan per cut block
            parts.append(f"SELECT {bucket_of(at)} AS bucket, {at.row} FROM parent{parent} p CROSS JOIN {at.source} WHERE {where}")
        else:
            # LATERAL: one index range scan per cut block. As a join, the planner (which guesses
            # 10 rows for a CTE) may hash-join the blocks against every point of the series. The
            # LIMIT (a block has at most that many children) keeps its guess of each scan's rows
            # from the default 0.5 % of the table, which would cost the plan a JIT compile.
            parts.append(
                f"SELECT a.* FROM parent{parent} p CROSS JOIN LATERAL (SELECT {bucket_of(at)} AS bucket,"
                f" {at.row} FROM {at.source} WHERE {where} LIMIT {1 << ROLLUP_BITS}) AS a"
            )
    ctes.append("piece AS (" + " UNION ALL ".join(parts) + ")")
    return ("WITH RECURSIVE " if level else "WITH ") + ", ".join(ctes)


@cache
def _buckets_sql(level: int, sqlite: bool) -> Any:
    """Per bucket of the cover: last step and its value, min, max and the number of NaNs (stored
    as NULL), so a single spike or a single NaN in a million points survives a 100-point read."""
    return text(
        f"{_cover_sql(level, sqlite)}, agg AS ("
        " SELECT bucket, MAX(last_step) AS last_step, MIN(min_value) AS vmin, MAX(max_value) AS vmax,"
        " SUM(nan_count) AS nans FROM piece GROUP BY bucket)"
        # One index seek per bucket. Carrying each block's last value instead measured no faster
        # on PostgreSQL (finding the bucket's last piece costs a sort) and costs every write.
        " SELECT agg.last_step, p.value, agg.vmin, agg.vmax, agg.nans"
        " FROM agg JOIN points p ON p.series_id = :sid AND p.step = agg.last_step ORDER BY agg.last_step"
    )


@cache
def _count_sql(level: int, sqlite: bool) -> Any:
    return text(f"{_cover_sql(level, sqlite)} SELECT COALESCE(SUM(point_count), 0) FROM piece")


def _stored(value: float) -> float | None:
    return None if math.isnan(value) else value


def _loaded(value: float | None) -> float:
    return math.nan if value is None else float(value)


FRAME_CONNECTIONS = 8
"""PostgreSQL connections of the pool that runs `_FRAME_SQL` (beside the engine's)."""


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


class Store:
    def __init__(self, engine: AsyncEngine):
        self.engine = engine
        self.sessions = session_factory(engine)
        self.sqlite = is_sqlite(engine)
        # SQLite has a single writer; serialising here avoids lock-timeout errors.
        self._write_lock = FairLock()
        self._series_ids: dict[tuple[str, float, str], int] = {}
        """(run id, the run's started_at, key) -> series id, for runs this process wrote."""
        self._started_at: dict[str, float] = {}
        """The incarnation (started_at) of each run this process last wrote."""
        self._frames = None if self.sqlite else _frame_pool(engine)

    async def close(self) -> None:
        """Close the connections (the engine's, and the frame statement's pool)."""
        if self._frames is not None:
            await self._frames.close()
        await self.engine.dispose()

    def forget_run(self, run_id: str) -> None:
        """Drop what this process caches about a run (it was deleted)."""
        self._started_at.pop(run_id, None)
        for key in [key for key in self._series_ids if key[0] == run_id]:
            del self._series_ids[key]

    @asynccontextmanager
    async def writing(self) -> AsyncIterator[AsyncSession]:
        if self.sqlite:
            async with self._write_lock.hold(), self.sessions() as session, session.begin():
                yield session
        else:
            async with self.sessions() as session, session.begin():
                yield session

    async def ping(self) -> None:
        async with self.sessions() as session:
            await session.execute(text("SELECT 1"))

    # -- writes -----------------------------------------------------------------

    async def open_run(self, info: RunInfo, now: float, *, writer: str = "") -> tuple[int, str]:
        """Create the run, or resume it (config and status kept), and make this connection
        `writer`'s. A resumed run turns "running" again with the first frame it stores
        (`write_points`): a hello alone, or resends of acked frames, never reopen it.

        Returns the writer's acked seq and the connection's session id (for `FrameRef`).
        Raises RunConflict for a run of another project.
        """
        session_id = uuid.uuid4().hex
        async with self.writing() as session:
            run = await session.get(Run, info.id, with_for_update=not self.sqlite)
            if run is None:
                session.add(
                    Run(
                        id=info.id,
                        name=info.name,
                        project=info.project,
                        group=info.group,
                        config=info.config,
                        tags=list(info.tags),
                        status="running",
                        acked_seq=-1,
                        last_step=None,
                        started_at=now,
                        last_seen_at=now,
                        finished_at=None,
                    )
                )
                await session.flush()
            elif run.project != info.project:
                raise RunConflict(
                    f"run {info.id!r} belongs to project {run.project!r}, not {info.project!r}; "
                    "use another run id"
                )
            else:
                run.last_seen_at = now
            state = await session.get(RunWriter, (info.id, writer))
            if state is None:
                state = RunWriter(run_id=info.id, writer=writer, acked_seq=-1, session=session_id)
                session.add(state)
            state.session = session_id  # supersedes any earlier connection of this writer
            return state.acked_seq, session_id

    async def finish_run(self, run_id: str, status: str, now: float) -> None:
        async with self.writing() as session:
            result = await session.execute(
                update(Run)
                .where(Run.id == run_id)
                .values(status=status, finished_at=now, last_seen_at=now)
                .returning(Run.id)
            )
            if result.first() is None:
                raise UnknownRun(run_id)

    async def write_points(
        self, run_id: str, rows: list[Row], now: float, frame: FrameRef | None = None
    ) -> WriteResult:
        """Store rows idempotently. A websocket `frame` that was acknowledged already is not
        written again; without one (REST) only (series, step) idempotency applies.

        Raises SeqGap or Superseded (nothing written) when the frame cannot be this
        writer's next one over this connection.
        """
        if frame is not None and not self.sqlite:
            fast = await self._write_frame_postgres(run_id, rows, now, frame)
            if fast is not None:
                return fast
        chunks = _chunks(rows, POINTS_PER_TRANSACTION)
        result = WriteResult(stored=True, acked_seq=-1, last_step=None, started_at=math.nan)
        for index, chunk in enumerate(chunks):
            result = await self._write_chunk(run_id, rows, chunk, index == len(chunks) - 1, now, frame)
            if not result.stored:
                return result
        return result

    async def _write_chunk(
        self, run_id: str, rows: list[Row], chunk: list[Row], last: bool, now: float, frame: FrameRef | None
    ) -> WriteResult:
        """One transaction of `write_points`; the last one also moves the writer's acked seq."""
        async with self.writing() as session:
            head = await self._admit(session, run_id, frame)
            acked_seq, last_step = head.acked_seq, head.last_step
            if frame is not None and frame.seq <= acked_seq:
                return WriteResult(stored=False, acked_seq=acked_seq, last_step=last_step, started_at=head.started_at)
            keys = {key for row in chunk for key in row.values}
            series_ids = await self._ensure_series(session, run_id, head.started_at, keys)
            update = None
            if last:
                last_step = _last_step(last_step, rows)
                update = _RunUpdate(run_id, last_step, frame)
                if frame is not None:
                    acked_seq = frame.seq
            store = self._store_sqlite if self.sqlite else self._store_postgres
            await store(session, chunk, series_ids, now, update)
        # Only cache ids once their transaction has committed.
        for key, series_id in series_ids.items():
            self._series_ids[(run_id, head.started_at, key)] = series_id
        self._started_at[run_id] = head.started_at
        return WriteResult(stored=True, acked_seq=acked_seq, last_step=last_step, started_at=head.started_at)

    async def _write_frame_postgres(self, run_id: str, rows: list[Row], now: float, frame: FrameRef) -> WriteResult | None:
        """The frame in one statement (`_FRAME_SQL`), when it fits in one transaction and
        every series it names is known for the incarnation of the run this process last
        wrote; else, or when the run turns out to be another incarnation, None (nothing
        written: the transactional path follows)."""
        started_at = self._started_at.get(run_id)
        if started_at is None or sum(len(row.values) for row in rows) > POINTS_PER_TRANSACTION:
            return None
        series_ids: dict[str, int] = {}
        for row in rows:
            for key in row.values:
                if key not in series_ids:
                    series_id = self._series_ids.get((run_id, started_at, key))
                    if series_id is None:
                        return None
                    series_ids[key] = series_id
        params = _point_arrays(rows, series_ids, now)
        params.update(
            run_id=run_id, writer=frame.writer, session=frame.session, seq=frame.seq,
            started_at=started_at, max_step=_last_step(None, rows), now=now,
        )
        assert self._frames is not None
        if self._frames.closed:
            await self._frames.open()
        async with self._frames.connection() as connection:
            head: Any = await (await connection.execute(_FRAME_SQL, params)).fetchone()
        if head is None:
            raise UnknownRun(run_id)
        last_step, stored_started_at, acked_seq, writer_session = head
        if stored_started_at != started_at:
            self.forget_run(run_id)
            return None
        _check_frame(run_id, frame, acked_seq, writer_session)
        if frame.seq <= acked_seq:
            return WriteResult(stored=False, acked_seq=acked_seq, last_step=last_step, started_at=started_at)
        return WriteResult(stored=True, acked_seq=frame.seq, last_step=_last_step(last_step, rows), started_at=started_at)

    async def reject_frame(self, run_id: str, frame: FrameRef, now: float) -> None:
        """Use up `frame.seq` without storing anything: the frame breaks the protocol, and
        its writer goes on with the next one."""
        async with self.writing() as session:
            head = await self._admit(session, run_id, frame)
            if frame.seq > head.acked_seq:
                await self._advance(session, run_id, frame, last_seen_at=now)

    async def _advance(self, session: AsyncSession, run_id: str, frame: FrameRef, **run_values: Any) -> int:
        """Make `frame.seq` its writer's acked seq (and the run's, if higher), setting
        `run_values` on the run in the same update."""
        connection = await session.connection()
        await connection.execute(_ADVANCE_WRITER_SQL, {"b_run_id": run_id, "b_writer": frame.writer, "b_seq": frame.seq})
        await self._update_run(session, run_id, frame.seq, **run_values)
        return frame.seq

    async def _update_run(self, session: AsyncSession, run_id: str, seq: int | None, **run_values: Any) -> None:
        """Set `run_values` on the run (Core, a statement built once per set of columns),
        and its acked seq to `seq` if that is higher."""
        columns = tuple(sorted(run_values))
        params = {"b_run_id": run_id, "b_seq": seq, **{f"new_{column}": run_values[column] for column in columns}}
        connection = await session.connection()
        await connection.execute(_update_run_sql(columns, seq is not None), params)

    async def _admit(self, session: AsyncSession, run_id: str, frame: FrameRef | None) -> _Head:
        """The run's row, locked (on PostgreSQL; SQLite's single writer lock already
        serialises), with the frame's writer's acked seq; or raises. Every write of a run
        locks its row first: writers of one run, and its deletion, take turns."""
        query = _admit_sql(frame is not None, not self.sqlite)
        connection = await session.connection()
        params = {"run_id": run_id, "writer": None if frame is None else frame.writer}
        head: Any = (await connection.execute(query, params)).first()
        if head is None:
            raise UnknownRun(run_id)
        if frame is None:
            return _Head(-1, head[0], head[1])
        last_step, started_at, acked_seq, writer_session = head
        _check_frame(run_id, frame, acked_seq, writer_session)
        return _Head(acked_seq, last_step, started_at)

    async def _ensure_series(
        self, session: AsyncSession, run_id: str, started_at: float, keys: Iterable[str]
    ) -> dict[str, int]:
        ids: dict[str, int] = {}
        missing: list[str] = []
        for key in keys:
            cached = self._series_ids.get((run_id, started_at, key))
            if cached is None:
                missing.append(key)
            else:
                ids[key] = cached
        if missing:
            insert = sqlite_insert if self.sqlite else pg_insert
            await session.execute(
                insert(Series)
                .values([{"run_id": run_id, "key": key} for key in missing])
                .on_conflict_do_nothing(index_elements=["run_id", "key"])
            )
            found = await session.execute(
                select(Series.key, Series.id).where(
                    Series.run_id == run_id, Series.key.in_(missing)
                )
            )
            ids.update({key: series_id for key, series_id in found})
        return ids

    async def _store_postgres(
        self, session: AsyncSession, rows: list[Row], series_ids: dict[str, int], now: float, update: _RunUpdate | None
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
        await session.execute(_pg_write_points_sql(tail), params)

    async def _store_sqlite(
        self, session: AsyncSession, rows: list[Row], series_ids: dict[str, int], now: float, update: _RunUpdate | None
    ) -> None:
        """Insert the points not stored yet, recompute the rollup blocks they touched, then
        make `update`."""
        if any(row.values for row in rows):
            await self._insert_sqlite_points(session, rows, series_ids, now)
        if update is None:
            return
        if update.frame is None:
            await self._update_run(session, update.run_id, None, last_step=update.last_step, last_seen_at=now)
        else:
            await self._advance(
                session, update.run_id, update.frame, last_step=update.last_step, last_seen_at=now, status="running", finished_at=None
            )

    async def _insert_sqlite_points(
        self, session: AsyncSession, rows: list[Row], series_ids: dict[str, int], now: float
    ) -> None:
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
        await connection.exec_driver_sql(_SQLITE_INSERT_POINTS, params)
        blocks = touched
        for level in range(1, ROLLUP_LEVELS + 1):
            await connection.exec_driver_sql(_sqlite_refresh_sql(level), list(blocks))
            blocks = {(series_id, block >> ROLLUP_BITS) for series_id, block in blocks}

    # -- reads ------------------------------------------------------------------

    async def list_runs(
        self,
        *,
        project: str | None = None,
        group: str | None = None,
        ids: list[str] | None = None,
    ) -> list[Run]:
        query = select(Run).order_by(Run.started_at.desc())
        if project is not None:
            query = query.where(Run.project == project)
        if group is not None:
            query = query.where(Run.group == group)
        if ids is not None:
            query = query.where(Run.id.in_(ids))
        async with self.sessions() as session:
            return list((await session.scalars(query)).all())

    async def get_run(self, run_id: str) -> Run:
        async with self.sessions() as session:
            run = await session.get(Run, run_id)
        if run is None:
            raise UnknownRun(run_id)
        return run

    async def keys(self, run_id: str) -> list[KeyInfo]:
        # Each point lies in exactly one top-level rollup block: their counts add up to the series'.
        count = (
            select(func.coalesce(func.sum(PointRollup.point_count), 0))
            .where(PointRollup.series_id == Series.id, PointRollup.level == ROLLUP_LEVELS)
            .correlate(Series)
            .scalar_subquery()
        )
        last_step = select(func.max(Point.step)).where(Point.series_id == Series.id).correlate(Series).scalar_subquery()
        query = select(Series.key, count, last_step).where(Series.run_id == run_id).order_by(Series.key)
        async with self.sessions() as session:
            if await session.get(Run, run_id) is None:
                raise UnknownRun(run_id)
            result = await session.execute(query)
            return [KeyInfo(key, int(count), last) for key, count, last in result]

    async def rows(
        self, run_id: str, *, after: int, before: int, max_points: int = 200_000, session: AsyncSession | None = None
    ) -> list[Row]:
        """The stored rows of a run with after < step < before, in step order.

        At most `max_points` points; when that cuts a step, the rows end before it. Read in
        `session` when given (inside the caller's transaction).
        """
        query = (
            select(Point.step, Series.key, Point.value)
            .join(Series, Point.series_id == Series.id)
            .where(Series.run_id == run_id, Point.step > after, Point.step < before)
            .order_by(Point.step)
            .limit(max_points + 1)
        )
        if session is not None:
            result = list(await session.execute(query))
        else:
            async with self.sessions() as own:
                result = list(await own.execute(query))
        if len(result) > max_points:
            cut = result[max_points][0]
            result = [point for point in result if point[0] < cut]
        rows: list[Row] = []
        for step, key, value in result:
            if not rows or rows[-1].step != step:
                rows.append(Row(step=step, time=None, values={}))
            rows[-1].values[key] = _loaded(value)
        return rows

    async def latest(self, run_id: str, keys: list[str]) -> dict[str, tuple[int, float]]:
        """The last (step, value) of each of these keys that has points: one index seek per key."""
        inner = aliased(Point)
        last_step = select(func.max(inner.step)).where(inner.series_id == Series.id).correlate(Series).scalar_subquery()
        query = (
            select(Series.key, Point.step, Point.value)
            .join(Point, Point.series_id == Series.id)
            .where(Series.run_id == run_id, Series.key.in_(keys), Point.step == last_step)
        )
        async with self.sessions() as session:
            if await session.get(Run, run_id) is None:
                raise UnknownRun(run_id)
            return {key: (step, _loaded(value)) for key, step, value in await session.execute(query)}

    async def series(
        self,
        run_id: str,
        key: str,
        *,
        max_points: int,
        start: int | None = None,
        end: int | None = None,
    ) -> SeriesData:
        async with self.sessions() as session:
            if await session.get(Run, run_id) is None:
                raise UnknownRun(run_id)
            series_id = await session.scalar(
                select(Series.id).where(Series.run_id == run_id, Series.key == key)
            )
            if series_id is None:
                return SeriesData(key=key, downsampled=False, steps=[], values=[])
            where = [Point.series_id == series_id]
            if start is not None:
                where.append(Point.step >= start)
            if end is not None:
                where.append(Point.step <= end)
            # Two index seeks (one query with both MIN and MAX would scan the range on SQLite).
            lo, hi = (
                await session.execute(
                    select(
                        select(func.min(Point.step)).where(*where).scalar_subquery(),
                        select(func.max(Point.step)).where(*where).scalar_subquery(),
                    )
                )
            ).one()
            if lo is None:
                return SeriesData(key=key, downsampled=False, steps=[], values=[])
            span = {"sid": series_id, "lo": lo, "hi": hi, "width": hi - lo + 1, "last_bucket": 0}
            count = await session.scalar(_count_sql(_read_level(hi - lo + 1), self.sqlite), span)
            if count <= max_points:
                result = await session.execute(
                    select(Point.step, Point.value).where(*where).order_by(Point.step)
                )
                steps, values = [], []
                for step, value in result:
                    steps.append(step)
                    values.append(_loaded(value))
                return SeriesData(key=key, downsampled=False, steps=steps, values=values)
            width = -(-(hi - lo + 1) // max_points)
            result = await session.execute(
                _buckets_sql(_read_level(width), self.sqlite),
                {"sid": series_id, "lo": lo, "hi": hi, "width": width, "last_bucket": (hi - lo) // width},
            )
            return _buckets(key, result)


def _last_step(stored: int | None, rows: list[Row]) -> int | None:
    """The run's last step once `rows` are stored on top of `stored`."""
    steps = [row.step for row in rows]
    return max(steps if stored is None else [stored, *steps], default=None)


def _check_frame(run_id: str, frame: FrameRef, acked_seq: int | None, writer_session: str | None) -> None:
    """Raise unless `frame` may be written (or acked again, if `frame.seq <= acked_seq`) by
    its connection, given what the run's writer row holds (None: no such row)."""
    if writer_session != frame.session:
        raise Superseded(
            f"another connection took over writer {frame.writer!r} of run {run_id!r}; "
            "this one may not write"
        )
    assert acked_seq is not None
    if frame.seq > acked_seq + 1:
        raise SeqGap(
            f"frame seq {frame.seq} skips ahead: this writer's next frame is {acked_seq + 1}; "
            "reconnect and resume from the welcome's acked_seq"
        )


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


def _buckets(key: str, rows: Iterable[tuple[Any, ...]]) -> SeriesData:
    steps: list[int] = []
    values: list[float] = []
    mins: list[float] = []
    maxs: list[float] = []
    for last_step, last_value, vmin, vmax, nans in rows:
        steps.append(int(last_step))
        values.append(_loaded(last_value))
        # NaN orders above +inf (as in PostgreSQL): a bucket holding a NaN has max NaN.
        maxs.append(math.nan if nans else _loaded(vmax))
        mins.append(_loaded(vmin))
    return SeriesData(key=key, downsampled=True, steps=steps, values=values, mins=mins, maxs=maxs)


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
