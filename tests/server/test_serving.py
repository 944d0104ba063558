"""How the app is served (server/serving.py), over real sockets: the security headers on
every response, those uvicorn makes itself included; a websocket message over the frame
limit refused with Keel's 4413; forwarded headers believed only from named proxies."""

from __future__ import annotations

import json
import os
import socket
import struct
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Close, Frame, Opcode
from websockets.protocol import State
from websockets.sync.client import connect
from websockets.typing import Origin
from websockets.uri import parse_uri

from server.config import Settings
from tests.support.raw_client import hello, new_run, open_ingest, recv
from tests.support.server import keel_serve

SECURITY = {
    "x-frame-options": "SAMEORIGIN",
    "content-security-policy": "frame-ancestors 'self'",
    "x-content-type-options": "nosniff",
}
SILENCE = {"matchers": {"run_name": "x"}, "duration_s": 60}


def _port(server: Any) -> int:
    return int(server.url.rsplit(":", 1)[1])


def _secured(headers: Any, what: str) -> None:
    for name, value in SECURITY.items():
        assert headers.get(name) == value, (what, name, dict(headers))
        if hasattr(headers, "get_list"):  # httpx: each once, never twice
            assert headers.get_list(name) == [value], (what, name)


def _raw_response(server: Any, sent: bytes, timeout_s: float = 10.0) -> tuple[int, dict[str, str]]:
    """The status and headers of what the server answers to `sent`, read until it closes."""
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=timeout_s) as sock:
        sock.sendall(sent)
        received = b""
        while b"\r\n\r\n" not in received and (chunk := sock.recv(65536)):
            received += chunk
    head = received.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in head[1:]:
        name, _, value = line.partition(":")
        assert name.lower() not in headers, f"{name} twice"
        headers[name.lower()] = value.strip()
    return int(head[0].split()[1]), headers


def _refused_handshake(server: Any, path: str, **kwargs: Any) -> Any:
    with pytest.raises(InvalidStatus) as refused, connect(f"{server.ws_url}{path}", open_timeout=10, **kwargs):
        pass
    return refused.value.response


