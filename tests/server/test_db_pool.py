"""The PostgreSQL pools across a database restart: an idle pooled connection the database
dropped is found by a ping and replaced before a request or a frame uses it."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH
from sqlalchemy import text

from server import db
from server.storage import FrameRef, Store
from server.storage.postgres import FRAME_SQL
from wire import Row, RunInfo


def test_an_idle_connection_the_database_dropped_is_replaced(
    postgres_url, drop_connections, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db, "PING_AFTER_IDLE_S", 0.2)

    async def scenario() -> tuple[int, int]:
        engine = db.create_engine(postgres_url, pool_size=1, max_overflow=0)
        try:
            async with engine.connect() as conn:
                first = await conn.scalar(text("SELECT pg_backend_pid()"))
            assert drop_connections(postgres_url) >= 1  # the pooled connection among them
            await asyncio.sleep(0.3)  # idle past the threshold
            async with engine.connect() as conn:  # no error: pinged, found dead, replaced
                second = await conn.scalar(text("SELECT pg_backend_pid()"))
            return first, second
        finally:
            await engine.dispose()

    first, second = asyncio.run(scenario())
    assert first != second


def test_a_connection_in_steady_use_is_not_pinged(postgres_url) -> None:
    pings: list[int] = []

    async def scenario() -> None:
        engine = db.create_engine(postgres_url, pool_size=1, max_overflow=0)
        do_ping = engine.dialect.do_ping
        engine.dialect.do_ping = lambda connection: pings.append(1) or do_ping(connection)  # type: ignore[method-assign]
        try:
            for _ in range(20):
                async with engine.connect() as conn:
                    assert await conn.scalar(text("SELECT 1")) == 1
        finally:
            await engine.dispose()

    asyncio.run(scenario())
    assert pings == []


def _frame(step: int) -> list[Row]:
    return [Row(step=step, time=None, values={"loss": float(step)})]


def test_a_frame_connection_the_database_dropped_is_replaced(
    postgres_url, drop_connections, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool of the one-statement frame write (server/storage/postgres.py) pings an
    idle connection too: frames after a database restart are stored, none fails."""
    monkeypatch.setattr(db, "PING_AFTER_IDLE_S", 0.2)

    async def scenario() -> list[int]:
        await db.upgrade_async(postgres_url)
        store = Store(db.create_engine(postgres_url))
        try:
            run = RunInfo(id=f"pool-{uuid.uuid4().hex[:8]}", name="pool", project="pool")
            _, session = await store.open_run(run, time.time())
            results = []
            for seq in range(3):  # the first caches the run's series, the others take the one-statement path
                results.append(await store.write_points(run.id, _frame(seq), time.time(), FrameRef("", session, seq)))
            assert drop_connections(postgres_url) >= 1
            await asyncio.sleep(0.3)  # idle past the threshold
            results.append(await store.write_points(run.id, _frame(3), time.time(), FrameRef("", session, 3)))
            assert all(r.stored for r in results)
            return [r.acked_seq for r in results]
        finally:
            await store.close()

    assert asyncio.run(scenario()) == [0, 1, 2, 3]


def test_the_frame_statement_is_short_enough_for_psycopg_to_cache_its_parse() -> None:
    """psycopg parses a query longer than this again on every execution (a third of the
    write's CPU, measured)."""
    assert len(FRAME_SQL) <= MAX_CACHED_STATEMENT_LENGTH
