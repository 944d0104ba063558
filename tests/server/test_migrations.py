"""Alembic is the only schema path: head matches the models exactly, on both databases."""

from __future__ import annotations

import subprocess
import sys

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from server.db import alembic_config, async_url, upgrade
from server.models import Base


def _sync_url(database_url: str) -> str:
    url = async_url(database_url)
    driver = "sqlite" if url.get_backend_name() == "sqlite" else "postgresql+psycopg"
    return url.set(drivername=driver).render_as_string(hide_password=False)


def test_upgrade_head_on_empty_database_matches_models(database_url: str) -> None:
    upgrade(database_url)
    engine = create_engine(_sync_url(database_url))
    try:
        with engine.connect() as conn:
            assert set(inspect(conn).get_table_names()) >= {"runs", "series", "points", "alembic_version"}
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
        assert diff == []
        upgrade(database_url)  # idempotent
    finally:
        engine.dispose()


def test_keel_db_upgrade_command(sqlite_url: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "keel", "db", "upgrade", "--database-url", sqlite_url],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "database at head" in result.stdout
    engine = create_engine(_sync_url(sqlite_url))
    with engine.connect() as conn:
        head = ScriptDirectory.from_config(alembic_config(sqlite_url)).get_current_head()
        assert head is not None
        assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == head
    engine.dispose()
