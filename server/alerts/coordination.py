"""The one place the alert engine differs between SQLite and PostgreSQL.

`SingleProcess` (SQLite): one server process owns every run, so the detector states in
memory are the truth. They are checkpointed to `rule_states` with every alert change,
else at most once per `checkpoint_s` per run; a state loaded back (after a crash, or a
failed evaluation) resumes after its checkpoint, and the engine replays the stored
points it has not seen.

`Replicated` (PostgreSQL): replicas may take turns with a run (reconnects, a load
balancer, REST writes). A replica evaluates a run's frames from the states it holds, as on
SQLite, without a transaction; states are written with every alert change, else at most
once per `checkpoint_s` per run, in one transaction under the run's advisory lock that
first checks that the stored states are still the ones this replica last read or wrote.
If another replica wrote one since, nothing is written (`Stale`): the engine evaluates the
frame again under the lock from the states read back from the database, replaying the
committed points after them, so no replica writes over an evaluation it has not seen, every
step is evaluated in order, and an alert change is never lost or made twice. Reading the
states back under the lock for every frame instead cost four round trips a frame.
Periodic jobs run on one replica at a time.

Both give the engine an `Evaluation` each time it evaluates a run's rules (a frame's rows,
the silent-run check, a save): the states to evaluate from, whether this evaluation's
states are due to be written, and the transaction to write them in.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from server.alerts import repository
from server.alerts.state import Change, Tracked
from server.models import Rule
from server.storage import Store

__all__ = ["Coordination", "Evaluation", "Replicated", "SingleProcess", "Stale", "advisory_key"]

_LOCK_RUN_SQL = text("SELECT pg_advisory_xact_lock(:key)")

RULES_TTL_S = 2.0
"""On PostgreSQL, how stale a replica's copy of the rules may get (another replica's edits)."""

Cache = dict[tuple[int, str], Tracked]
"""The engine's tracked states by (rule id, run id)."""

RuleToLoad = tuple[Rule, dict[str, object], str]
"""(rule, its detector's initial state, its definition)."""


def advisory_key(name: str) -> int:
    """A PostgreSQL advisory lock key (signed 64-bit) for a run id or a job name."""
    return int.from_bytes(hashlib.sha256(f"keel-alerts\x00{name}".encode()).digest()[:8], "big", signed=True)


class Stale(Exception):
    """Another replica wrote a run's states since this one read them: nothing was written,
    and the frame is evaluated again under the run's lock (`Coordination.evaluation(locked=True)`)."""


class Evaluation(Protocol):
    session: AsyncSession | None
    """The transaction the evaluation holds the run's lock in (replays read in it), if any."""

    async def states(self, run_id: str, rules: Sequence[RuleToLoad], cache: Cache) -> tuple[dict[int, Tracked], int]:
        """The states to evaluate from (updating `cache`), and the step after which committed
        points may not have been evaluated yet (`_resume_after`)."""

    def due(self, run_id: str, changes: list[Change]) -> bool:
        """Whether this evaluation's dirty states are written now."""

    def writing(self, run_id: str, tracked: dict[int, Tracked]) -> AbstractAsyncContextManager[AsyncSession]:
        """The transaction to write the evaluation in; raises Stale (nothing written) if
        the stored states are no longer the ones `tracked` came from."""


class Coordination(Protocol):
    rules_ttl_s: float
    """How long a cached list of rules stays current (another replica may edit them)."""

    def evaluation(self, run_id: str, *, locked: bool = True) -> AbstractAsyncContextManager[Evaluation]:
        """One evaluation of a run's rules: under the run's lock from the stored states
        (`locked`), or from the states this process holds (checked when written)."""

    def exclusive(self, job: str) -> AbstractAsyncContextManager[bool]:
        """Whether this process runs a periodic `job` now (one replica at a time)."""


CHECKPOINT_S = 5.0
"""How often a run's detector states are written when no alert changed: a crash or a replica
taking over the run replays at most this much of its stored points. Under 64 live runs a
checkpoint a second cost as many database round trips as storing the frames."""


class _Checkpoints:
    """When an evaluation's states are written: with every alert change, else at most
    every `checkpoint_s` per run (and on shutdown), so a crash loses at most this much
    detector history, which the engine replays from the stored points."""

    def __init__(self, checkpoint_s: float):
        self.checkpoint_s = checkpoint_s
        self._written: dict[str, float] = {}

    def due(self, run_id: str, changes: list[Change]) -> bool:
        now = time.monotonic()
        if not changes and now - self._written.get(run_id, -math.inf) < self.checkpoint_s:
            return False
        self._written[run_id] = now
        return True


def _resume_after(tracked: dict[int, Tracked]) -> int:
    """The step after which committed points may not have been evaluated yet. Frames can be
    evaluated out of order (two replicas, two writers, REST writes): every committed step
    after the states' earliest last one is evaluated first. States that have evaluated
    nothing are a run nobody has evaluated yet, whose first frames may have been committed
    by another replica still evaluating them: the steps before the frame are evaluated
    first (for a new run, none; at most `engine.FIRST_REPLAY_STEPS` of them). A rule new to
    a run evaluated before starts at its frame."""
    evaluated = [t.last_step for t in tracked.values() if t.last_step is not None]
    return min(evaluated) if evaluated else -1


