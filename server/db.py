"""Engine, sessions and migrations. Nothing here runs at import time."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

import migrations

MIGRATIONS_DIR = Path(migrations.__file__).parent


def async_url(database_url: str) -> URL:
    """Accept the URLs people type (sqlite:///x.db, postgresql://...) and pick the async driver."""
    url = make_url(database_url)
    backend = url.get_backend_name()
    if backend == "sqlite":
        url = url.set(drivername="sqlite+aiosqlite")
        if url.database and url.database != ":memory:":
            Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
            url = url.set(database=str(Path(url.database).expanduser()))
    elif backend in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    else:
        raise ValueError(f"unsupported database {backend!r}: use sqlite:///path or postgresql://...")
    return url


def is_sqlite(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "sqlite"


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets readers (dashboard) proceed while ingest writes; busy_timeout
    # turns writer contention into a wait instead of an error.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def create_engine(database_url: str, **kwargs: Any) -> AsyncEngine:
    url = async_url(database_url)
    # A failed statement's error (and so the server log) would otherwise carry its bound
    # parameters: webhook secrets, URLs, whatever a client sent.
    kwargs.setdefault("hide_parameters", True)
    if url.get_backend_name() == "sqlite":
        engine = create_async_engine(url, **kwargs)
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    kwargs.setdefault("pool_size", 20)
    kwargs.setdefault("max_overflow", 20)
    engine = create_async_engine(url, **kwargs)
    _ping_idle_connections(engine)
    return engine


PING_AFTER_IDLE_S = 1.0
"""A pooled PostgreSQL connection idle for longer is pinged before it is handed out."""


def _ping_idle_connections(engine: AsyncEngine) -> None:
    """Pessimistic disconnect handling, but only for connections that sat idle: a database
    restart is found before a request uses a dead connection, while connections in steady
    use (ingest under load) skip the ping's round trip, two per frame. One that fails the
    ping is replaced (SQLAlchemy's checkout-event recipe)."""
    dialect = engine.dialect

    @event.listens_for(engine.sync_engine.pool, "checkin")
    def _idle_since(_dbapi_connection: Any, record: Any) -> None:
        record.info["keel_idle_since"] = time.monotonic()

    @event.listens_for(engine.sync_engine.pool, "checkout")
    def _ping_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("keel_idle_since")
        if since is None or time.monotonic() - since < PING_AFTER_IDLE_S:
            return
        try:
            dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise DisconnectionError() from exc


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation would choke on '%' in passwords.
    config.set_main_option("sqlalchemy.url", async_url(database_url).render_as_string(hide_password=False).replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    """Apply migrations (blocking; migrations/env.py runs its own event loop)."""
    command.upgrade(alembic_config(database_url), revision)


async def upgrade_async(database_url: str) -> None:
    # env.py calls asyncio.run(), which cannot nest in a running loop: use a thread.
    await asyncio.to_thread(upgrade, database_url)
