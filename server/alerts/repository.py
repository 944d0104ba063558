"""SQL of the alert pipeline: rules, rule states, silences and webhooks as rows. No policy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

from sqlalchemy import and_, bindparam, delete, or_, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from server.alerts.catalog import DEFAULT_RULES
from server.models import Project, Rule, RuleState, Run, Silence, Webhook

__all__ = [
    "active_silences",
    "delete_rule_states",
    "enabled_webhooks",
    "install_project",
    "load_rules",
    "load_states",
    "rule_applies",
    "upsert_states",
]

StoredState = tuple[dict[str, Any], int | None]
"""A rule_states row: (state JSON, last evaluated step)."""
Insert = Callable[..., Any]
"""The database's INSERT with ON CONFLICT, from its write path (`Store.insert`): the upserts
here are built with it, so this module never asks which database it is."""


def rule_applies(rule: Rule, run: Run) -> bool:
    return (
        (rule.project is None or rule.project == run.project)
        and (rule.group is None or rule.group == run.group)
        and (rule.run_id is None or rule.run_id == run.id)
    )


async def load_rules(sessions: async_sessionmaker[AsyncSession]) -> list[Rule]:
    async with sessions() as session:
        return list((await session.scalars(select(Rule).order_by(Rule.id))).all())


async def install_project(session: AsyncSession, insert: Insert, project: str, now: float) -> bool:
    """Record the project and add its default rules, once, even under concurrent first runs.

    True if this call installed them.
    """
    created = await session.execute(
        insert(Project)
        .values(name=project, created_at=now)
        .on_conflict_do_nothing(index_elements=["name"])
        .returning(Project.name)
    )
    if created.first() is None:  # another server or run installed it first
        return False
    for spec in DEFAULT_RULES:
        session.add(
            Rule(
                name=spec.name, project=project, group=None, run_id=None, metric=spec.metric,
                detector=spec.detector, params=dict(spec.params), severity=spec.severity,
                for_steps=spec.for_steps, keep_firing_for=spec.keep_firing_for,
                enabled=True, builtin=True, created_at=now,
            )
        )
    return True


_LOAD_STATES = select(RuleState.rule_id, RuleState.state, RuleState.last_step).where(
    RuleState.run_id == bindparam("run_id"), RuleState.rule_id.in_(bindparam("rule_ids", expanding=True))
)


async def load_states(session: AsyncSession, run_id: str, rule_ids: Sequence[int]) -> dict[int, StoredState]:
    rows = await session.execute(_LOAD_STATES, {"run_id": run_id, "rule_ids": list(rule_ids)})
    return {rule_id: (state, last_step) for rule_id, state, last_step in rows}


@cache
def _upsert_states_sql(insert: Insert) -> Any:
    """Built once per database: the statement is the same for every evaluation (its rows are
    executemany parameters), so it is compiled once, not on every frame."""
    statement = insert(RuleState)
    stored, incoming = RuleState.last_step, statement.excluded.last_step
    return statement.on_conflict_do_update(
        index_elements=["rule_id", "run_id"],
        set_={"state": statement.excluded.state, "last_step": incoming},
        where=or_(stored.is_(None), and_(incoming.is_not(None), incoming >= stored)),
    )


async def upsert_states(
    session: AsyncSession, insert: Insert, run_id: str, rows: list[tuple[int, dict[str, Any], int | None]]
) -> None:
    """Write rule states (one executemany), never back in time: a replica (or a late
    shutdown flush) holding an older state must not overwrite what another has evaluated since."""
    connection = await session.connection()
    await connection.execute(
        _upsert_states_sql(insert),
        [{"rule_id": rule_id, "run_id": run_id, "state": state, "last_step": last_step} for rule_id, state, last_step in rows],
    )


async def delete_rule_states(session: AsyncSession, rule_id: int) -> None:
    await session.execute(delete(RuleState).where(RuleState.rule_id == rule_id))


async def active_silences(session: AsyncSession, now: float) -> list[Silence]:
    return list((await session.scalars(select(Silence).where(Silence.starts_at <= now, Silence.ends_at > now))).all())


async def enabled_webhooks(session: AsyncSession) -> list[Webhook]:
    return list((await session.scalars(select(Webhook).where(Webhook.enabled.is_(True)))).all())
