"""Storage of runs, their series and points (alert tables: server/alerts/repository.py).

`Store` is the one object the rest of the server writes and reads through. Behind it:

- admission.py: which connection may write as a run's writer, which frame is next;
- writes.py: how points are written (an ack always means committed), and `WritePath`, the
  one interface behind which SQLite (sqlite.py) and PostgreSQL (postgres.py) differ,
  chosen once here;
- bounds.py: what a run may grow to (its metric keys, its config's size);
- rollups.py: the rollup scheme, and the SQL that keeps and reads it per database;
- reads.py: runs, keys, rows, and series downsampled from the rollups;
- details.py: step details (histograms, samples, sequences), written with the points of
  their rows, and their reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from server.db import is_sqlite, session_factory
from server.errors import UnknownRun
from server.models import Run, RunWriter
from server.storage import details, reads, writes
from server.storage.admission import FrameRef, Speaker, claim, open_run
from server.storage.details import Distributions, Fit, SequencePairs, StepSamples, StoredDetail
from server.storage.postgres import PostgresWritePath
from server.storage.reads import KeyInfo, SeriesData
from server.storage.rollups import ROLLUP_BITS, ROLLUP_LEVELS
from server.storage.sqlite import SqliteWritePath
from server.storage.writes import POINTS_PER_TRANSACTION, SeriesCache, WritePath, WriteResult
from wire import Row, RunInfo

__all__ = [
    "FrameRef", "Speaker", "Store", "WriteResult", "SeriesData", "KeyInfo",
    "Distributions", "Fit", "SequencePairs", "StepSamples", "StoredDetail",
    "POINTS_PER_TRANSACTION", "ROLLUP_BITS", "ROLLUP_LEVELS",
]


class Store:
    def __init__(
        self, engine: AsyncEngine, *, max_keys_per_run: int = 10_000, max_config_bytes: int = 1024 * 1024
    ):
        """`max_keys_per_run`, `max_config_bytes`: what a run may grow to (server/storage/bounds.py)."""
        self.engine = engine
        self.max_keys_per_run = max_keys_per_run
        self.max_config_bytes = max_config_bytes
        self.sessions = session_factory(engine)
        self._writes: WritePath = (
            SqliteWritePath(self.sessions) if is_sqlite(engine) else PostgresWritePath(engine, self.sessions)
        )
        self.shared = self._writes.shared
        """Whether other server processes may share the database (`WritePath.shared`)."""
        self.insert = self._writes.insert
        """This database's INSERT with ON CONFLICT, for upserts (`WritePath.insert`)."""
        self._series = SeriesCache()

    async def close(self) -> None:
        """Close the connections (the engine's, and those the write path holds beside it)."""
        await self._writes.close()
        await self.engine.dispose()

    def forget_run(self, run_id: str) -> None:
        """Drop what this process caches about a run (it was deleted)."""
        self._series.forget(run_id)

    def writing(self) -> AbstractAsyncContextManager[AsyncSession]:
        """A write transaction (on SQLite, one at a time, taken fairly between clients)."""
        return self._writes.transaction()

    async def ping(self) -> None:
        async with self.sessions() as session:
            await session.execute(text("SELECT 1"))

    # -- writes -----------------------------------------------------------------

    async def open_run(self, info: RunInfo, now: float, *, writer: str = "", speaker: Speaker | None = None) -> tuple[int, str]:
        """Create the run, or resume it (config and status kept), and make this connection
        `writer`'s. A resumed run turns "running" again with the first frame it stores
        (`write_points`): a hello alone, or resends of acked frames, never reopen it.

        Returns the writer's acked seq and the connection's session id (for `FrameRef`).
        Raises RunConflict for a run of another project, TooLarge (nothing stored) for a
        new run whose config is over `max_config_bytes`, Forbidden (nothing changed) for a
        run of another token's name.
        """
        async with self.writing() as session:
            return await open_run(session, info, now, writer, self.max_config_bytes, speaker)

    async def check_owner(self, run_id: str, speaker: Speaker | None) -> None:
        """Raise UnknownRun, or Forbidden unless `speaker` may write to the run (a run without
        an owner is claimed: admission.claim). A REST write asks this first."""
        if speaker is None:
            return
        async with self.writing() as session:
            run = await session.get(Run, run_id, with_for_update=True)
            if run is None:
                raise UnknownRun(run_id)
            claim(run, speaker)

    async def finish_run(self, run_id: str, status: str, now: float, *, writer: str = "", last_seq: int | None = None) -> int:
        """End the run; with `last_seq` (the seq of `writer`'s last frame, from a trainer that
        gave up waiting for acks), the frames of it not stored are counted on the run: how
        many, returned."""
        async with self.writing() as session:
            unsent = 0
            if last_seq is not None:
                stored = await session.get(RunWriter, (run_id, writer))
                unsent = max(0, last_seq - (stored.acked_seq if stored is not None else -1))
            await writes.finish_run(session, run_id, status, now, unsent)
            return unsent

    async def set_actions(self, run_id: str, actions: dict[str, str] | None) -> None:
        """The command actions the run's trainer takes (None: none of its trainers listens)."""
        async with self.writing() as session:
            await writes.set_actions(session, run_id, actions)

    async def update_config(self, run_id: str, config: dict[str, Any]) -> Run:
        """Set the top-level keys of `config` in the run's config, keeping its other keys;
        the run as stored after. Setting the same keys again changes nothing (idempotent).
        Raises UnknownRun, or TooLarge (nothing changed) when the merged config would be
        over `max_config_bytes` as JSON."""
        async with self.writing() as session:
            return await writes.update_config(session, run_id, config, self.max_config_bytes)

    async def write_points(
        self, run_id: str, rows: list[Row], now: float, frame: FrameRef | None = None
    ) -> WriteResult:
        """Store rows idempotently. A websocket `frame` that was acknowledged already is not
        written again; without one (REST) only (series, step) idempotency applies.

        Raises SeqGap or Superseded (nothing written) when the frame cannot be this
        writer's next one over this connection, TooLarge (nothing written) when its new
        keys would give the run more than `max_keys_per_run`.
        """
        return await writes.write_points(self._writes, self._series, run_id, rows, now, frame, self.max_keys_per_run)

    async def reject_frame(self, run_id: str, frame: FrameRef, now: float) -> None:
        """Use up `frame.seq` without storing anything: the frame breaks the protocol, and
        its writer goes on with the next one."""
        await writes.reject_frame(self._writes, run_id, frame, now)

    # -- reads ------------------------------------------------------------------

    async def list_runs(
        self, *, project: str | None = None, group: str | None = None, ids: list[str] | None = None, limit: int | None = None
    ) -> list[Run]:
        """The runs, newest first (the `limit` newest when given)."""
        async with self.sessions() as session:
            return await reads.list_runs(session, project=project, group=group, ids=ids, limit=limit)

    async def get_run(self, run_id: str) -> Run:
        async with self.sessions() as session:
            return await reads.get_run(session, run_id)

    async def keys(self, run_id: str) -> list[KeyInfo]:
        async with self.sessions() as session:
            return await reads.keys(session, run_id)

    async def keys_of_runs(self, run_ids: Sequence[str]) -> dict[str, list[KeyInfo]]:
        """`keys` of each of these runs (unknown runs left out), in one session."""
        async with self.sessions() as session:
            return await reads.keys_of_runs(session, run_ids)

    async def rows(
        self,
        run_id: str,
        *,
        after: int,
        before: int,
        max_points: int = 200_000,
        keys: Sequence[str] | None = None,
        session: AsyncSession | None = None,
    ) -> list[Row]:
        """The stored rows of a run with after < step < before, in step order (at most
        `max_points` points, whole steps), only `keys` when given. Read in `session` when
        given (inside the caller's transaction)."""
        if session is not None:
            return await reads.rows(session, run_id, after=after, before=before, max_points=max_points, keys=keys)
        async with self.sessions() as own:
            return await reads.rows(own, run_id, after=after, before=before, max_points=max_points, keys=keys)

    async def latest(self, run_id: str, keys: list[str]) -> dict[str, tuple[int, float]]:
        """The last (step, value) of each of these keys that has points."""
        async with self.sessions() as session:
            return await reads.latest(session, run_id, keys)

    async def latest_of_runs(self, run_ids: list[str], keys: list[str]) -> dict[str, dict[str, tuple[int, float]]]:
        """The last (step, value) of each of these keys, for each of these runs, in one read."""
        async with self.sessions() as session:
            return await reads.latest_of_runs(session, run_ids, keys)

    async def series(
        self, run_id: str, key: str, *, max_points: int, start: int | None = None, end: int | None = None
    ) -> SeriesData:
        """The series' points in [start, end], downsampled to at most `max_points` buckets."""
        async with self.sessions() as session:
            return await reads.series(
                session, self._writes.dialect, run_id, key, max_points=max_points, start=start, end=end
            )

    async def series_of_runs(
        self, run_ids: Sequence[str], key: str, *, max_points: int, start: int | None = None, end: int | None = None
    ) -> dict[str, SeriesData]:
        """`series` of one key for each of these runs (unknown runs left out), in one session."""
        async with self.sessions() as session:
            return await reads.series_of_runs(
                session, self._writes.dialect, run_ids, key, max_points=max_points, start=start, end=end
            )

    # -- step details -------------------------------------------------------------------

    async def distributions(
        self, run_id: str, key: str, *, start: int | None = None, end: int | None = None, max_steps: int = 500
    ) -> Distributions:
        """The histograms of `key` at steps start..end, in at most `max_steps` entries (buckets
        of consecutive steps, counts summed, when more steps have one); steps whose edges
        differ from the newest step's are left out (counted in `left_out`)."""
        async with self.sessions() as session:
            return await details.distributions(session, run_id, key, start=start, end=end, max_steps=max_steps)

    async def samples(self, run_id: str, step: int | None = None) -> StepSamples:
        """The samples of the latest step <= `step` that has some (the run's latest without it)."""
        async with self.sessions() as session:
            return await details.samples(session, run_id, step)

    async def sample_steps(self, run_id: str) -> list[int]:
        """The steps that have samples, ascending."""
        async with self.sessions() as session:
            return await details.sample_steps(session, run_id)

    async def sequences(
        self, run_id: str, *, start: int | None = None, end: int | None = None, max_points: int = 5000
    ) -> SequencePairs:
        """The (length, Σℓ) pairs of steps start..end (an even subsample of `max_points` when
        there are more) and the least-squares line through the finite ones."""
        async with self.sessions() as session:
            return await details.sequences(session, run_id, start=start, end=end, max_points=max_points)

    async def stored_details(
        self, run_id: str, *, after: tuple[str, str, int] | None = None, limit: int = 100
    ) -> list[StoredDetail]:
        """Up to `limit` of the run's stored details as the wire carried them, in (kind, key,
        step) order, after `after` (a previous page's last `StoredDetail.cursor`)."""
        async with self.sessions() as session:
            return await details.stored_details(session, run_id, after=after, limit=limit)
