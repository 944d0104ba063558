"""The alert engine: evaluates rules on every committed step, incrementally.

Stage one of the alert pipeline (evaluate → record → notify; docs/architecture.md).
Registered as an after-commit listener of the ingest path. Per run, frames are
evaluated in order under a lock; each (rule, run) keeps detector and lifecycle state
(`state.Tracked`), written in the same transaction as the alert rows
(`transitions.record`) and the webhook outbox rows they cause (`notify.Notifier`).
Steps at or below a state's last evaluated step are skipped, so resent data is not
evaluated twice. How states are shared between processes is `coordination.py`'s.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from server import run_commands
from server.alerts import repository, transitions
from server.alerts.catalog import build_detector
from server.alerts.coordination import Coordination, RuleToLoad, Stale
from server.alerts.detectors import JOINED, Detector
from server.alerts.hazard import HazardModel
from server.alerts.lifecycle import Phase
from server.alerts.notify import Notifier
from server.alerts.rulebook import RuleBook
from server.alerts.state import Change, Tracked, definition, signature
from server.jsonview import wire_alert
from server.live import LiveHub
from server.models import Alert, Command, Rule, Run
from server.storage import Store
from wire import Row
from wire.signals import AlertMessage

__all__ = ["AlertEngine"]

log = logging.getLogger("keel.alerts")

FIRST_REPLAY_STEPS = 10_000
"""A run nobody has evaluated yet replays at most this many committed steps before its
frame: the first frames another replica stored and is still evaluating (`_resume_after`),
not a long history streamed while no rule applied to the run."""
IDLE_S = 600.0
"""A run that sent nothing for this long is saved and forgotten (`forget_idle_runs`): the
engine's memory holds the runs that stream, not every run it ever saw. Its next frame
loads its states back and replays what it has not evaluated, as after a restart."""
ROWS_PER_SLICE = 500
"""Rows evaluated between two yields to the event loop (a 10k-row frame is ~70 ms of work)."""


@dataclass
class _RunContext:
    run: Run
    rules: list[tuple[Rule, Detector]] = field(default_factory=list)
    definitions: dict[int, str] = field(default_factory=dict)
    """`definition(rule)` per rule id, computed once per rules version (not per frame)."""
    rules_version: int = -1


@dataclass
class _Recorded:
    """What one `_record` wrote, to publish once it is committed."""

    alerts: list[Alert]
    queued: bool
    """A notification was queued (wake the delivery worker)."""
    commands: list[Command]


def _to_load(context: _RunContext) -> list[RuleToLoad]:
    return [(rule, detector.initial_state(), context.definitions[rule.id]) for rule, detector in context.rules]


async def _replace_pending(session: AsyncSession, commands: list[Command], now: float) -> None:
    """Each new pending command replaces the run's pending ones with the same action, as one
    over REST does (run_commands.create): a rule that fires again and again while its
    trainer is away leaves one `stop`, the newest, not one per firing."""
    newest = {command.action: command for command in commands if command.state == "pending"}
    for command in commands:
        if command.state == "pending" and newest[command.action] is not command:
            command.state, command.finished_at = "failed", now
            command.message = f"replaced by {newest[command.action].id} before a trainer received it"
    for command in newest.values():
        await run_commands.replace_pending(session, command, now)


class AlertEngine:
    def __init__(
        self,
        store: Store,
        hub: LiveHub,
        rulebook: RuleBook,
        coordination: Coordination,
        notifier: Notifier,
        *,
        hazard_model: HazardModel,
        on_outbox: Callable[[], None] = lambda: None,
    ):
        self.store = store
        self.hub = hub
        self.rulebook = rulebook
        self.coordination = coordination
        self.notifier = notifier
        self.hazard_model = hazard_model
        """What the rules' `hazard` detectors compute with."""
        self.on_outbox = on_outbox
        """Called when a notification was queued (wakes the delivery worker)."""
        self._rules_version = 0
        self._seen_rules: list[Rule] | None = None
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._runs: dict[str, _RunContext] = {}
        self._tracked: dict[tuple[int, str], Tracked] = {}
        self._active: dict[str, float] = {}
        """Run id -> when its last frame was evaluated (monotonic)."""
        self.idle_s = IDLE_S

    async def on_points(self, run_id: str, started_at: float, rows: list[Row]) -> None:
        """Evaluate the rows just committed to the incarnation `started_at` of the run."""
        rows = sorted(rows, key=lambda row: row.step)
        async with self._locks[run_id]:
            self._active[run_id] = time.monotonic()
            context = self._runs.get(run_id)
            if context is not None and context.run.started_at != started_at:
                # The run id was deleted and created again (here or on another replica): what
                # is cached belongs to the old run, its states and alerts gone with it.
                self._forget(run_id)
            try:
                try:
                    await self._evaluate(run_id, started_at, rows, locked=False)
                except Stale:
                    # Another replica wrote the run's states meanwhile: evaluate again from
                    # those, under the run's lock.
                    self._forget_states(run_id)
                    await self._evaluate(run_id, started_at, rows, locked=True)
            except BaseException as exc:
                # Failed or cancelled: the cached state may be ahead of what was committed.
                # Drop it so the next frame reloads what was (and replays the steps).
                self._forget(run_id)
                if isinstance(exc, IntegrityError):
                    self.rulebook.changed()  # e.g. a rule deleted by another replica: re-read now
                raise

    def _forget(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
        self._active.pop(run_id, None)
        self._forget_states(run_id)

    def _forget_states(self, run_id: str) -> None:
        for key in [k for k in self._tracked if k[1] == run_id]:
            del self._tracked[key]

    async def _rules(self, *, fresh: bool = False) -> list[Rule]:
        """The rule book's rules. A rule edited or deleted since the last list loses its
        states here (whichever replica edited it), and any difference is a new version."""
        rules = await self.rulebook.current(fresh=fresh)
        if rules is not self._seen_rules:
            seen = {signature(rule): rule for rule in self._seen_rules or ()}
            current = {signature(rule) for rule in rules}
            for key, rule in seen.items():
                if key not in current:
                    for tracked_key in [k for k in self._tracked if k[0] == rule.id]:
                        del self._tracked[tracked_key]
            if self._seen_rules is None or current != set(seen):
                self._rules_version += 1
            self._seen_rules = rules
        return rules

    async def _context(self, run_id: str) -> _RunContext:
        context = self._runs.get(run_id)
        if context is None:
            run = await self.store.get_run(run_id)
            await self.rulebook.install_project(run.project)
            context = _RunContext(run=run)
            self._runs[run_id] = context
        rules = await self._rules()
        if context.rules_version != self._rules_version:
            context.rules, context.definitions = [], {}
            for rule in rules:
                if rule.enabled and repository.rule_applies(rule, context.run) and rule.detector != "silent":
                    try:
                        context.rules.append((rule, build_detector(rule.detector, rule.metric, rule.params, hazard_model=self.hazard_model)))
                        context.definitions[rule.id] = definition(rule)
                    except ValueError:
                        log.exception("rule %s is invalid; skipped", rule.id)
            context.rules_version = self._rules_version
        return context

    async def _evaluate(self, run_id: str, started_at: float, rows: list[Row], *, locked: bool) -> None:
        context = await self._context(run_id)
        if not context.rules or context.run.started_at != started_at:
            return  # no rule applies, or the rows' incarnation of the run was deleted since
        async with self.coordination.evaluation(run_id, locked=locked) as evaluation:
            tracked, after = await evaluation.states(run_id, _to_load(context), self._tracked)
            if after >= 0:  # the run was evaluated before: a rule that has seen none of it joins it now
                for t in tracked.values():
                    if t.last_step is None:
                        t.detector_state.setdefault(JOINED, True)
            if after < 0 and rows:  # nobody has evaluated the run: its first frames, not a long history
                after = max(after, rows[0].step - 1 - FIRST_REPLAY_STEPS)
            changes: list[Change] = []
            while rows and rows[0].step > after + 1:
                # Committed steps the states have not seen: evaluate them first, a bounded
                # read at a time (a read ends before a step it would cut).
                replay = await self.store.rows(run_id, after=after, before=rows[0].step, session=evaluation.session)
                if not replay:
                    break
                changes += await self._run_sliced(context, tracked, replay)
                after = replay[-1].step
            changes += await self._run_sliced(context, tracked, rows)
            dirty = [(rule_id, t) for rule_id, t in tracked.items() if t.dirty]
            if not dirty or not evaluation.due(run_id, changes):
                return
            async with evaluation.writing(run_id, tracked) as session:
                recorded = await self._record(session, context.run, changes, dirty)
        for _, t in dirty:
            t.dirty = False
        self._publish(recorded)

    async def _run_sliced(self, context: _RunContext, tracked: dict[int, Tracked], rows: list[Row]) -> list[Change]:
        changes: list[Change] = []
        for start in range(0, len(rows), ROWS_PER_SLICE):
            if start:
                await asyncio.sleep(0)  # a huge frame: let other clients' frames in between
            changes += self._run_rules(context, tracked, rows[start : start + ROWS_PER_SLICE])
        return changes

    def _run_rules(self, context: _RunContext, tracked: dict[int, Tracked], rows: list[Row]) -> list[Change]:
        """Feed the rows (ascending) to every rule's detector and lifecycle; the transitions."""
        changes: list[Change] = []
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
                    changes.append(Change(rule, transition, row.step, signal.value, signal.message, state, signal.metric))
        return changes

    async def _record(
        self, session: AsyncSession, run: Run, changes: list[Change], states: list[tuple[int, Tracked]]
    ) -> _Recorded:
        """Stages two and three, and the states, in one transaction (`session`): the alerts
        that changed, whether a notification was queued, and the commands of the rules' actions
        (a firing alert of a rule with an action, unless silenced)."""
        now = time.time()
        alerts, events = await transitions.record(session, run, changes, now)
        queued = await self.notifier.notify(session, run, events, now)
        actions = {change.rule.id: change.rule for change in changes if change.rule.action}
        commands = [
            run_commands.add_command(
                session,
                run,
                str(rule.action),
                {"alert": event.alert.id, "rule": rule.name, "severity": event.alert.severity, "step": event.alert.fired_step},
                f"rule {rule.name}",
                now,
            )
            for event in events
            if event.state == "firing" and not event.alert.silenced and (rule := actions.get(event.alert.rule_id or -1))
        ]
        await _replace_pending(session, commands, now)
        # After the changes: new alerts' ids are part of the state.
        if states:
            await repository.upsert_states(session, self.store.insert, run.id, [(rule_id, t.to_json(), t.last_step) for rule_id, t in states])
            for _, t in states:
                t.stored_step = t.last_step
        return _Recorded(alerts, queued, commands)

    async def flush(self) -> None:
        """Write every run's unsaved detector state (graceful shutdown)."""
        await self._save(list(self._runs))

    async def forget_idle_runs(self) -> None:
        """Save and forget the runs that sent nothing for `idle_s` (periodic)."""
        now = time.monotonic()

        def idle(run_id: str) -> bool:  # (a frame evaluated meanwhile makes it active again)
            return run_id in self._runs and now - self._active.get(run_id, now) >= self.idle_s

        for run_id in await self._save([run_id for run_id in self._runs if idle(run_id)]):
            if idle(run_id) and not self._locks[run_id].locked():
                self._forget(run_id)
                del self._locks[run_id]
        # States of runs without a context are the silent rule's, written with every change.
        for key in [k for k, t in self._tracked.items() if k[1] not in self._runs and not t.dirty]:
            lock = self._locks.get(key[1])
            if lock is None or not lock.locked():
                del self._tracked[key]

    async def _save(self, run_ids: list[str]) -> list[str]:
        """Write the unsaved detector states of these runs, each run in an evaluation of its own:
        under the run's lock, and only states no other replica has written since
        (`Evaluation.states` replaces those); the runs whose states are now stored. The rules are
        read afresh first, so a rule deleted on another replica is not written for. One run
        failing (deleted meanwhile) does not keep the others from being written."""
        if not run_ids:
            return []
        try:
            await self._rules(fresh=True)
        except Exception:
            log.exception("could not read the rules; saving the states of the rules last read")
        saved = []
        for run_id in run_ids:
            try:
                async with self._locks[run_id]:
                    if run_id not in self._runs:
                        continue
                    context = await self._context(run_id)
                    if context.rules:
                        async with self.coordination.evaluation(run_id) as evaluation:
                            tracked, _ = await evaluation.states(run_id, _to_load(context), self._tracked)
                            dirty = [(rule_id, t) for rule_id, t in tracked.items() if t.dirty]
                            if dirty:
                                async with evaluation.writing(run_id, tracked) as session:
                                    await self._record(session, context.run, [], dirty)
                                for _, t in dirty:
                                    t.dirty = False
                saved.append(run_id)
            except IntegrityError:
                self._forget(run_id)
                log.warning("run %s or one of its rules was deleted meanwhile; its detector states are not saved", run_id)
            except Exception:
                log.exception("could not save the detector states of run %s", run_id)
        return saved

    def _publish(self, recorded: _Recorded) -> None:
        for alert in recorded.alerts:
            self.hub.publish(alert.run_id, AlertMessage(alert.run_id, wire_alert(alert)).to_json())
        run_commands.publish(self.hub, recorded.commands)
        if recorded.queued:
            self.on_outbox()

    # -- "run went silent" ---------------------------------------------------------------

    async def check_silent_runs(self, now: float | None = None) -> None:
        """Fire "run went silent" for running runs past their rule's `after_s`; resolve on data."""
        now = time.time() if now is None else now
        async with self.coordination.exclusive("silent-runs") as mine:
            if not mine:
                return
            # The rules afresh (once per check): with a cached copy a replica that has not
            # seen an edit yet could undo what the edit just caused.
            rules = [r for r in await self._rules(fresh=True) if r.enabled and r.detector == "silent"]
            if not rules:
                return
            # Running runs can go silent; others only need a look while their alert is open.
            open_alerts = select(Alert.run_id).where(Alert.rule_id.in_([r.id for r in rules]), Alert.state != "resolved")
            async with self.store.sessions() as session:
                query = select(Run).where(or_(Run.status == "running", Run.id.in_(open_alerts)))
                runs = list((await session.scalars(query)).all())
            for run in runs:
                for rule in rules:
                    if not repository.rule_applies(rule, run):
                        continue
                    silent_for = now - run.last_seen_at
                    active = run.status == "running" and silent_for > float(rule.params.get("after_s", 120.0))
                    await self._silent_run_step(rule, run, active, silent_for)

    async def _silent_run_step(self, rule: Rule, run: Run, active: bool, silent_for: float) -> None:
        async with self._locks[run.id], self.coordination.evaluation(run.id) as evaluation:
            tracked, _ = await evaluation.states(run.id, [(rule, {}, definition(rule))], self._tracked)
            state = tracked[rule.id]
            if not active and state.lifecycle.phase is Phase.INACTIVE:
                return
            step = run.last_step if run.last_step is not None else 0
            transitions_ = state.lifecycle.step(active, step, for_steps=1, keep_firing_for=1)
            if not transitions_ and not active:
                return
            message = f"no data for {silent_for:.0f} s while running" if active else "sending again"
            value = silent_for if math.isfinite(silent_for) else 0.0
            changes = [Change(rule, t, step, value, message, state) for t in transitions_]
            async with evaluation.writing(run.id, tracked) as session:
                recorded = await self._record(session, run, changes, [(rule.id, state)])
        self._publish(recorded)