def test_every_response_carries_the_security_headers_refusals_included(server_factory, sqlite_url: str) -> None:
    """docs/security.md promises them on every response; OriginGuard's refusals, the
    responses uvicorn makes itself and refused websocket handshakes lacked them."""
    server = server_factory(sqlite_url, http_header_timeout_s=1.0, http_body_timeout_s=1.0)
    foreign_host = httpx.get(f"{server.url}/api/v1/runs", headers={"Host": "evil.example"})
    assert foreign_host.status_code == 400
    _secured(foreign_host.headers, "foreign Host (400)")
    foreign_page = httpx.post(f"{server.url}/api/v1/silences", json=SILENCE, headers={"Origin": "http://evil.example"})
    assert foreign_page.status_code == 403
    _secured(foreign_page.headers, "foreign page's write (403)")
    for response, what in (
        (httpx.get(f"{server.url}/"), "a page"),
        (httpx.get(f"{server.url}/api/v1/runs"), "an API read"),
        (httpx.get(f"{server.url}/api/v1/runs/nope"), "404"),
        (httpx.post(f"{server.url}/api/v1/silences", content=b"{"), "400 of the app"),
    ):
        _secured(response.headers, what)
    # Refused websocket handshakes: by OriginGuard, and by uvicorn (no such websocket route).
    refused = _refused_handshake(server, "/api/v1/live", origin=Origin("http://evil.example"))
    assert refused.status_code == 403
    _secured(refused.headers, "foreign page's websocket (403)")
    no_route = _refused_handshake(server, "/api/v1/no-such-socket")
    assert no_route.status_code == 403
    _secured(no_route.headers, "websocket without a route (uvicorn's 403)")
    # What uvicorn itself answers: a malformed request (400), a head too slow (408), a body too slow (408).
    status, headers = _raw_response(server, b"NOT HTTP AT ALL\r\n\r\n")
    assert status == 400
    _secured(headers, "malformed request (uvicorn's 400)")
    status, headers = _raw_response(server, b"GET /healthz HT")
    assert status == 408
    _secured(headers, "slow head (408)")
    status, headers = _raw_response(server, b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10\r\n\r\n{")
    assert status == 408
    _secured(headers, "slow body (408)")


def _ingest_socket(server: Any) -> tuple[socket.socket, ClientProtocol]:
    """An ingest websocket opened by hand (websockets' sans-I/O client), to send what a
    well-behaved client library would not: a frame header that announces a huge payload."""
    sock = socket.create_connection(("127.0.0.1", _port(server)), timeout=10)
    client = ClientProtocol(parse_uri(f"{server.ws_url}/api/v1/ingest"), max_size=None)
    client.send_request(client.connect())
    sock.sendall(b"".join(client.data_to_send()))
    while client.state is State.CONNECTING:
        client.receive_data(sock.recv(65536))
    assert client.state is State.OPEN, client.handshake_exc
    client.events_received()  # the handshake response
    return sock, client


def _events_until_closed(sock: socket.socket, client: ClientProtocol) -> list[Any]:
    events: list[Any] = []
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            data = b""
        if data:
            client.receive_data(data)
        else:
            client.receive_eof()
        events += client.events_received()
        if not data:
            return events


def test_a_frame_announced_over_the_limit_is_closed_with_4413_before_its_payload(server_factory, sqlite_url: str) -> None:
    """uvicorn closed it with 1009 (its ws_max_size, 1 MiB above Keel's limit); Keel's
    protocol says 4413. Refused from the frame header: nothing of the 20 MiB is sent."""
    server = server_factory(sqlite_url)  # the default limit: 8 MiB
    sock, client = _ingest_socket(server)
    with sock:
        sock.sendall(b"".join(_masked_text_header(20 * 1024 * 1024)) + b'{"type": "points"')
        events = _events_until_closed(sock, client)
    texts = [json.loads(bytes(e.data)) for e in events if isinstance(e, Frame) and e.opcode is Opcode.TEXT]
    closes = [Close.parse(bytes(e.data)) for e in events if isinstance(e, Frame) and e.opcode is Opcode.CLOSE]
    assert [t["code"] for t in texts] == ["too_large"] and "8388608" in texts[0]["message"]
    assert [c.code for c in closes] == [4413]


def _masked_text_header(length: int) -> list[bytes]:
    """The header of one unfragmented, masked text frame of `length` bytes (RFC 6455 5.2)."""
    return [bytes([0x81, 0x80 | 127]), struct.pack("!Q", length), os.urandom(4)]


def test_an_oversized_frame_sent_whole_is_closed_with_4413(server_factory, sqlite_url: str) -> None:
    """The outside tester's case: a 10 MiB frame on a server with the default 8 MiB limit."""
    server = server_factory(sqlite_url)
    run = new_run()
    with open_ingest(server) as ws:
        assert hello(ws, run)["type"] == "welcome"
        rows = [{"step": 0, "values": {"x": 1.0}, "pad": "p" * (10 * 1024 * 1024)}]
        try:
            ws.send(json.dumps({"type": "points", "seq": 0, "rows": rows}))
        except ConnectionClosed:
            pass  # the server may close before the client has written it all
        error = recv(ws)
        assert error["type"] == "error" and error["code"] == "too_large", error
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4413
    with open_ingest(server) as ws:  # the server is fine, and the run resumes
        assert hello(ws, run)["acked_seq"] == -1


def _write_as(server: Any, forwarded_for: str, source: str = "127.0.0.1") -> int:
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=10) as client:
        return client.post(f"{server.url}/api/v1/silences", json=SILENCE, headers={"X-Forwarded-For": forwarded_for}).status_code


def test_forwarded_addresses_are_not_believed_by_default(server_factory, sqlite_url: str) -> None:
    """uvicorn believes X-Forwarded-For from 127.0.0.1 by default: a client on the server's
    own machine could pick a new address per request and never meet the rate limit."""
    server = server_factory(sqlite_url, write_requests_per_s=0.1, write_requests_burst=2)
    statuses = [_write_as(server, f"10.9.9.{i}") for i in range(5)]
    assert statuses == [201, 201, 429, 429, 429]


def test_forwarded_addresses_are_believed_from_the_proxies_named(server_factory, sqlite_url: str) -> None:
    proxy = "127.0.0.2"
    server = server_factory(sqlite_url, write_requests_per_s=0.1, write_requests_burst=2, forwarded_allow_ips=[proxy])
    # Through the proxy: each client its own bucket.
    assert [_write_as(server, f"10.9.9.{i}", source=proxy) for i in range(5)] == [201] * 5
    assert [_write_as(server, "10.9.9.0", source=proxy) for _ in range(2)] == [201, 429]
    # Not from the proxy (127.0.0.1 too): the header is not believed, the connection's address counts.
    assert [_write_as(server, f"10.8.8.{i}") for i in range(3)] == [201, 201, 429]


def test_forwarded_allow_ips_takes_addresses_and_networks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_FORWARDED_ALLOW_IPS", "10.0.0.5, 10.1.0.0/16,::1")
    assert Settings().forwarded_allow_ips == ["10.0.0.5", "10.1.0.0/16", "::1"]
    monkeypatch.delenv("KEEL_FORWARDED_ALLOW_IPS")
    assert Settings().forwarded_allow_ips == []
    with pytest.raises(ValidationError, match="KEEL_FORWARDED_ALLOW_IPS entries are addresses or networks"):
        Settings(forwarded_allow_ips=["proxy.lan"])


def test_the_access_log_shows_the_connections_address_not_a_forwarded_one(sqlite_url: str, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with keel_serve(sqlite_url, log) as server:
        response = httpx.get(f"{server.url}/api/v1/runs?probe=1", headers={"X-Forwarded-For": "10.9.9.9"})
        assert response.status_code == 200
    lines = [line for line in log.read_text().splitlines() if "/api/v1/runs?probe=1" in line]
    assert len(lines) == 1 and "127.0.0.1:" in lines[0], lines
    assert "10.9.9.9" not in log.read_text()


def test_a_request_line_too_long_to_read_is_answered_400_not_reset(server_factory, sqlite_url: str) -> None:
    """A request line past h11's limit (a GET with a thousand run ids, 140 KB, which a fuzzer
    sends) had its connection reset while the client was still sending it: the server closed
    with the rest unread. It is answered 400 with the security headers, and the connection
    closes once the client has sent it all; the body is the API's error body (documented: a
    400 on every API route); the server goes on serving."""
    server = server_factory(sqlite_url)
    run_id = "%2AB%C3%859%7C%C2%80%C2%AF%C2%A7u%C2%A3%1B%14eV%C2%B3pl%F3%9A%AF%99" * 2
    target = "/api/v1/series?" + "&".join([f"run_id={run_id}"] * 1000) + "&key=x"
    request = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{_port(server)}\r\n\r\n".encode()
    assert len(request) > 100_000
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=10) as sock:
        sock.sendall(request)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and json.loads(body) == {"detail": "Invalid HTTP request received."}, received[:300]
    headers = {name.lower(): value for name, _, value in (line.decode("latin-1").partition(": ") for line in head.split(b"\r\n")[1:])}
    _secured(headers, "a request line too long (400)")
    assert httpx.get(f"{server.url}/api/v1/series?run_id={run_id}&key=x").status_code == 200
