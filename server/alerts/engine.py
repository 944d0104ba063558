"""The alert engine: evaluates rules on every committed step, incrementally.

Registered as an after-commit listener of the ingest path. Per run, frames are
evaluated in order under a lock; each (rule, run) keeps detector and lifecycle
state in memory and in `rule_states`, written in the same transaction as the
alert changes and the webhook outbox rows they cause. Steps at or below a
state's last evaluated step are skipped, so resent data is not evaluated twice.

On SQLite (one server process) state is checkpointed at most once a second
without alert changes; when it is loaded back (after a crash, or a failed
evaluation) the engine first replays the stored points after the checkpoint, so
no committed step goes unevaluated. On PostgreSQL, where replicas may take turns
with a run, every frame is evaluated in one transaction under the run's advisory
lock against the states read back from the database (`_evaluate_shared`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import or_, select, text
from sqlalchemy.exc import IntegrityError

from server.alerts import repository
from server.alerts.detectors import Detector
from server.alerts.lifecycle import Lifecycle, Phase, Transition
from server.alerts.rules import build_detector
from server.live import LiveHub
from server.models import Alert, Rule, Run
from server.storage import Store
from trainer_hooks.protocol import Row

log = logging.getLogger("keel.alerts")


def fingerprint(rule_id: int, run_id: str) -> str:
    return hashlib.sha256(f"{rule_id}\x00{run_id}".encode()).hexdigest()[:16]


RULES_TTL_S = 2.0
"""On PostgreSQL, how stale a replica's copy of the rules may get (another replica's edits)."""


def _signature(rule: Rule) -> tuple[Any, ...]:
    return (
        rule.id, rule.name, rule.project, rule.group, rule.run_id, rule.metric, rule.detector,
        json.dumps(rule.params, sort_keys=True), rule.severity, rule.for_steps, rule.keep_firing_for, rule.enabled,
    )


def definition(rule: Rule) -> str:
    """What a rule's detector state depends on: its detector, metric and parameters."""
    text = json.dumps([rule.detector, rule.metric, rule.params], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def advisory_key(name: str) -> int:
    """A PostgreSQL advisory lock key (signed 64-bit) for a run id or a job name."""
    return int.from_bytes(hashlib.sha256(f"keel-alerts\x00{name}".encode()).digest()[:8], "big", signed=True)


@dataclass
class _Tracked:
    """In-memory mirror of one rule_states row."""

    detector_state: dict[str, Any]
    lifecycle: Lifecycle
    last_step: int | None
    alert_id: int | None = None
    dirty: bool = False
    definition: str = ""
    """`definition(rule)` of the rule this state was computed for."""

    def to_json(self) -> dict[str, Any]:
        return {
            "detector": self.detector_state,
            "definition": self.definition,
            "lifecycle": self.lifecycle.to_json(),
            "alert_id": self.alert_id,
        }

    @classmethod
    def load(
        cls, row: tuple[dict[str, Any], int | None] | None, initial: dict[str, Any], definition: str
    ) -> _Tracked:
        """From a rule_states row, or fresh with the detector's initial state. The detector
        state of another definition of the rule (it was edited meanwhile, and a replica that
        had not seen the edit yet wrote it) is replaced by `initial`; the lifecycle stays, so
        an open alert still resolves."""
        if row is None:
            return cls(initial, Lifecycle(), None, definition=definition)
        data, last_step = row
        detector = data["detector"] if data.get("definition", definition) == definition else initial
        lifecycle = Lifecycle.from_json(data["lifecycle"])
        return cls(detector, lifecycle, last_step, data.get("alert_id"), definition=definition)


@dataclass
class _Change:
    rule: Rule
    transition: Transition
    step: int
    value: float
    message: str
    tracked: _Tracked
    metric: str | None = None


@dataclass
class _RunContext:
    run: Run
    rules: list[tuple[Rule, Detector]] = field(default_factory=list)
    definitions: dict[int, str] = field(default_factory=dict)
    """`definition(rule)` per rule id, computed once per rules version (not per frame)."""
    rules_version: int = -1


class AlertEngine:
    def __init__(
        self,
        store: Store,
        hub: LiveHub,
        *,
        base_url: str,
        on_outbox: Callable[[], None] = lambda: None,
        checkpoint_s: float = 1.0,
    ):
        self.store = store
        self.hub = hub
        self.base_url = base_url
        self.on_outbox = on_outbox
        self.checkpoint_s = checkpoint_s
        """Detector state is written with every alert change, else at most this often per run
        (and on shutdown), so a crash loses at most this much detector history."""
        self._checkpointed: dict[str, float] = {}
        self.rules_version = 0
        self._rules: list[Rule] | None = None
        self._rules_loaded_at = 0.0
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._runs: dict[str, _RunContext] = {}
        self._tracked: dict[tuple[int, str], _Tracked] = {}
        self._known_projects: set[str] = set()
        self._install_lock = asyncio.Lock()

    def rules_changed(self) -> None:
        """Call after any rule CRUD: contexts rebuild their rule lists lazily."""
        self.rules_version += 1
        self._rules = None

    def forget_rule(self, rule_id: int) -> None:
        for key in [k for k in self._tracked if k[0] == rule_id]:
            del self._tracked[key]
        self.rules_changed()

    async def on_points(self, run_id: str, rows: list[Row]) -> None:
        async with self._locks[run_id]:
            try:
                await self._evaluate(run_id, sorted(rows, key=lambda row: row.step))
            except BaseException as exc:
                # Failed or cancelled: the cached state may be ahead of what was committed.
                # Drop it so the next frame reloads what was (and replays the steps).
                self._forget(run_id)
                if isinstance(exc, IntegrityError):
                    self.rules_changed()  # e.g. a rule deleted by another replica: re-read now
                raise

    def _forget(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
        for key in [k for k in self._tracked if k[1] == run_id]:
            del self._tracked[key]

    async def _context(self, run_id: str) -> _RunContext:
        context = self._runs.get(run_id)
        if context is None:
            run = await self.store.get_run(run_id)
            await self._ensure_project(run.project)
            context = _RunContext(run=run)
            self._runs[run_id] = context
        rules = await self._current_rules()
        if context.rules_version != self.rules_version:
            context.rules, context.definitions = [], {}
            for rule in rules:
                if rule.enabled and repository.rule_applies(rule, context.run) and rule.detector != "silent":
                    try:
                        context.rules.append((rule, build_detector(rule.detector, rule.metric, rule.params)))
                        context.definitions[rule.id] = definition(rule)
                    except ValueError:
                        log.exception("rule %s is invalid; skipped", rule.id)
            context.rules_version = self.rules_version
        return context

    async def _current_rules(self) -> list[Rule]:
        """The rules, cached. On PostgreSQL another replica may have edited them: the cache
        is read again after RULES_TTL_S, and a difference counts as a change here."""
        expired = not self.store.sqlite and time.monotonic() - self._rules_loaded_at > RULES_TTL_S
        if self._rules is None or expired:
            cached = self._rules
            while True:  # a rule edited here during the read makes it stale: read again
                version = self.rules_version
                rules = await repository.load_rules(self.store.sessions)
                if version == self.rules_version:
                    break
                cached = None
            current = {_signature(r) for r in rules}
            for rule in cached or ():
                if _signature(rule) not in current:  # edited or deleted elsewhere: drop its states
                    self.forget_rule(rule.id)
            if cached is None or current != {_signature(r) for r in cached}:
                self.rules_version += 1
            self._rules, self._rules_loaded_at = rules, time.monotonic()
        return self._rules

    async def _ensure_project(self, project: str) -> None:
        async with self._install_lock:
            if project in self._known_projects:
                return
            if await repository.install_project(self.store, project, time.time()):
                self.rules_changed()
            self._known_projects.add(project)

    async def _tracked_for(self, context: _RunContext) -> tuple[dict[int, _Tracked], int | None]:
        """The run's states, and the earliest last step among those just loaded from the database."""
        run_id = context.run.id
        missing = [rule.id for rule, _ in context.rules if (rule.id, run_id) not in self._tracked]
        resume_after: int | None = None
        if missing:
            stored = await repository.load_states(self.store.sessions, run_id, missing)
            for rule, detector in context.rules:
                if rule.id not in missing:
                    continue
                state = _Tracked.load(stored.get(rule.id), detector.initial_state(), context.definitions[rule.id])
                self._tracked[(rule.id, run_id)] = state
                if state.last_step is not None:
                    resume_after = state.last_step if resume_after is None else min(resume_after, state.last_step)
        return {rule.id: self._tracked[(rule.id, run_id)] for rule, _ in context.rules}, resume_after

    async def _evaluate(self, run_id: str, rows: list[Row]) -> None:
        context = await self._context(run_id)
        if not context.rules:
            return
        if not self.store.sqlite:
            await self._evaluate_shared(context, rows)
            return
        tracked, resume_after = await self._tracked_for(context)
        if resume_after is not None and rows and rows[0].step > resume_after + 1:
            # Committed steps the loaded checkpoint has not seen: evaluate them first.
            rows = await self.store.rows(run_id, after=resume_after, before=rows[0].step) + rows
        changes = self._run_rules(context, tracked, rows)
        dirty = [(rule_id, t) for rule_id, t in tracked.items() if t.dirty]
        now = time.monotonic()
        if not dirty or (not changes and now - self._checkpointed.get(run_id, 0.0) < self.checkpoint_s):
            return
        self._checkpointed[run_id] = now
        alerts = await repository.apply(
            self.store, context.run, changes, dirty, fingerprint, self.base_url
        )
        for _, t in dirty:
            t.dirty = False
        self._publish(alerts)

    async def _evaluate_shared(self, context: _RunContext, rows: list[Row]) -> None:
        """PostgreSQL, where replicas may take turns with a run (reconnects, REST writes).

        One transaction per frame, under the run's advisory lock: the states are read back,
        those another replica has advanced replace the cached ones, committed steps the
        states have not seen are evaluated before the frame's, and the new states are
        written with the frame's alert changes, so the database always holds the latest
        evaluation.
        """
        run_id = context.run.id
        async with self.store.writing() as session:
            await session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": advisory_key(run_id)})
            stored = await repository.load_states_in(session, run_id, [rule.id for rule, _ in context.rules])
            tracked: dict[int, _Tracked] = {}
            for rule, detector in context.rules:
                mine, row = self._tracked.get((rule.id, run_id)), stored.get(rule.id)
                theirs, current = (None if row is None else row[1]), context.definitions[rule.id]
                if (
                    mine is None
                    or mine.definition != current
                    or (theirs is not None and (mine.last_step is None or theirs > mine.last_step))
                ):
                    mine = _Tracked.load(row, detector.initial_state(), current)
                    self._tracked[(rule.id, run_id)] = mine
                tracked[rule.id] = mine
            # Frames can be evaluated out of order here (two replicas, REST writes): evaluate
            # every committed step after the states' last one first.
            evaluated = [t.last_step for t in tracked.values() if t.last_step is not None]
            if evaluated and rows and rows[0].step > min(evaluated) + 1:
                rows = await self.store.rows(run_id, after=min(evaluated), before=rows[0].step, session=session) + rows
            changes = self._run_rules(context, tracked, rows)
            dirty = [(rule_id, t) for rule_id, t in tracked.items() if t.dirty]
            if not dirty:
                return
            alerts = await repository.apply(self.store, context.run, changes, dirty, fingerprint, self.base_url, session=session)
        for _, t in dirty:
            t.dirty = False
        self._publish(alerts)

    def _run_rules(self, context: _RunContext, tracked: dict[int, _Tracked], rows: list[Row]) -> list[_Change]:
        """Feed the rows (ascending) to every rule's detector and lifecycle; the transitions."""
        changes: list[_Change] = []
        for rule, detector in context.rules:
            state = tracked[rule.id]
            for row in rows:
                if state.last_step is not None and row.step <= state.last_step:
                    continue
                signal = detector.update(state.detector_state, row.step, row.values)
                state.last_step = row.step
                state.dirty = True
                if signal is None:
                    continue
                for transition in state.lifecycle.step(
                    signal.active, row.step, for_steps=rule.for_steps, keep_firing_for=rule.keep_firing_for
                ):
                    changes.append(_Change(rule, transition, row.step, signal.value, signal.message, state, signal.metric))
        return changes

    async def flush(self) -> None:
        """Write every run's unsaved detector state (graceful shutdown; on PostgreSQL every
        evaluation has written its state already)."""
        if not self.store.sqlite:
            return
        for run_id, context in list(self._runs.items()):
            async with self._locks[run_id]:
                dirty = [
                    (rule.id, self._tracked[(rule.id, run_id)])
                    for rule, _ in context.rules
                    if (rule.id, run_id) in self._tracked and self._tracked[(rule.id, run_id)].dirty
                ]
                if dirty:
                    await repository.apply(self.store, context.run, [], dirty, fingerprint, self.base_url)
                    for _, t in dirty:
                        t.dirty = False

    def _publish(self, alerts: list[tuple[Alert, bool]]) -> None:
        notified = False
        for alert, queued in alerts:
            self.hub.publish(alert.run_id, {"type": "alert", "run_id": alert.run_id, "alert": repository.alert_json(alert)})
            notified = notified or queued
        if notified:
            self.on_outbox()

    async def check_silent_runs(self, now: float | None = None) -> None:
        """Fire "run went silent" for running runs past their rule's `after_s`; resolve on data."""
        now = time.time() if now is None else now
        if self.store.sqlite:
            await self._check_silent(await self._current_rules(), now)
            return
        # One replica at a time checks: a session-level lock on a connection of its own, in
        # autocommit, so no failure below can leave it held in an aborted transaction.
        async with self.store.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            key = {"key": advisory_key("silence")}
            if not await conn.scalar(text("SELECT pg_try_advisory_lock(:key)"), key):
                return
            try:
                # The rules afresh (once per check): with a cached copy up to 2 s old, a
                # replica that has not seen an edit could undo what the edit just caused.
                await self._check_silent(await repository.load_rules(self.store.sessions), now)
            finally:
                try:
                    await conn.execute(text("SELECT pg_advisory_unlock(:key)"), key)
                except Exception:
                    await conn.invalidate()  # closing the connection releases the lock

    async def _check_silent(self, every: list[Rule], now: float) -> None:
        rules = [r for r in every if r.enabled and r.detector == "silent"]
        if not rules:
            return
        # Running runs can go silent; others only need a look while their alert is open.
        open_alerts = select(Alert.run_id).where(Alert.rule_id.in_([r.id for r in rules]), Alert.state != "resolved")
        async with self.store.sessions() as session:
            runs = list((await session.scalars(select(Run).where(or_(Run.status == "running", Run.id.in_(open_alerts))))).all())
        for run in runs:
            for rule in rules:
                if not repository.rule_applies(rule, run):
                    continue
                silent_for = now - run.last_seen_at
                active = run.status == "running" and silent_for > float(rule.params.get("after_s", 120.0))
                await self._silence_step(rule, run, active, silent_for)

    async def _silence_step(self, rule: Rule, run: Run, active: bool, silent_for: float) -> None:
        async with self._locks[run.id]:
            key = (rule.id, run.id)
            # On PostgreSQL another replica may have checked last: read its state back.
            state = self._tracked.get(key) if self.store.sqlite else None
            if state is None:
                stored = await repository.load_states(self.store.sessions, run.id, [rule.id])
                state = _Tracked.load(stored.get(rule.id), {}, definition(rule))
                self._tracked[key] = state
            if not active and state.lifecycle.phase is Phase.INACTIVE:
                return
            step = run.last_step if run.last_step is not None else 0
            transitions = state.lifecycle.step(active, step, for_steps=1, keep_firing_for=1)
            if not transitions and not active:
                return
            message = f"no data for {silent_for:.0f} s while running" if active else "sending again"
            changes = [_Change(rule, t, step, silent_for if math.isfinite(silent_for) else 0.0, message, state) for t in transitions]
            alerts = await repository.apply(self.store, run, changes, [(rule.id, state)], fingerprint, self.base_url)
            self._publish(alerts)
