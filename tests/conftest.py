"""Shared fixtures: real databases (SQLite file and PostgreSQL) and a real server on a free port."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

PG_ADMIN_DSN = os.environ.get("KEEL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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


class _ServerThread:
    def __init__(self, database_url: str, **settings: object):
        import uvicorn

        from server.app import create_app
        from server.config import Settings

        self.port = free_port()
        self.settings = Settings(database_url=database_url, port=self.port, **settings)  # type: ignore[arg-type]
        self.app = create_app(self.settings)
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on",
            ws_max_size=self.settings.max_frame_bytes + 1024 * 1024,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> RunningServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        base = f"http://127.0.0.1:{self.port}"
        return RunningServer(
            url=base,
            ws_url=f"ws://127.0.0.1:{self.port}",
            database_url=self.settings.database_url,
            app=self.app,
            stop=lambda: self.__exit__(None, None, None),
        )

    def __exit__(self, *exc: object) -> None:
        if self.thread.is_alive():
            self.server.should_exit = True
            self.thread.join(timeout=15)


@pytest.fixture
def server_factory():  # type: ignore[no-untyped-def]
    """Start servers (in-process, real sockets) with custom settings; all stopped at teardown."""
    started: list[_ServerThread] = []

    def start(database_url: str, **settings: object) -> RunningServer:
        thread = _ServerThread(database_url, **settings)
        started.append(thread)
        return thread.__enter__()

    yield start
    for thread in reversed(started):
        thread.__exit__(None, None, None)


@pytest.fixture
def server(server_factory, database_url: str) -> RunningServer:  # type: ignore[no-untyped-def]
    return server_factory(database_url)  # type: ignore[no-any-return]
