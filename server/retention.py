"""Deleting runs without stalling ingest.

A run's points go in batches of `DELETE_BATCH`, each its own short transaction (on SQLite
the single writer lock is released between batches, so trainers' frames go in between), and
its step details likewise, `DETAILS_DELETE_BATCH` at a time (each up to 64 KiB).
The last transaction locks the run's row, as every write does first, deletes whatever points
and details a writer added meanwhile, and then the run row, which takes its series,
summaries, writers, alerts and rule states with it (ON DELETE CASCADE; points and step
details have no foreign key).
"""

from __future__ import annotations

import time

from sqlalchemy import delete, select

from server.errors import Conflict, UnknownRun
from server.models import Point, Run, Series, StepDetail
from server.storage import Store

__all__ = ["DELETE_BATCH", "DETAILS_DELETE_BATCH", "delete_run", "prunable_runs"]

DELETE_BATCH = 20_000
"""Points deleted per transaction: tens of milliseconds of write lock at most."""
DETAILS_DELETE_BATCH = 500
"""Step details deleted per transaction (a histogram is a few KB, a step's samples up to 64 KiB)."""


async def delete_run(store: Store, run_id: str, *, force: bool = False) -> int:
    """Delete one run and everything stored with it; the number of points deleted.

    A running run is refused (Conflict) unless `force`: its trainer would go on writing.
    """
    async with store.sessions() as session:
        run = await session.get(Run, run_id)
        if run is None:
            raise UnknownRun(run_id)
        if run.status == "running" and not force:
            raise Conflict(f"run {run_id!r} is running; finish it first, or force the deletion", code="run_running")
        series_ids = list((await session.scalars(select(Series.id).where(Series.run_id == run_id))).all())
    deleted = 0
    for series_id in series_ids:
        while True:
            batch = select(Point.step).where(Point.series_id == series_id).order_by(Point.step).limit(DELETE_BATCH)
            async with store.writing() as session:
                result = await session.execute(
                    delete(Point).where(Point.series_id == series_id, Point.step.in_(batch.scalar_subquery()))
                )
            count = int(getattr(result, "rowcount", 0) or 0)
            deleted += count
            if count < DELETE_BATCH:
                break
    await _delete_details(store, run_id)
    async with store.writing() as session:
        # The lock every write takes first (server/storage/admission.py); on SQLite, whose
        # one writer at a time is the lock, SQLAlchemy leaves FOR UPDATE out.
        await session.execute(select(Run.id).where(Run.id == run_id).with_for_update())
        every_series = select(Series.id).where(Series.run_id == run_id).scalar_subquery()
        result = await session.execute(delete(Point).where(Point.series_id.in_(every_series)))
        deleted += int(getattr(result, "rowcount", 0) or 0)
        await session.execute(delete(StepDetail).where(StepDetail.run_id == run_id))
        await session.execute(delete(Run).where(Run.id == run_id))
    store.forget_run(run_id)
    return deleted


async def _delete_details(store: Store, run_id: str) -> None:
    """The run's step details, each (kind, key) in batches of `DETAILS_DELETE_BATCH` steps."""
    async with store.sessions() as session:
        groups = list(await session.execute(select(StepDetail.kind, StepDetail.key).where(StepDetail.run_id == run_id).distinct()))
    for kind, key in groups:
        of_group = (StepDetail.run_id == run_id, StepDetail.kind == kind, StepDetail.key == key)
        while True:
            batch = select(StepDetail.step).where(*of_group).order_by(StepDetail.step).limit(DETAILS_DELETE_BATCH)
            async with store.writing() as session:
                result = await session.execute(delete(StepDetail).where(*of_group, StepDetail.step.in_(batch.scalar_subquery())))
            if int(getattr(result, "rowcount", 0) or 0) < DETAILS_DELETE_BATCH:
                break


async def prunable_runs(store: Store, *, older_than_s: float, project: str | None = None) -> list[Run]:
    """Runs that ended (finished, failed or killed) and sent nothing for `older_than_s`."""
    query = select(Run).where(Run.status != "running", Run.last_seen_at < time.time() - older_than_s)
    if project is not None:
        query = query.where(Run.project == project)
    async with store.sessions() as session:
        return list((await session.scalars(query.order_by(Run.last_seen_at))).all())
