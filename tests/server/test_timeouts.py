"""Every stage of a connection has a deadline (docs/security.md): a client that stalls
anywhere is closed, and a socket that has not said hello holds no ingest slot."""

from __future__ import annotations

import json
import socket
import time
from contextlib import ExitStack

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from tests.support.raw_client import hello, new_run, open_ingest, points, recv

TIMEOUTS = {"http_header_timeout_s": 1.0, "http_body_timeout_s": 1.0}


def _raw(server, sent: bytes) -> socket.socket:  # type: ignore[no-untyped-def]
    port = int(server.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    if sent:
        sock.sendall(sent)
    return sock


def _closed_within(sock: socket.socket, limit_s: float) -> tuple[float, bytes]:
    """Read until the server closes the connection; how long that took, and what came."""
    start = time.monotonic()
    sock.settimeout(limit_s)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {limit_s} s (got {received!r})")
    finally:
        sock.close()
    return time.monotonic() - start, received


def _closes_with(ws: ClientConnection, close_code: int, error_code: str, says: str = "") -> None:
    message = recv(ws)
    assert message["type"] == "error" and message["code"] == error_code, message
    assert says in message["message"], message
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == close_code


def _until(condition, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_half_sent_request_line_is_closed(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url, **TIMEOUTS)
    took, received = _closed_within(_raw(server, b"GET /healthz HT"), limit_s=6)
    assert 0.8 < took < 4
    assert received.startswith(b"HTTP/1.1 408 ")


def test_silent_tcp_connection_is_closed(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url, **TIMEOUTS)
    took, _ = _closed_within(_raw(server, b""), limit_s=6)
    assert took < 4


def test_half_sent_headers_of_a_websocket_upgrade_are_closed(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url, **TIMEOUTS)
    head = b"GET /api/v1/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    took, _ = _closed_within(_raw(server, head), limit_s=6)
    assert took < 4


def test_next_request_on_a_kept_alive_connection_has_a_deadline_too(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url, **TIMEOUTS, http_keep_alive_s=30)
    sock = _raw(server, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    first = b""
    while not first.endswith(b'{"status":"ok"}'):
        first += sock.recv(65536)
    assert first.startswith(b"HTTP/1.1 200 ")
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost:")
    took, received = _closed_within(sock, limit_s=6)
    assert took < 4 and received.startswith(b"HTTP/1.1 408 ")


def test_slow_request_body_gets_408(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url, **TIMEOUTS)
    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
    head = (
        f"POST /api/v1/runs/{run['id']}/points HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    ).encode()
    took, received = _closed_within(_raw(server, head + b'{"rows": ['), limit_s=6)
    assert took < 4
    assert received.startswith(b"HTTP/1.1 408 "), received
    # The server is fine afterwards, and stored nothing of the cut-off body.
    assert httpx.get(f"{server.url}/api/v1/runs/{run['id']}/keys").json() == []


@pytest.mark.parametrize(
    ("method", "path", "content_type"),
    [
        ("POST", "/api/v1/rules", "application/json"),  # a body FastAPI parses
        ("PATCH", "/api/v1/runs/{run}", "application/json"),
        ("POST", "/api/v1/silences", "application/json"),
        ("POST", "/login", "application/x-www-form-urlencoded"),  # a form
    ],
)
def test_a_slow_body_gets_408_on_every_route_that_parses_it(server_factory, sqlite_url: str, method: str, path: str, content_type: str) -> None:
    """Whoever reads the body (FastAPI's parser, the login form), a body still incomplete at
    the deadline is answered 408, not the parser's 400."""
    server = server_factory(sqlite_url, **TIMEOUTS)
    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
    rules = httpx.get(f"{server.url}/api/v1/rules").json()
    head = (
        f"{method} {path.format(run=run['id'])} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: 1000\r\n\r\n"
    ).encode()
    took, received = _closed_within(_raw(server, head + b'{"name": '), limit_s=6)
    assert took < 4
    assert received.startswith(b"HTTP/1.1 408 "), received
    assert httpx.get(f"{server.url}/api/v1/rules").json() == rules  # nothing of the cut-off body is kept


def test_a_normal_request_and_a_steady_body_are_not_cut_off(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url, **TIMEOUTS)
    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
    body = json.dumps({"rows": [{"step": 0, "values": {"a": 1.0}}]}).encode()
    sock = _raw(server, (
        f"POST /api/v1/runs/{run['id']}/points HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode())
    for start in range(0, len(body), 8):  # in pieces, well within the deadline
        sock.sendall(body[start:start + 8])
        time.sleep(0.05)
    _, received = _closed_within(sock, limit_s=10)
    assert received.startswith(b"HTTP/1.1 200 "), received


def test_silent_ingest_socket_is_closed_after_the_hello_timeout(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url, ingest_hello_timeout_s=1.0)
    slots = server.app.state.components.ingest_slots  # type: ignore[attr-defined]
    start = time.monotonic()
    with open_ingest(server) as ws:
        _closes_with(ws, 4408, "timeout", "hello")
    assert 0.8 < time.monotonic() - start < 5
    _until(lambda: slots.open == 0)
    with open_ingest(server) as ws:  # and a prompt client is not cut off
        assert hello(ws, new_run())["type"] == "welcome"
        ws.send(points(0, [{"step": 0, "values": {"a": 1.0}}]))
        assert recv(ws) == {"type": "ack", "seq": 0}


def test_silent_sockets_do_not_lock_real_clients_out(server_factory, sqlite_url: str) -> None:
    # The outside tester's lockout: as many silent sockets as there are slots.
    server = server_factory(sqlite_url, max_ingest_connections=20, ingest_hello_timeout_s=60.0)
    with ExitStack() as silent:
        for _ in range(20):
            silent.enter_context(open_ingest(server))
        time.sleep(0.3)  # all accepted
        with open_ingest(server) as ws:
            assert hello(ws, new_run())["type"] == "welcome"


def test_ingest_slots_still_bound_streaming_clients(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url, max_ingest_connections=1)
    with open_ingest(server) as first, open_ingest(server) as second:
        # Both accepted (neither holds a slot yet); the first hello takes the only slot.
        assert hello(first, new_run())["type"] == "welcome"
        second.send(json.dumps({"type": "hello", "protocol": 1, "run": new_run()}))
        _closes_with(second, 1013, "overloaded")
        with open_ingest(server) as third:  # while it is taken, refused at once
            _closes_with(third, 1013, "overloaded")
    slots = server.app.state.components.ingest_slots  # type: ignore[attr-defined]
    _until(lambda: slots.open == 0)


def test_idle_ingest_socket_is_closed(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url, ingest_idle_timeout_s=1.0)
    with open_ingest(server) as ws:
        hello(ws, new_run())
        ws.send(points(0, [{"step": 0, "values": {"a": 1.0}}]))
        assert recv(ws) == {"type": "ack", "seq": 0}
        start = time.monotonic()
        _closes_with(ws, 4408, "timeout", "frame")
        assert 0.8 < time.monotonic() - start < 5


def test_unauthenticated_sockets_take_no_slot(server_factory, sqlite_url: str) -> None:
    admin = "keel_test_admin_token_0123456789abcdef"
    server = server_factory(sqlite_url, auth=True, bootstrap_token=admin, max_ingest_connections=1)
    from websockets.sync.client import connect

    url = f"{server.ws_url}/api/v1/ingest"
    with ExitStack() as strangers:
        for _ in range(3):
            strangers.enter_context(connect(url))
        with connect(url, additional_headers={"Authorization": f"Bearer {admin}"}) as ws:
            assert hello(ws, new_run())["type"] == "welcome"
