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
block of 16**L steps (L = 1..ROLLUP_LEVELS; min, max, NaN count, point count, last step). A
block's summary is recomputed from its 16 children in the transaction that gives any of them
a point, so it is a function of the stored points alone: a resent point (not inserted) changes
nothing, and nothing is ever counted twice. A read covers each bucket exactly by the largest
blocks that fit in it, descending to finer levels, and to points, only where a bucket edge
cuts a block (docs/operations.md, "Reads").
"""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import aliased

from server.db import is_sqlite, session_factory
from server.errors import RunConflict, SeqGap, Superseded, UnknownRun
from server.fairlock import FairLock
from server.models import Point, PointRollup, Run, RunWriter, Series
from trainer_hooks.protocol import Row, RunInfo

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


_PG_INSERT_POINTS = text(
    "INSERT INTO points (series_id, step, value, wall_time) "
    "SELECT * FROM unnest(CAST(:series_ids AS integer[]), CAST(:steps AS bigint[]), "
    "CAST(:vals AS double precision[]), CAST(:times AS double precision[])) "
    "ON CONFLICT DO NOTHING"
)
_SQLITE_INSERT_POINT = text(
    "INSERT OR IGNORE INTO points (series_id, step, value, wall_time) VALUES (:s, :t, :v, :w)"
)


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


# Refreshing the rollup blocks a write touched, one level at a time (each from the level below,
# level 1 from the points): every summary is recomputed from its children, never merged with
# what the write sent, so points the write did not insert (already stored) cannot count twice.
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
def _refresh_rollups_sql(level: int, sqlite: bool) -> Any:
    """Recompute the level-`level` blocks named by the parameters from their children: one
    (:s, :b) per execution on SQLite (executemany), arrays :sids, :blocks on PostgreSQL."""
    children = _Level(level - 1)
    if sqlite:
        return text(
            f"{_ROLLUP_INSERT}SELECT c.series_id, {level}, :b, {children.summary} FROM {children.source}"
            f" WHERE c.series_id = :s AND {children.children_of(':b')} GROUP BY c.series_id{_ROLLUP_UPSERT}"
        )
    # LATERAL: one index range scan per block. As a join, the planner (which guesses 10 rows
    # for unnest) may hash-join the blocks against every point of the table instead. The
    # LIMIT (a block has at most that many children) keeps its guess of each scan's rows
    # from the default 0.5 % of the table, which would cost the plan a JIT compile (~300 ms).
    return text(
        f"{_ROLLUP_INSERT}SELECT t.series_id, {level}, t.block, a.min_value, a.max_value, a.nan_count,"
        " a.point_count, a.last_step"
        " FROM unnest(CAST(:sids AS integer[]), CAST(:blocks AS bigint[])) AS t(series_id, block)"
        f" CROSS JOIN LATERAL (SELECT {children.summary} FROM (SELECT * FROM {children.source}"
        f" WHERE c.series_id = t.series_id AND {children.children_of('t.block')} LIMIT {1 << ROLLUP_BITS}) AS c) AS a"
        f" WHERE a.point_count > 0{_ROLLUP_UPSERT}"
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
        else:  # LATERAL and LIMIT: one index range scan per cut block (see _refresh_rollups_sql)
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


class Store:
    def __init__(self, engine: AsyncEngine):
        self.engine = engine
        self.sessions = session_factory(engine)
        self.sqlite = is_sqlite(engine)
        # SQLite has a single writer; serialising here avoids lock-timeout errors.
        self._write_lock = FairLock()
        self._series_ids: dict[tuple[str, str], int] = {}

    def forget_run(self, run_id: str) -> None:
        """Drop what this process caches about a run (it was deleted)."""
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
            state = await session.get(RunWriter, (info.id, writer), with_for_update=not self.sqlite)
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
        chunks = _chunks(rows, POINTS_PER_TRANSACTION)
        result = WriteResult(stored=True, acked_seq=-1, last_step=None)
        for index, chunk in enumerate(chunks):
            last = index == len(chunks) - 1
            try:
                result = await self._write_chunk(run_id, rows, chunk, last, now, frame)
            except IntegrityError:
                # A cached series id of a run deleted (and created again) meanwhile, maybe
                # by another replica: forget what this process knows of the run, once.
                self.forget_run(run_id)
                result = await self._write_chunk(run_id, rows, chunk, last, now, frame)
            if not result.stored:
                return result
        return result

    async def _write_chunk(
        self, run_id: str, rows: list[Row], chunk: list[Row], last: bool, now: float, frame: FrameRef | None
    ) -> WriteResult:
        """One transaction of `write_points`; the last one also moves the writer's acked seq."""
        async with self.writing() as session:
            acked_seq, last_step = await self._admit(session, run_id, frame)
            if frame is not None and frame.seq <= acked_seq:
                return WriteResult(stored=False, acked_seq=acked_seq, last_step=last_step)
            keys = {key for row in chunk for key in row.values}
            series_ids = await self._ensure_series(session, run_id, keys)
            await self._insert_points(session, chunk, series_ids, now)
            if last:
                steps = [row.step for row in rows]
                if steps:
                    last_step = max(steps) if last_step is None else max(last_step, *steps)
                values: dict[str, Any] = {"last_step": last_step, "last_seen_at": now}
                if frame is not None:
                    acked_seq = await self._advance(session, run_id, frame)
                    # A trainer streaming again resumes its run (a REST backfill does not).
                    values.update(status="running", finished_at=None)
                await session.execute(update(Run).where(Run.id == run_id).values(**values))
        # Only cache ids once their transaction has committed.
        for key, series_id in series_ids.items():
            self._series_ids[(run_id, key)] = series_id
        return WriteResult(stored=True, acked_seq=acked_seq, last_step=last_step)

    async def reject_frame(self, run_id: str, frame: FrameRef, now: float) -> None:
        """Use up `frame.seq` without storing anything: the frame breaks the protocol, and
        its writer goes on with the next one."""
        async with self.writing() as session:
            acked_seq, _ = await self._admit(session, run_id, frame)
            if frame.seq > acked_seq:
                await self._advance(session, run_id, frame)
                await session.execute(update(Run).where(Run.id == run_id).values(last_seen_at=now))

    async def _admit(self, session: AsyncSession, run_id: str, frame: FrameRef | None) -> tuple[int, int | None]:
        """(the writer's acked seq, the run's last step), the rows locked; or raises."""
        lock = not self.sqlite  # SQLite: the single writer lock already serialises
        run = await session.execute(
            select(Run.last_step).where(Run.id == run_id).with_for_update() if lock
            else select(Run.last_step).where(Run.id == run_id)
        )
        head = run.first()
        if head is None:
            raise UnknownRun(run_id)
        if frame is None:
            return -1, head[0]
        state = await session.get(RunWriter, (run_id, frame.writer), with_for_update=lock)
        if state is None or state.session != frame.session:
            raise Superseded(
                f"another connection took over writer {frame.writer!r} of run {run_id!r}; "
                "this one may not write"
            )
        if frame.seq > state.acked_seq + 1:
            raise SeqGap(
                f"frame seq {frame.seq} skips ahead: this writer's next frame is {state.acked_seq + 1}; "
                "reconnect and resume from the welcome's acked_seq"
            )
        return state.acked_seq, head[0]

    async def _advance(self, session: AsyncSession, run_id: str, frame: FrameRef) -> int:
        await session.execute(
            update(RunWriter)
            .where(RunWriter.run_id == run_id, RunWriter.writer == frame.writer)
            .values(acked_seq=frame.seq)
        )
        await session.execute(
            update(Run).where(Run.id == run_id, Run.acked_seq < frame.seq).values(acked_seq=frame.seq)
        )
        return frame.seq

    async def _ensure_series(
        self, session: AsyncSession, run_id: str, keys: Iterable[str]
    ) -> dict[str, int]:
        ids: dict[str, int] = {}
        missing: list[str] = []
        for key in keys:
            cached = self._series_ids.get((run_id, key))
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

    async def _insert_points(
        self, session: AsyncSession, rows: list[Row], series_ids: dict[str, int], now: float
    ) -> None:
        if not any(row.values for row in rows):
            return
        # (series, level-1 block) of every point sent: the blocks whose summaries may change.
        touched: set[tuple[int, int]] = set()
        if self.sqlite:
            params = []
            for row in rows:
                wall_time, block = row.time or now, row.step >> ROLLUP_BITS
                for key, value in row.values.items():
                    series_id = series_ids[key]
                    params.append({"s": series_id, "t": row.step, "v": _stored(value), "w": wall_time})
                    touched.add((series_id, block))
            await session.execute(_SQLITE_INSERT_POINT, params)
        else:
            sids: list[int] = []
            steps: list[int] = []
            vals: list[float | None] = []
            times: list[float] = []
            for row in rows:
                wall_time, block = row.time or now, row.step >> ROLLUP_BITS
                for key, value in row.values.items():
                    series_id = series_ids[key]
                    sids.append(series_id)
                    steps.append(row.step)
                    vals.append(_stored(value))
                    times.append(wall_time)
                    touched.add((series_id, block))
            await session.execute(
                _PG_INSERT_POINTS, {"series_ids": sids, "steps": steps, "vals": vals, "times": times}
            )
        await self._refresh_rollups(session, touched)

    async def _refresh_rollups(self, session: AsyncSession, blocks: set[tuple[int, int]]) -> None:
        """Recompute the summaries of these level-1 blocks and of every block above them."""
        for level in range(1, ROLLUP_LEVELS + 1):
            statement = _refresh_rollups_sql(level, self.sqlite)
            if self.sqlite:
                await session.execute(statement, [{"s": series_id, "b": block} for series_id, block in blocks])
            else:
                pairs = sorted(blocks)  # in index order
                await session.execute(
                    statement,
                    {"sids": [series_id for series_id, _ in pairs], "blocks": [block for _, block in pairs]},
                )
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
