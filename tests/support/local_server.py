"""A Keel server in the test's own process, on a free loopback port, with real sockets (the
fixtures of tests/conftest.py; tests that need a process of their own use tests/support/server.py)."""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType
from typing import Any

__all__ = ["LocalServer", "free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalServer:
    """`create_app(Settings(database_url, port=<free>, **settings))` served by uvicorn on a
    thread, with real sockets:

        with LocalServer("sqlite:///keel.db") as server:
            Monitor(server.url, ...)
    """

    def __init__(self, database_url: str, **settings: Any):
        import uvicorn

        from server.app import create_app
        from server.config import Settings
        from server.serving import uvicorn_config

        self.port = free_port()
        self.settings = Settings(**{"host": "127.0.0.1", **settings, "database_url": database_url, "port": self.port})
        self.app = create_app(self.settings)
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        # The same Config as `keel serve` (server/serving.py): same timeouts, same limits.
        self.server = uvicorn.Server(uvicorn_config(self.app, self.settings, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="keel-local-server", daemon=True)

    def start(self, timeout_s: float = 30.0) -> LocalServer:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the local Keel server did not start")
            time.sleep(0.02)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.thread.is_alive():
            self.server.should_exit = True
            self.thread.join(timeout=timeout_s)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
