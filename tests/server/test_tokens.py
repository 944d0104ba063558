"""Tokens have a life cycle: created, listed, revoked; a revoked token stops working within
seconds everywhere, its open ingest and live sockets included (closed 4401)."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.support.monitor import keel
from tests.support.raw_client import new_run, points

ADMIN = "keel_admin_token_for_the_token_tests_0123456789"
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}


def _closed_4401(ws, timeout: float = 10.0) -> dict:  # type: ignore[no-untyped-def]
    """The error message before the close (if any), once the socket is closed with 4401."""
    said: dict = {}
    deadline = time.monotonic() + timeout
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            message = json.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            if message.get("type") == "error":
                said = message
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
    return said


def test_a_revoked_token_is_refused_everywhere_and_its_open_sockets_close(server_factory, sqlite_url) -> None:
    server = server_factory(sqlite_url, auth=True, bootstrap_token=ADMIN, token_recheck_s=0.2)
    api = f"{server.url}/api/v1"
    made = httpx.post(f"{api}/tokens", json={"name": "trainer-7", "scopes": ["ingest", "read", "admin"]}, headers=AS_ADMIN)
    assert made.status_code == 201, made.text
    token = made.json()["token"]
    headers = {"Authorization": f"Bearer {token}"}
    listed = httpx.get(f"{api}/tokens", headers=AS_ADMIN).json()
    assert [(t["name"], t["revoked"]) for t in listed] == [("bootstrap", False), ("trainer-7", False)]
    assert all("token" not in t and "token_hash" not in t for t in listed)

    run = new_run()
    with connect(f"{server.ws_url}/api/v1/ingest", additional_headers=headers) as ingest, connect(
        f"{server.ws_url}/api/v1/live?runs={run['id']}", additional_headers=headers
    ) as live:
        ingest.send(json.dumps({"type": "hello", "protocol": 1, "run": run}))
        assert json.loads(ingest.recv(timeout=10))["type"] == "welcome"
        ingest.send(points(0, [{"step": 0, "values": {"m": 1.0}}]))
        assert json.loads(ingest.recv(timeout=10)) == {"type": "ack", "seq": 0}
        assert json.loads(live.recv(timeout=10))["type"] == "points"
        assert httpx.get(f"{api}/runs", headers=headers).status_code == 200

        revoked_at = time.monotonic()
        answer = httpx.delete(f"{api}/tokens/trainer-7", headers=AS_ADMIN)
        assert answer.status_code == 200 and answer.json() == {"name": "trainer-7", "revoked": 1}
        # REST refuses it at once, a command included.
        assert httpx.get(f"{api}/runs", headers=headers).status_code == 401
        assert httpx.post(f"{api}/runs/{run['id']}/commands", json={"action": "stop"}, headers=headers).status_code == 401
        said = _closed_4401(ingest)
        assert said.get("code") == "unauthorized" and "revoked" in said.get("message", "")
        _closed_4401(live)
        assert time.monotonic() - revoked_at < 5.0
    # A new socket with it is refused at the door; nothing it sent after the revocation was stored.
    with connect(f"{server.ws_url}/api/v1/ingest", additional_headers=headers) as again:
        _closed_4401(again)
    assert httpx.get(f"{api}/runs/{run['id']}/series", params={"key": "m"}, headers=AS_ADMIN).json()["steps"] == [0]
    assert httpx.delete(f"{api}/tokens/trainer-7", headers=AS_ADMIN).status_code == 404  # nothing live left
    assert [t["revoked"] for t in httpx.get(f"{api}/tokens", headers=AS_ADMIN).json()] == [False, True]
    # Only an admin manages tokens.
    reader = httpx.post(f"{api}/tokens", json={"name": "reader", "scopes": ["read"]}, headers=AS_ADMIN).json()["token"]
    assert httpx.get(f"{api}/tokens", headers={"Authorization": f"Bearer {reader}"}).status_code == 401


def test_keel_token_create_list_revoke(sqlite_url) -> None:
    created = keel("token", "create", "--name", "ci", "--scopes", "ingest", "--database-url", sqlite_url)
    assert created.returncode == 0, created.stdout + created.stderr
    token = created.stdout.splitlines()[0]
    assert token.startswith("keel_")
    listed = keel("token", "list", "--database-url", sqlite_url)
    assert listed.returncode == 0 and "ci" in listed.stdout and "ingest" in listed.stdout and "live" in listed.stdout
    assert token not in listed.stdout
    revoked = keel("token", "revoke", "ci", "--database-url", sqlite_url)
    assert revoked.returncode == 0 and "revoked 1 token" in revoked.stdout
    assert "revoked" in keel("token", "list", "--database-url", sqlite_url).stdout
    assert keel("token", "revoke", "ci", "--database-url", sqlite_url).returncode == 1  # none live
    assert keel("token", "revoke", "--database-url", sqlite_url).returncode == 2  # no name
