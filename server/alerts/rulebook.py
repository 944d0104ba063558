"""The rules: their CRUD and the cached list the engine evaluates.

Every edit goes through here, so the cache can never miss one made on this server;
with replicas (PostgreSQL) the list is also read again once it is `ttl_s` old, which
bounds how long another replica's edit goes unseen.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sqlalchemy import select

from server.alerts import repository
from server.alerts.catalog import SEVERITIES, build_detector
from server.errors import InvalidRequest, NotFound
from server.models import Rule
from server.storage import Store

__all__ = ["RuleBook", "rule_json", "validate_rule"]


def rule_json(rule: Rule) -> dict[str, Any]:
    return {
        "id": rule.id, "name": rule.name, "project": rule.project, "group": rule.group, "run_id": rule.run_id,
        "metric": rule.metric, "detector": rule.detector, "params": rule.params, "severity": rule.severity,
        "for_steps": rule.for_steps, "keep_firing_for": rule.keep_firing_for, "enabled": rule.enabled, "builtin": rule.builtin,
        "action": rule.action,
    }


def validate_rule(fields: dict[str, Any]) -> None:
    try:
        build_detector(fields["detector"], fields["metric"], fields.get("params") or {})
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    if fields["severity"] not in SEVERITIES:
        raise InvalidRequest(f"severity must be one of {', '.join(SEVERITIES)}")
    if fields["for_steps"] < 0 or fields["keep_firing_for"] < 0:
        raise InvalidRequest("for_steps and keep_firing_for must be >= 0")


class RuleBook:
    def __init__(self, store: Store, *, ttl_s: float):
        self.store = store
        self.ttl_s = ttl_s
        """How old the cached list may get before it is read again (infinite with one process)."""
        self._version = 0
        self._cached: list[Rule] | None = None
        self._loaded_at = 0.0
        self._installed: set[str] = set()
        self._install_lock = asyncio.Lock()

    def changed(self) -> None:
        """Drop the cached list: the next `current()` reads the table again."""
        self._version += 1
        self._cached = None

    async def current(self, *, fresh: bool = False) -> list[Rule]:
        """Every rule, by id. The same list object until it is read again (callers compare)."""
        if fresh or self._cached is None or time.monotonic() - self._loaded_at > self.ttl_s:
            while True:  # a rule edited here during the read makes it stale: read again
                version = self._version
                rules = await repository.load_rules(self.store.sessions)
                if version == self._version:
                    break
            self._cached, self._loaded_at = rules, time.monotonic()
        return self._cached

    async def install_project(self, project: str) -> None:
        """A project's default rules, the first time one of its runs is evaluated."""
        async with self._install_lock:
            if project in self._installed:
                return
            async with self.store.writing() as session:
                installed = await repository.install_project(session, self.store.insert, project, time.time())
            if installed:
                self.changed()
            self._installed.add(project)

    # -- CRUD ---------------------------------------------------------------------------

    async def list(self, project: str | None) -> list[Rule]:
        query = select(Rule).order_by(Rule.id)
        if project is not None:
            query = query.where(Rule.project == project)
        async with self.store.sessions() as session:
            return list((await session.scalars(query)).all())

    async def create(self, fields: dict[str, Any]) -> Rule:
        validate_rule(fields)
        async with self.store.writing() as session:
            rule = Rule(**fields, builtin=False, created_at=time.time())
            session.add(rule)
        self.changed()
        return rule

    async def update(self, rule_id: int, changes: dict[str, Any]) -> Rule:
        async with self.store.writing() as session:
            rule = await session.get(Rule, rule_id)
            if rule is None:
                raise NotFound(f"rule {rule_id} not found")
            validate_rule({**rule_json(rule), **changes})
            evaluation_changed = any(k in changes for k in ("metric", "detector", "params"))
            for key, value in changes.items():
                setattr(rule, key, value)
            if evaluation_changed:
                # Old detector state means nothing to a different detector.
                await repository.delete_rule_states(session, rule_id)
        self.changed()
        return rule

    async def delete(self, rule_id: int) -> None:
        async with self.store.writing() as session:
            rule = await session.get(Rule, rule_id)
            if rule is None:
                raise NotFound(f"rule {rule_id} not found")
            await session.delete(rule)
        self.changed()
