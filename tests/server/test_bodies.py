"""Request bodies over their route's limit (server/bodies.py), over real sockets: refused
with 413 and the security headers while they are read, before anything authenticates or
parses them, whether sent with a Content-Length (refused before a byte of the body is
read) or chunked (refused once what was read passes the limit)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from server.bodies import LOGIN_BODY_BYTES, body_limit
from server.config import Settings
from tests.support.raw_client import hello, new_run, open_ingest

ADMIN = "keel_test_admin_token_0123456789abcdef"
SECURITY = {
    "x-frame-options": "SAMEORIGIN",
    "content-security-policy": "frame-ancestors 'self'",
    "x-content-type-options": "nosniff",
}


def _port(server: Any) -> int:
    return int(server.url.rsplit(":", 1)[1])


def _answer(server: Any, head: str, body: bytes = b"", timeout_s: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """What the server answers to a request sent by hand: `head` (its headers, without the
    blank line) then `body`, and nothing more; read until the server closes. A server that
    waits for the rest of the body times the read out (the test fails)."""
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=timeout_s) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n\r\n")
        if body:
            sock.sendall(body)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            # The server closed with the unread rest of the body in its buffer, so its kernel
            # reset the connection after the answer: what came before the reset is the answer.
            if not received:
                raise
    raw_head, _, content = received.partition(b"\r\n\r\n")
    lines = raw_head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, content


def _chunked(size: int, piece: int = 64 * 1024) -> bytes:
    """`size` bytes of a chunked body, without its last (empty) chunk: the sender is not done."""
    out = b""
    while size > 0:
        part = min(piece, size)
        out += b"%x\r\n" % part + b"x" * part + b"\r\n"
        size -= part
    return out


def _refused(answer: tuple[int, dict[str, str], bytes], limit: int) -> None:
    status, headers, content = answer
    assert status == 413, (status, content[:200])
    for name, value in SECURITY.items():
        assert headers.get(name) == value, (name, headers)
    assert headers.get("connection") == "close"
    assert f"exceeds {limit}" in json.loads(content)["detail"]


def test_a_content_length_over_the_limit_is_refused_before_a_byte_of_the_body(server_factory, sqlite_url: str) -> None:
    """The head alone is sent: the answer comes without the body (before, the server waited
    for 300 MB, and read them whole before it answered 401)."""
    server = server_factory(sqlite_url, auth=True, bootstrap_token=ADMIN, http_body_timeout_s=60.0)
    for method, path, limit in (
        ("POST", "/login", LOGIN_BODY_BYTES),
        ("POST", "/api/v1/rules", 1024 * 1024),
        ("POST", "/api/v1/silences", 1024 * 1024),
        ("POST", "/api/v1/runs/any/points", 8 * 1024 * 1024),
        ("PATCH", "/api/v1/runs/any", 8 * 1024 * 1024),
    ):
        head = f"{method} {path} HTTP/1.1\nHost: 127.0.0.1\nContent-Type: application/json\nContent-Length: 300000000"
        _refused(_answer(server, head), limit)


def test_a_chunked_body_is_refused_once_what_was_read_passes_the_limit(server_factory, sqlite_url: str) -> None:
    """No Content-Length: the body is counted as it arrives. The sender never finishes it;
    the server answers as soon as it has read past the limit, before any token is looked at."""
    server = server_factory(sqlite_url, auth=True, bootstrap_token=ADMIN, http_body_timeout_s=60.0)
    for method, path, limit in (
        ("POST", "/login", LOGIN_BODY_BYTES),
        ("POST", "/api/v1/rules", 1024 * 1024),
        ("POST", "/api/v1/tokens", 1024 * 1024),
    ):
        head = f"{method} {path} HTTP/1.1\nHost: 127.0.0.1\nContent-Type: application/json\nTransfer-Encoding: chunked"
        _refused(_answer(server, head, _chunked(limit + 128 * 1024)), limit)


def test_the_body_parser_answers_413_not_a_parse_error(server_factory, sqlite_url: str) -> None:
    """An admin's chunked 2 MiB rule, sent whole: FastAPI reads it before it validates it;
    what it answers is the limit's 413, not "error parsing the body" (400) or a 422."""
    server = server_factory(sqlite_url, auth=True, bootstrap_token=ADMIN)

    def body() -> Iterator[bytes]:
        yield b'{"name": "big", "metric": "'
        for _ in range(32):
            yield b"m" * 64 * 1024
        yield b'", "detector": "threshold", "params": {"op": ">", "value": 1}}'

    response = httpx.post(
        f"{server.url}/api/v1/rules", content=body(), headers={"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"}
    )
    assert response.status_code == 413, response.text
    assert response.json() == {"detail": f"body exceeds {1024 * 1024} bytes"}
    for name, value in SECURITY.items():
        assert response.headers.get(name) == value
    assert httpx.get(f"{server.url}/api/v1/rules", headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200


def test_each_route_has_its_own_limit(server_factory, database_url: str) -> None:
    """Points and config updates take what a frame takes; every other body the smaller
    KEEL_MAX_BODY_BYTES; /login a few KiB."""
    server = server_factory(database_url, max_body_bytes=64 * 1024, max_frame_bytes=1024 * 1024)
    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
    url = f"{server.url}/api/v1/runs/{run['id']}"
    rows = [{"step": step, "values": {"loss": 0.5}} for step in range(5000)]  # about 190 KB
    assert httpx.post(f"{url}/points", json={"rows": rows}).status_code == 200
    assert httpx.patch(url, json={"config": {"notes": "x" * 200_000}}).status_code == 200
    silence = {"matchers": {"run_name": "x" * 100_000}, "duration_s": 60}
    refused = httpx.post(f"{server.url}/api/v1/silences", json=silence)
    assert refused.status_code == 413 and "exceeds 65536" in refused.json()["detail"]
    login = httpx.post(f"{server.url}/login", data={"token": "t" * 5000})
    assert login.status_code == 413 and f"exceeds {LOGIN_BODY_BYTES}" in login.json()["detail"]
    too_many = [{"step": step, "values": {"loss": 0.5}} for step in range(5000, 35_000)]
    assert httpx.post(f"{url}/points", json={"rows": too_many}).status_code == 413
    assert httpx.get(f"{url}/keys").json()[0]["count"] == 5000  # nothing of the refused body stored


@pytest.mark.parametrize(
    ("method", "path", "limit"),
    [
        ("POST", "/api/v1/runs/r-1/points", "frame"),
        ("PATCH", "/api/v1/runs/r-1", "frame"),
        ("POST", "/_dash-update-component", "frame"),  # a page's callbacks carry a run's keys back
        ("POST", "/login", "login"),
        ("POST", "/api/v1/runs/r-1/commands", "body"),
        ("GET", "/api/v1/runs/r-1/points", "body"),
        ("POST", "/api/v1/runs/a/b/points", "body"),
        ("DELETE", "/api/v1/runs/r-1", "body"),
    ],
)
def test_the_limit_of_each_request(method: str, path: str, limit: str) -> None:
    settings = Settings(max_frame_bytes=5_000_000, max_body_bytes=300_000)
    expected = {"frame": 5_000_000, "body": 300_000, "login": LOGIN_BODY_BYTES}[limit]
    assert body_limit(settings, method, path) == expected
