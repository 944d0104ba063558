"""A real HTTP webhook receiver for tests: answers with scripted statuses, records every request."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    status: int
    at: float

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """`script` is consumed one status per request (with optional headers); then 200s."""

    script: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    requests: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                status, headers = receiver.script.pop(0) if receiver.script else (200, {})
                receiver.requests.append(Received({k.lower(): v for k, v in self.headers.items()}, body, status, time.time()))
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def delivered(self) -> list[Received]:
        return [r for r in self.requests if 200 <= r.status < 300]

    def wait_for(self, predicate, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; received {[(r.status, r.headers.get('webhook-id')) for r in self.requests]}")
            time.sleep(0.02)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
