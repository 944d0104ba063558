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
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import aliased

from server.db import is_sqlite, session_factory
from server.errors import RunConflict, SeqGap, Superseded, UnknownRun
from server.models import Point, Run, RunWriter, Series
from trainer_hooks.protocol import Row, RunInfo

__all__ = ["FrameRef", "Store", "WriteResult", "SeriesData", "KeyInfo", "POINTS_PER_TRANSACTION"]

POINTS_PER_TRANSACTION = 20_000
"""Points written per transaction of one frame (a few tens of ms on SQLite)."""


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
# Bucketed downsampling in SQL: per bucket keep the last step and its value,
# plus min, max and the number of NaNs (stored as NULL), so a single spike or
# a single NaN in a million points survives a 100-point read.
_BUCKETS = text(
    "WITH b AS ("
    # (step - lo) / width, not (step - lo) * n / span: steps reach 2**62, and the product overflows.
    "  SELECT step, value, (step - CAST(:lo AS BIGINT)) / CAST(:width AS BIGINT) AS bucket"
    "  FROM points WHERE series_id = :sid AND step >= :lo AND step <= :hi),"
    " agg AS ("
    "  SELECT bucket, MAX(step) AS last_step, MIN(value) AS vmin, MAX(value) AS vmax,"
    "         SUM(CASE WHEN value IS NULL THEN 1 ELSE 0 END) AS nans"
    "  FROM b GROUP BY bucket)"
    " SELECT agg.last_step, p.value, agg.vmin, agg.vmax, agg.nans"
    " FROM agg JOIN points p ON p.series_id = :sid AND p.step = agg.last_step"
    " ORDER BY agg.last_step"
)


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
        self._write_lock = asyncio.Lock()
        self._series_ids: dict[tuple[str, str], int] = {}

    @asynccontextmanager
    async def writing(self) -> AsyncIterator[AsyncSession]:
        if self.sqlite:
            async with self._write_lock, self.sessions() as session, session.begin():
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
        for index, chunk in enumerate(chunks):
            async with self.writing() as session:
                acked_seq, last_step = await self._admit(session, run_id, frame)
                if frame is not None and frame.seq <= acked_seq:
                    return WriteResult(stored=False, acked_seq=acked_seq, last_step=last_step)
                keys = {key for row in chunk for key in row.values}
                series_ids = await self._ensure_series(session, run_id, keys)
                await self._insert_points(session, chunk, series_ids, now)
                if index == len(chunks) - 1:
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
        if self.sqlite:
            params = [
                {"s": series_ids[key], "t": row.step, "v": _stored(value), "w": row.time or now}
                for row in rows
                for key, value in row.values.items()
            ]
            await session.execute(_SQLITE_INSERT_POINT, params)
            return
        sids: list[int] = []
        steps: list[int] = []
        vals: list[float | None] = []
        times: list[float] = []
        for row in rows:
            wall_time = row.time or now
            for key, value in row.values.items():
                sids.append(series_ids[key])
                steps.append(row.step)
                vals.append(_stored(value))
                times.append(wall_time)
        await session.execute(
            _PG_INSERT_POINTS, {"series_ids": sids, "steps": steps, "vals": vals, "times": times}
        )

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
        query = (
            select(Series.key, func.count(Point.step), func.max(Point.step))
            .select_from(Series)
            .outerjoin(Point, Point.series_id == Series.id)
            .where(Series.run_id == run_id)
            .group_by(Series.key)
            .order_by(Series.key)
        )
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
            count, lo, hi = (
                await session.execute(
                    select(func.count(), func.min(Point.step), func.max(Point.step)).where(*where)
                )
            ).one()
            if count <= max_points:
                result = await session.execute(
                    select(Point.step, Point.value).where(*where).order_by(Point.step)
                )
                steps, values = [], []
                for step, value in result:
                    steps.append(step)
                    values.append(_loaded(value))
                return SeriesData(key=key, downsampled=False, steps=steps, values=values)
            result = await session.execute(
                _BUCKETS,
                {"sid": series_id, "lo": lo, "hi": hi, "width": -(-(hi - lo + 1) // max_points)},
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
