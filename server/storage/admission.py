"""Frame admission: which connection may write as a run's writer, and which frame is next.

Frames are numbered per writer (`run_writers`): a writer's next frame must carry
`acked_seq + 1` (a later one is a gap: refused, never acked), a seq at or below
`acked_seq` is a resend (acked again, nothing written), and only the connection that
said hello last for a writer (`open_run`) may write as it (an older one is superseded).

Every write of a run locks the run's row first (`admit`): writers of one run, and its
deletion (`retention.delete_run` takes the same lock), take turns. SQLite renders no FOR
UPDATE; its single writer (server/storage/sqlite.py) already serialises every write.

PostgreSQL's one-statement frame write (`postgres.FRAME_SQL`) makes the same decision in
SQL and hands the run's row back to `check_frame`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import BigInteger, bindparam, case, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from server.errors import Forbidden, RunConflict, SeqGap, Superseded, UnknownRun
from server.models import Run, RunWriter
from server.storage.bounds import check_config
from wire import RunInfo

__all__ = ["FrameRef", "Head", "Speaker", "admit", "advance", "check_frame", "claim", "open_run", "update_run"]


@dataclass(frozen=True)
class Speaker:
    """Who asks to write to a run (auth on): the name of the token presented, and whether it
    is an admin's. Tokens of one name are one owner: the ranks of a job sharing a token, and
    a rotated token (a new one of the same name, the old revoked), speak for the same runs."""

    name: str
    admin: bool = False


def claim(run: Run, speaker: Speaker | None) -> None:
    """Raise Forbidden unless `speaker` may write to `run`: no speaker (auth off), an admin,
    the run's owner; a run without an owner (made with auth off, or before owners) is
    claimed by the first token that writes to it."""
    if speaker is None or speaker.admin:
        return
    if run.owner is None:
        run.owner = speaker.name
    elif run.owner != speaker.name:
        raise Forbidden(f"run {run.id!r} belongs to another token's runs; this token may not write to it, listen to its commands or answer them")


@dataclass(frozen=True)
class FrameRef:
    """Which writer's frame a write is, over which connection (websocket ingest)."""

    writer: str
    session: str
    """The id `open_run` gave the connection."""
    seq: int


@dataclass(frozen=True)
class Head:
    """What a write reads of its run under the run's lock."""

    acked_seq: int
    """The frame's writer's (-1 for a REST write)."""
    last_step: int | None
    started_at: float
    """Tells incarnations of a run id apart (deleted and created again)."""


async def open_run(
    session: AsyncSession, info: RunInfo, now: float, writer: str, max_config_bytes: int, speaker: Speaker | None = None
) -> tuple[int, str]:
    """Create the run, or resume it (config and status kept), and make a new connection
    `writer`'s, superseding any earlier one. Returns the writer's acked seq and the
    connection's session id (for `FrameRef`). Raises RunConflict for a run of another
    project, TooLarge for a new run whose config is over `max_config_bytes` as JSON (a
    resumed run keeps its stored config: the hello's is not stored, so not checked),
    Forbidden for a run of another token's name (`claim`). A new run is `speaker`'s.
    """
    session_id = uuid.uuid4().hex
    run = await session.get(Run, info.id, with_for_update=True)
    if run is None:
        check_config(info.id, info.config, max_config_bytes, "the hello's run.config")
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
                owner=None if speaker is None else speaker.name,
            )
        )
        await session.flush()
    elif run.project != info.project:
        raise RunConflict(
            f"run {info.id!r} belongs to project {run.project!r}, not {info.project!r}; "
            "use another run id"
        )
    else:
        claim(run, speaker)
        run.last_seen_at = now
    state = await session.get(RunWriter, (info.id, writer))
    if state is None:
        state = RunWriter(run_id=info.id, writer=writer, acked_seq=-1, session=session_id)
        session.add(state)
    state.session = session_id  # supersedes any earlier connection of this writer
    return state.acked_seq, session_id


@cache
def _admit_sql(with_writer: bool) -> Any:
    """The run's row, locked (and the frame's writer's), built once: a statement built per
    frame costs more Python than the database takes to answer it."""
    query = select(Run.last_step, Run.started_at).where(Run.id == bindparam("run_id"))
    if with_writer:
        on = (RunWriter.run_id == Run.id) & (RunWriter.writer == bindparam("writer"))
        query = query.add_columns(RunWriter.acked_seq, RunWriter.session).outerjoin(RunWriter, on)
    return query.with_for_update(of=Run)


async def admit(session: AsyncSession, run_id: str, frame: FrameRef | None) -> Head:
    """The run's row, locked, with the frame's writer's acked seq (REST writes have no
    frame); or raises UnknownRun, Superseded or SeqGap."""
    connection = await session.connection()
    params = {"run_id": run_id, "writer": None if frame is None else frame.writer}
    head: Any = (await connection.execute(_admit_sql(frame is not None), params)).first()
    if head is None:
        raise UnknownRun(run_id)
    if frame is None:
        return Head(-1, head[0], head[1])
    last_step, started_at, acked_seq, writer_session = head
    check_frame(run_id, frame, acked_seq, writer_session)
    return Head(acked_seq, last_step, started_at)


def check_frame(run_id: str, frame: FrameRef, acked_seq: int | None, writer_session: str | None) -> None:
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


_ADVANCE_WRITER_SQL = (
    update(RunWriter)
    .where(RunWriter.run_id == bindparam("b_run_id"), RunWriter.writer == bindparam("b_writer"))
    .values(acked_seq=bindparam("b_seq"))
)


async def advance(session: AsyncSession, run_id: str, frame: FrameRef, **run_values: Any) -> None:
    """Make `frame.seq` its writer's acked seq (and the run's, if higher), setting
    `run_values` on the run in the same update."""
    connection = await session.connection()
    await connection.execute(_ADVANCE_WRITER_SQL, {"b_run_id": run_id, "b_writer": frame.writer, "b_seq": frame.seq})
    await update_run(session, run_id, frame.seq, **run_values)


@cache
def _update_run_sql(columns: tuple[str, ...], advance: bool) -> Any:
    """UPDATE runs SET `columns` (bound as `new_<column>`), and the run's acked seq to the
    frame's (`b_seq`) if higher (`advance`). (An UPDATE may not bind a column's own name.)"""
    values: dict[str, Any] = {column: bindparam(f"new_{column}") for column in columns}
    if advance:
        seq = bindparam("b_seq", type_=BigInteger)
        values["acked_seq"] = case((Run.acked_seq < seq, seq), else_=Run.acked_seq)
    return update(Run).where(Run.id == bindparam("b_run_id")).values(**values)


async def update_run(session: AsyncSession, run_id: str, seq: int | None, **run_values: Any) -> None:
    """Set `run_values` on the run (Core, a statement built once per set of columns),
    and its acked seq to `seq` if that is higher."""
    columns = tuple(sorted(run_values))
    params = {"b_run_id": run_id, "b_seq": seq, **{f"new_{column}": run_values[column] for column in columns}}
    connection = await session.connection()
    await connection.execute(_update_run_sql(columns, seq is not None), params)
