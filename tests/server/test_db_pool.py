"""The PostgreSQL pool across a database restart: an idle pooled connection the database
dropped is found by a ping and replaced before a request uses it."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from server import db


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
