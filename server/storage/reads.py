"""Reads of runs, their keys and their points, each in a session the caller gives.

Series reads downsample in SQL: the requested step range is cut into `max_points` buckets,
each answered with its last step and value, its min and max and its NaN count, from the
rollup blocks (server/storage/rollups.py) that cover it exactly. NaN is stored as NULL
(`loaded` turns it back); in a bucket, NaN orders above +Inf, as in PostgreSQL.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from server.errors import UnknownRun
from server.models import Point, PointRollup, Run, Series
from server.storage.rollups import (
    ROLLUP_LEVELS,
    Dialect,
    bucket_width,
    buckets_sql,
    count_sql,
    read_level,
)
from wire import Row

__all__ = [
    "KeyInfo", "SeriesData", "bucketed", "get_run", "keys", "latest", "list_runs", "loaded", "rows", "series",
]


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


def loaded(value: float | None) -> float:
    return math.nan if value is None else float(value)


async def list_runs(
    session: AsyncSession, *, project: str | None, group: str | None, ids: list[str] | None, limit: int | None = None
) -> list[Run]:
    query = select(Run).order_by(Run.started_at.desc())
    if limit is not None:
        query = query.limit(limit)
    if project is not None:
        query = query.where(Run.project == project)
    if group is not None:
        query = query.where(Run.group == group)
    if ids is not None:
        query = query.where(Run.id.in_(ids))
    return list((await session.scalars(query)).all())


async def get_run(session: AsyncSession, run_id: str) -> Run:
    run = await session.get(Run, run_id)
    if run is None:
        raise UnknownRun(run_id)
    return run


def _key_infos(*where: Any) -> Any:
    """Series.run_id, key, point count and last step of the series matching `where`, by run and key."""
    # Each point lies in exactly one top-level rollup block: their counts add up to the series'.
    count = (
        select(func.coalesce(func.sum(PointRollup.point_count), 0))
        .where(PointRollup.series_id == Series.id, PointRollup.level == ROLLUP_LEVELS)
        .correlate(Series)
        .scalar_subquery()
    )
    last_step = select(func.max(Point.step)).where(Point.series_id == Series.id).correlate(Series).scalar_subquery()
    return select(Series.run_id, Series.key, count, last_step).where(*where).order_by(Series.run_id, Series.key)


async def keys(session: AsyncSession, run_id: str) -> list[KeyInfo]:
    await get_run(session, run_id)
    result = await session.execute(_key_infos(Series.run_id == run_id))
    return [KeyInfo(key, int(count), last) for _, key, count, last in result]


async def keys_of_runs(session: AsyncSession, run_ids: Sequence[str]) -> dict[str, list[KeyInfo]]:
    """`keys` of each of these runs in two queries; unknown runs are left out, the others
    in the order asked."""
    known = set(await session.scalars(select(Run.id).where(Run.id.in_(run_ids))))
    found: dict[str, list[KeyInfo]] = {run_id: [] for run_id in dict.fromkeys(run_ids) if run_id in known}
    for run_id, key, count, last in await session.execute(_key_infos(Series.run_id.in_(list(found)))):
        found[run_id].append(KeyInfo(key, int(count), last))
    return found


async def rows(
    session: AsyncSession, run_id: str, *, after: int, before: int, max_points: int, keys: Sequence[str] | None = None
) -> list[Row]:
    """The stored rows of a run with after < step < before, in step order; only `keys` when
    given (a step with none of them is left out). At most `max_points` points; when that
    cuts a step, the rows end before it."""
    where = [Series.run_id == run_id, Point.step > after, Point.step < before]
    if keys is not None:
        where.append(Series.key.in_(list(keys)))
    query = (
        select(Point.step, Series.key, Point.value)
        .join(Series, Point.series_id == Series.id)
        .where(*where)
        .order_by(Point.step)
        .limit(max_points + 1)
    )
    result = list(await session.execute(query))
    if len(result) > max_points:
        cut = result[max_points][0]
        result = [point for point in result if point[0] < cut]
    found: list[Row] = []
    for step, key, value in result:
        if not found or found[-1].step != step:
            found.append(Row(step=step, time=None, values={}))
        found[-1].values[key] = loaded(value)
    return found


async def latest(session: AsyncSession, run_id: str, keys: list[str]) -> dict[str, tuple[int, float]]:
    """The last (step, value) of each of these keys that has points: one index seek per key."""
    inner = aliased(Point)
    last_step = select(func.max(inner.step)).where(inner.series_id == Series.id).correlate(Series).scalar_subquery()
    query = (
        select(Series.key, Point.step, Point.value)
        .join(Point, Point.series_id == Series.id)
        .where(Series.run_id == run_id, Series.key.in_(keys), Point.step == last_step)
    )
    await get_run(session, run_id)
    return {key: (step, loaded(value)) for key, step, value in await session.execute(query)}


async def latest_of_runs(session: AsyncSession, run_ids: list[str], keys: list[str]) -> dict[str, dict[str, tuple[int, float]]]:
    """`latest` for many runs in one query: run id -> key -> (step, value); runs and keys
    without points left out."""
    inner = aliased(Point)
    last_step = select(func.max(inner.step)).where(inner.series_id == Series.id).correlate(Series).scalar_subquery()
    query = (
        select(Series.run_id, Series.key, Point.step, Point.value)
        .join(Point, Point.series_id == Series.id)
        .where(Series.run_id.in_(run_ids), Series.key.in_(keys), Point.step == last_step)
    )
    found: dict[str, dict[str, tuple[int, float]]] = {}
    for run_id, key, step, value in await session.execute(query):
        found.setdefault(run_id, {})[key] = (step, loaded(value))
    return found


async def series(
    session: AsyncSession,
    dialect: Dialect,
    run_id: str,
    key: str,
    *,
    max_points: int,
    start: int | None,
    end: int | None,
) -> SeriesData:
    """Every point of [start, end] if there are at most `max_points`, else at most
    `max_points` buckets of one width (empty ones left out)."""
    await get_run(session, run_id)
    series_id = await session.scalar(select(Series.id).where(Series.run_id == run_id, Series.key == key))
    return await _points(session, dialect, key, series_id, max_points=max_points, start=start, end=end)


async def series_of_runs(
    session: AsyncSession,
    dialect: Dialect,
    run_ids: Sequence[str],
    key: str,
    *,
    max_points: int,
    start: int | None,
    end: int | None,
) -> dict[str, SeriesData]:
    """`series` of one key for each of these runs, in one session: the runs and their series
    found in two queries rather than two per run; unknown runs are left out."""
    known = set(await session.scalars(select(Run.id).where(Run.id.in_(run_ids))))
    found = await session.execute(select(Series.run_id, Series.id).where(Series.run_id.in_(run_ids), Series.key == key))
    series_ids: dict[str, int] = {run_id: series_id for run_id, series_id in found}
    return {
        run_id: await _points(session, dialect, key, series_ids.get(run_id), max_points=max_points, start=start, end=end)
        for run_id in dict.fromkeys(run_ids)
        if run_id in known
    }


async def _points(
    session: AsyncSession,
    dialect: Dialect,
    key: str,
    series_id: int | None,
    *,
    max_points: int,
    start: int | None,
    end: int | None,
) -> SeriesData:
    """The points of one series (`series_id`; None: a run that does not log `key`), as `series` answers."""
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
    count = await session.scalar(count_sql(read_level(hi - lo + 1), dialect), span)
    if count <= max_points:
        result = await session.execute(select(Point.step, Point.value).where(*where).order_by(Point.step))
        steps, values = [], []
        for step, value in result:
            steps.append(step)
            values.append(loaded(value))
        return SeriesData(key=key, downsampled=False, steps=steps, values=values)
    width = bucket_width(hi - lo + 1, max_points)
    result = await session.execute(
        buckets_sql(read_level(width), dialect),
        {"sid": series_id, "lo": lo, "hi": hi, "width": width, "last_bucket": (hi - lo) // width},
    )
    return bucketed(key, result)


def bucketed(key: str, result: Iterable[tuple[Any, ...]]) -> SeriesData:
    """A downsampled series from the rows of `buckets_sql` (last step, last value, min, max, NaNs)."""
    steps: list[int] = []
    values: list[float] = []
    mins: list[float] = []
    maxs: list[float] = []
    for last_step, last_value, vmin, vmax, nans in result:
        steps.append(int(last_step))
        values.append(loaded(last_value))
        # NaN orders above +inf (as in PostgreSQL): a bucket holding a NaN has max NaN.
        maxs.append(math.nan if nans else loaded(vmax))
        mins.append(loaded(vmin))
    return SeriesData(key=key, downsampled=True, steps=steps, values=values, mins=mins, maxs=maxs)
