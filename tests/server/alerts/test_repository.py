"""server/alerts/repository.py: its upserts, built with the store's INSERT (`Store.insert`,
from the write path), on both databases."""

from __future__ import annotations

import asyncio
import time

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from server import db
from server.alerts import repository
from server.models import Rule, RuleState
from server.storage import Store
from wire import RunInfo


def test_the_upserts_install_a_project_once_and_never_move_a_state_back(database_url: str) -> None:
    db.upgrade(database_url)

    async def scenario() -> tuple[list[bool], list[tuple[dict, int | None]]]:
        store = Store(db.create_engine(database_url))
        try:
            assert store.insert is (pg_insert if store.shared else sqlite_insert)
            installed = []
            for _ in range(2):
                async with store.writing() as session:
                    installed.append(await repository.install_project(session, store.insert, "p", time.time()))
            await store.open_run(RunInfo(id="r", name="r", project="p"), time.time())
            async with store.sessions() as session:
                rule_id = (await session.scalars(select(Rule.id).where(Rule.project == "p").order_by(Rule.id))).first()
            assert rule_id is not None
            stored = []
            for state, step in (({"n": 1}, 5), ({"n": 2}, 9), ({"n": 0}, 3), ({"n": 3}, None)):
                async with store.writing() as session:
                    await repository.upsert_states(session, store.insert, "r", [(rule_id, state, step)])
                async with store.sessions() as session:
                    row = (await session.execute(select(RuleState.state, RuleState.last_step).where(RuleState.rule_id == rule_id))).one()
                stored.append((row.state, row.last_step))
            return installed, stored
        finally:
            await store.close()

    installed, stored = asyncio.run(scenario())
    assert installed == [True, False]  # the second finds the project there: no second set of rules
    # Step 3 is older than the stored 9: kept. A state with no step never overwrites one that has a step.
    assert stored == [({"n": 1}, 5), ({"n": 2}, 9), ({"n": 2}, 9), ({"n": 2}, 9)]