class SingleProcess:
    rules_ttl_s = math.inf

    def __init__(self, store: Store, checkpoint_s: float = CHECKPOINT_S):
        self.store = store
        self.checkpoints = _Checkpoints(checkpoint_s)

    @asynccontextmanager
    async def evaluation(self, run_id: str, *, locked: bool = True) -> AsyncIterator[Evaluation]:
        yield _LocalEvaluation(self.store, self.checkpoints, check=False)  # the only process: always current

    @asynccontextmanager
    async def exclusive(self, job: str) -> AsyncIterator[bool]:
        yield True  # the only process


class _LocalEvaluation:
    """An evaluation from the states this process holds (loading the ones it lacks), in no
    transaction; `check`: written only if the stored states are still those (PostgreSQL)."""

    session: AsyncSession | None = None

    def __init__(self, store: Store, checkpoints: _Checkpoints, *, check: bool):
        self.store = store
        self.checkpoints = checkpoints
        self.check = check

    async def states(self, run_id: str, rules: Sequence[RuleToLoad], cache: Cache) -> tuple[dict[int, Tracked], int]:
        missing = [
            rule.id for rule, _, definition in rules
            if (cached := cache.get((rule.id, run_id))) is None or cached.definition != definition
        ]
        if missing:
            async with self.store.sessions() as session:
                stored = await repository.load_states(session, run_id, missing)
            for rule, initial, definition in rules:
                if rule.id in missing:
                    cache[(rule.id, run_id)] = Tracked.load(stored.get(rule.id), dict(initial), definition)
        tracked = {rule.id: cache[(rule.id, run_id)] for rule, _, _ in rules}
        return tracked, _resume_after(tracked)

    def due(self, run_id: str, changes: list[Change]) -> bool:
        return self.checkpoints.due(run_id, changes)

    @asynccontextmanager
    async def writing(self, run_id: str, tracked: dict[int, Tracked]) -> AsyncIterator[AsyncSession]:
        async with self.store.writing() as session:
            if self.check:
                await session.execute(_LOCK_RUN_SQL, {"key": advisory_key(run_id)})
                stored = await repository.load_states(session, run_id, list(tracked))
                for rule_id, mine in tracked.items():
                    row = stored.get(rule_id)
                    if (None if row is None else row[1]) != mine.stored_step:
                        raise Stale(run_id)
            yield session


class Replicated:
    rules_ttl_s = RULES_TTL_S

    def __init__(self, store: Store, checkpoint_s: float = CHECKPOINT_S):
        self.store = store
        self.checkpoints = _Checkpoints(checkpoint_s)

    @asynccontextmanager
    async def evaluation(self, run_id: str, *, locked: bool = True) -> AsyncIterator[Evaluation]:
        if not locked:
            yield _LocalEvaluation(self.store, self.checkpoints, check=True)
            return
        async with self.store.writing() as session:
            await session.execute(_LOCK_RUN_SQL, {"key": advisory_key(run_id)})
            yield _SharedEvaluation(session, self.checkpoints)

    @asynccontextmanager
    async def exclusive(self, job: str) -> AsyncIterator[bool]:
        """Whether this replica holds `job` now: a session-level lock on a connection of its
        own, in autocommit, so no failure inside can leave it held in an aborted transaction."""
        async with self.store.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            key = {"key": advisory_key(job)}
            if not await conn.scalar(text("SELECT pg_try_advisory_lock(:key)"), key):
                yield False
                return
            try:
                yield True
            finally:
                try:
                    await conn.execute(text("SELECT pg_advisory_unlock(:key)"), key)
                except Exception:
                    await conn.invalidate()  # closing the connection releases the lock


class _SharedEvaluation:
    def __init__(self, session: AsyncSession, checkpoints: _Checkpoints):
        self.session: AsyncSession | None = session
        self.checkpoints = checkpoints

    async def states(self, run_id: str, rules: Sequence[RuleToLoad], cache: Cache) -> tuple[dict[int, Tracked], int]:
        assert self.session is not None
        stored = await repository.load_states(self.session, run_id, [rule.id for rule, _, _ in rules])
        tracked: dict[int, Tracked] = {}
        for rule, initial, definition in rules:
            mine, row = cache.get((rule.id, run_id)), stored.get(rule.id)
            theirs = None if row is None else row[1]
            if (
                mine is None
                or mine.definition != definition
                # Another replica wrote the state since this one last read or wrote it (the
                # stored copy is then the newest evaluation that counts, even if this one has
                # evaluated further without writing); or a state that counts no steps (the
                # silent rule's), which only the stored copy can tell is current.
                or (row is not None and (theirs is None or theirs != mine.stored_step))
            ):
                mine = Tracked.load(row, dict(initial), definition)
                cache[(rule.id, run_id)] = mine
            tracked[rule.id] = mine
        return tracked, _resume_after(tracked)

    def due(self, run_id: str, changes: list[Change]) -> bool:
        return self.checkpoints.due(run_id, changes)

    @asynccontextmanager
    async def writing(self, run_id: str, tracked: dict[int, Tracked]) -> AsyncIterator[AsyncSession]:
        assert self.session is not None
        yield self.session  # the states were read under the lock this transaction holds
