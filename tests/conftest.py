"""Shared fixtures: real databases (SQLite file and PostgreSQL) and a real server on a free port."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.local_server import LocalServer
from tests.support.order import slow_files_first

HTTP_TIMEOUT_S = 60.0
"""What a test's HTTP call waits for an answer unless it passes its own timeout. httpx's
default is 5 s, and on a loaded two-core box a server's first write on PostgreSQL has taken
longer (a flake, not a finding); tests that measure a delay pass their own `timeout=`."""
_CALLS = (httpx.request, httpx.get, httpx.options, httpx.head, httpx.post, httpx.put, httpx.patch, httpx.delete)
for _call in (*_CALLS, httpx.Client.__init__, httpx.AsyncClient.__init__):
    assert _call.__kwdefaults__ is not None and "timeout" in _call.__kwdefaults__, _call
    _call.__kwdefaults__["timeout"] = httpx.Timeout(HTTP_TIMEOUT_S)

PG_ADMIN_DSN = os.environ.get("KEEL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slow_files_first(items)


def _postgres_or_skip() -> None:
    import psycopg

    try:
        psycopg.connect(PG_ADMIN_DSN, connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL is required in CI and unreachable at {PG_ADMIN_DSN}: {exc}")
        pytest.skip(f"PostgreSQL unreachable at {PG_ADMIN_DSN}")


def _create_database(template: str | None = None) -> str:
    """A new PostgreSQL database (a copy of `template` if given); its URL."""
    import psycopg
    from sqlalchemy.engine import make_url

    name = f"keel_test_{uuid.uuid4().hex[:12]}"
    copy = f' TEMPLATE "{template}"' if template else ""
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"{copy}')
    return make_url(PG_ADMIN_DSN).set(database=name).render_as_string(hide_password=False)


def _drop_database(url: str) -> None:
    import psycopg
    from sqlalchemy.engine import make_url

    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')


@pytest.fixture(scope="session")
def _postgres_template() -> Iterator[str]:
    """A PostgreSQL database migrated to head once per session (per xdist worker): each
    test's database is a copy of it (CREATE DATABASE ... TEMPLATE), not a migration of its own."""
    from sqlalchemy.engine import make_url

    from server.db import upgrade

    _postgres_or_skip()
    url = _create_database()
    try:
        upgrade(url)  # its engine is disposed: no session left on the template to block a copy
        yield str(make_url(url).database)
    finally:
        _drop_database(url)


@pytest.fixture
def empty_postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database, dropped afterwards (for the tests of migrations)."""
    _postgres_or_skip()
    url = _create_database()
    try:
        yield url
    finally:
        _drop_database(url)


@pytest.fixture
def postgres_url(_postgres_template: str) -> Iterator[str]:
    """A fresh PostgreSQL database already at the migrations' head (a copy of the session's
    template), dropped afterwards. The server's migration on start finds it at head."""
    url = _create_database(template=_postgres_template)
    try:
        yield url
    finally:
        _drop_database(url)


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


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database migrated to head once per session (per xdist worker)."""
    from server.db import upgrade

    path = tmp_path_factory.mktemp("sqlite-template") / "keel.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture
def empty_sqlite_url(tmp_path: Path) -> str:
    """A SQLite database that does not exist yet (for the tests of migrations)."""
    return f"sqlite:///{tmp_path / 'keel.db'}"


@pytest.fixture
def sqlite_url(tmp_path: Path, _sqlite_template: Path) -> str:
    """A fresh SQLite database already at the migrations' head (a copy of the session's template)."""
    path = tmp_path / "keel.db"
    shutil.copyfile(_sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture(params=["sqlite", "postgres"])
def empty_database_url(request: pytest.FixtureRequest) -> str:
    """Both databases, empty: the tests of migrations start from nothing."""
    return str(request.getfixturevalue(f"empty_{request.param}_url"))


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
