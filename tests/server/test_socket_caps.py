"""Fair shares of the sockets: one token (or, with auth off, one address) holds at most its
cap of ingest and of live sockets, so it cannot lock out another team's trainers or pages;
the server holds at most its own cap; a refusal (1013) says which cap it hit. Real server,
real sockets."""

from __future__ import annotations

import json
from contextlib import ExitStack
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.support.raw_client import hello, new_run

ADMIN = "keel_test_admin_token_socket_caps_0123456789"


def _token(server: Any, name: str, scopes: list[str]) -> dict[str, str]:
    made = httpx.post(f"{server.url}/api/v1/tokens", json={"name": name, "scopes": scopes}, headers={"Authorization": f"Bearer {ADMIN}"})
    assert made.status_code == 201, made.text
    return {"Authorization": f"Bearer {made.json()['token']}"}


def _ingest(server: Any, headers: dict[str, str], stack: ExitStack) -> tuple[ClientConnection, dict[str, Any]]:
    ws = stack.enter_context(connect(f"{server.ws_url}/api/v1/ingest", additional_headers=headers, open_timeout=10))
    return ws, hello(ws, new_run())


def _live(server: Any, headers: dict[str, str], stack: ExitStack) -> ClientConnection:
    return stack.enter_context(connect(f"{server.ws_url}/api/v1/live", additional_headers=headers, open_timeout=10))


def _refused(ws: ClientConnection) -> tuple[int | None, str]:
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            ws.recv(timeout=10)
    return closed.value.rcvd.code if closed.value.rcvd else None, closed.value.rcvd.reason if closed.value.rcvd else ""


def test_one_token_cannot_take_every_ingest_or_live_slot(server_factory, sqlite_url) -> None:
    server = server_factory(
        sqlite_url, host="127.0.0.1", auth=True, bootstrap_token=ADMIN,
        max_ingest_connections=3, max_ingest_connections_per_token=2,
        max_live_connections=3, max_live_connections_per_token=2,
    )  # fmt: skip
    team_a = _token(server, "team-a", ["ingest", "read"])
    team_b = _token(server, "team-b", ["ingest", "read"])
    with ExitStack() as stack:
        for _ in range(2):
            ws, welcome = _ingest(server, team_a, stack)
            assert welcome["type"] == "welcome", welcome
        ws, refusal = _ingest(server, team_a, stack)  # a third of team A's: its own cap
        assert refusal["code"] == "overloaded" and "for this token or address (2)" in refusal["message"], refusal
        assert _refused(ws)[0] == 1013
        ws, welcome = _ingest(server, team_b, stack)  # team B still trains
        assert welcome["type"] == "welcome", welcome
        full = stack.enter_context(connect(f"{server.ws_url}/api/v1/ingest", additional_headers=team_b, open_timeout=10))
        refusal = json.loads(full.recv(timeout=10))  # the server's cap: refused before its hello
        assert refusal["code"] == "overloaded" and "on this server (3)" in refusal["message"], refusal

        pages = [_live(server, team_a, stack) for _ in range(2)]
        code, reason = _refused(_live(server, team_a, stack))
        assert code == 1013 and "live connections for this token or address (2)" in reason, reason
        pages.append(_live(server, team_b, stack))
        code, reason = _refused(_live(server, team_b, stack))
        assert code == 1013 and "live connections on this server (3)" in reason, reason
        pages[0].close()
    # Every slot given back: a page and a trainer of team A get in again.
    with ExitStack() as stack:
        ws, welcome = _ingest(server, team_a, stack)
        assert welcome["type"] == "welcome"
        page = _live(server, team_a, stack)
        with pytest.raises(TimeoutError):
            page.recv(timeout=0.5)  # open: nothing to push, and not closed
