"""Shared fixtures: real databases (SQLite file and PostgreSQL) and a real server on a free port."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.support.local_server import LocalServer

HTTP_TIMEOUT_S = 60.0
"""What a test's HTTP call waits for an answer unless it passes its own timeout. httpx's
default is 5 s, and on a loaded two-core box a server's first write on PostgreSQL has taken
longer (a flake, not a finding); tests that measure a delay pass their own `timeout=`."""
_CALLS = (httpx.request, httpx.get, httpx.options, httpx.head, httpx.post, httpx.put, httpx.patch, httpx.delete)
for _call in (*_CALLS, httpx.Client.__init__, httpx.AsyncClient.__init__):
    assert _call.__kwdefaults__ is not None and "timeout" in _call.__kwdefaults__, _call
    _call.__kwdefaults__["timeout"] = httpx.Timeout(HTTP_TIMEOUT_S)

PG_ADMIN_DSN = os.environ.get("KEEL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _postgres_or_skip() -> None:
    import psycopg

    try:
        psycopg.connect(PG_ADMIN_DSN, connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL is required in CI and unreachable at {PG_ADMIN_DSN}: {exc}")
        pytest.skip(f"PostgreSQL unreachable at {PG_ADMIN_DSN}")


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database, dropped afterwards."""
    import psycopg
    from sqlalchemy.engine import make_url

    _postgres_or_skip()
    name = f"keel_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(PG_ADMIN_DSN).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def drop_connections() -> Callable[[str], int]:
    """Terminate every other session on a database, as a PostgreSQL restart would; the
    number terminated. Returns once they are gone (the timeout form of
    pg_terminate_backend waits for each backend to exit; without it a busy machine could
    still run a statement on one the test believes dropped)."""
    import psycopg
    from sqlalchemy.engine import make_url

    def drop(database_url: str) -> int:
        url = make_url(database_url)
        admin = url.set(database="postgres").render_as_string(hide_password=False)
        with psycopg.connect(admin, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (url.database,),
            ).fetchall()
        return len(rows)

    return drop


@pytest.fixture
def sqlite_url(tmp_path) -> str:  # type: ignore[no-untyped-def]
    return f"sqlite:///{tmp_path / 'keel.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> str:
    """Every storage test runs on both databases."""
    return str(request.getfixturevalue(f"{request.param}_url"))


@dataclass
class RunningServer:
    url: str
    ws_url: str
    database_url: str
    app: object
    stop: Callable[[], None]


@pytest.fixture
def server_factory():  # type: ignore[no-untyped-def]
    """Start servers (in-process, real sockets) with custom settings; all stopped at teardown."""
    started: list[LocalServer] = []

    def start(database_url: str, **settings: object) -> RunningServer:
        local = LocalServer(database_url, **settings).start()
        started.append(local)
        return RunningServer(
            url=local.url, ws_url=local.ws_url, database_url=database_url, app=local.app, stop=local.stop
        )

    yield start
    for local in reversed(started):
        local.stop(timeout_s=15)


@pytest.fixture
def server(server_factory, database_url: str) -> RunningServer:  # type: ignore[no-untyped-def]
    return server_factory(database_url)  # type: ignore[no-any-return]
