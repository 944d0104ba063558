"""The one place the alert engine differs between SQLite and PostgreSQL.

`SingleProcess` (SQLite): one server process owns every run, so the detector states in
memory are the truth. They are checkpointed to `rule_states` with every alert change,
else at most once per `checkpoint_s` per run; a state loaded back (after a crash, or a
failed evaluation) resumes after its checkpoint, and the engine replays the stored
points it has not seen.

`Replicated` (PostgreSQL): replicas may take turns with a run (reconnects, a load
balancer, REST writes). Each frame is evaluated in one transaction under the run's
advisory lock against the states read back from the database: a state another replica
has written since this one last read or wrote it replaces the cached one, so no replica
writes over an evaluation it has not seen. States are written with every alert change (in
the transaction of the alert rows), else at most once per `checkpoint_s` per run, as on
SQLite. A state behind the committed points (another replica evaluated them and has not
written yet, or a crash) replays those points first, so every step is evaluated, in order,
and an alert change is never lost or made twice. Writing the states of every frame instead cost
about a quarter of the evaluation's CPU, and rewrote every state row per frame.
Periodic jobs run on one replica at a time.

Both give the engine a `Frame` per evaluation: where to write (`session`), the states to
evaluate from, and whether this evaluation's states are due to be written.
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

__all__ = ["Coordination", "Frame", "Replicated", "SingleProcess", "advisory_key", "for_store"]

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


class Frame(Protocol):
    session: AsyncSession | None
    """The transaction to write in; None: open one only if there is something to write."""

    async def states(self, run_id: str, rules: Sequence[RuleToLoad], cache: Cache) -> tuple[dict[int, Tracked], int | None]:
        """The states to evaluate from (updating `cache`), and the step after which committed
        points may not have been evaluated yet (None: all were)."""

    def due(self, run_id: str, changes: list[Change]) -> bool:
        """Whether this evaluation's dirty states are written now."""


class Coordination(Protocol):
    rules_ttl_s: float
    """How long a cached list of rules stays current (another replica may edit them)."""

    def frame(self, run_id: str) -> AbstractAsyncContextManager[Frame]:
        """One evaluation of a run's rules."""

    def exclusive(self, job: str) -> AbstractAsyncContextManager[bool]:
        """Whether this process runs a periodic `job` now (one replica at a time)."""


def for_store(store: Store, *, checkpoint_s: float = 1.0) -> Coordination:
    return SingleProcess(store, checkpoint_s) if store.sqlite else Replicated(store, checkpoint_s)


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


class SingleProcess:
    rules_ttl_s = math.inf

    def __init__(self, store: Store, checkpoint_s: float):
        self.store = store
        self.checkpoints = _Checkpoints(checkpoint_s)

    @asynccontextmanager
    async def frame(self, run_id: str) -> AsyncIterator[Frame]:
        yield _LocalFrame(self)

    @asynccontextmanager
    async def exclusive(self, job: str) -> AsyncIterator[bool]:
        yield True  # the only process


class _LocalFrame:
    def __init__(self, owner: SingleProcess):
        self.owner = owner
        self.session: AsyncSession | None = None

    async def states(self, run_id: str, rules: Sequence[RuleToLoad], cache: Cache) -> tuple[dict[int, Tracked], int | None]:
        missing = [rule.id for rule, _, _ in rules if (rule.id, run_id) not in cache]
        resume_after: int | None = None
        if missing:
            async with self.owner.store.sessions() as session:
                stored = await repository.load_states(session, run_id, missing)
            for rule, initial, definition in rules:
                if rule.id not in missing:
                    continue
                state = Tracked.load(stored.get(rule.id), dict(initial), definition)
                cache[(rule.id, run_id)] = state
                if state.last_step is not None:
                    resume_after = state.last_step if resume_after is None else min(resume_after, state.last_step)
        return {rule.id: cache[(rule.id, run_id)] for rule, _, _ in rules}, resume_after

    def due(self, run_id: str, changes: list[Change]) -> bool:
        return self.owner.checkpoints.due(run_id, changes)


class Replicated:
    rules_ttl_s = RULES_TTL_S

    def __init__(self, store: Store, checkpoint_s: float = 1.0):
        self.store = store
        self.checkpoints = _Checkpoints(checkpoint_s)

    @asynccontextmanager
    async def frame(self, run_id: str) -> AsyncIterator[Frame]:
        async with self.store.writing() as session:
            await session.execute(_LOCK_RUN_SQL, {"key": advisory_key(run_id)})
            yield _SharedFrame(session, self.checkpoints)

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


class _SharedFrame:
    def __init__(self, session: AsyncSession, checkpoints: _Checkpoints):
        self.session: AsyncSession | None = session
        self.checkpoints = checkpoints

    async def states(self, run_id: str, rules: Sequence[RuleToLoad], cache: Cache) -> tuple[dict[int, Tracked], int | None]:
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
        # Frames can be evaluated out of order here (two replicas, REST writes): every
        # committed step after the states' earliest last one is evaluated first.
        evaluated = [t.last_step for t in tracked.values() if t.last_step is not None]
        return tracked, (min(evaluated) if evaluated else None)

    def due(self, run_id: str, changes: list[Change]) -> bool:
        return self.checkpoints.due(run_id, changes)
