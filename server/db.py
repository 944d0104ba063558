"""Engine, sessions and migrations. Nothing here runs at import time."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
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
    kwargs.setdefault("pool_pre_ping", True)
    return create_async_engine(url, **kwargs)


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
