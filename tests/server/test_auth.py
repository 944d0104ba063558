"""Tokens: scoped, hashed, required off loopback; browsers sign in with a cookie."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.support.raw_client import new_run

ADMIN = "keel_test_admin_token_0123456789abcdef"


@pytest.fixture
def secured(server_factory, database_url):  # type: ignore[no-untyped-def]
    return server_factory(database_url, auth=True, bootstrap_token=ADMIN)


def _closed_with(ws, code: int) -> None:  # type: ignore[no-untyped-def]
    message = json.loads(ws.recv(timeout=10))
    assert message["type"] == "error" and message["code"] == "unauthorized"
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == code


def test_rest_needs_a_token_with_the_right_scope(secured) -> None:
    assert httpx.get(f"{secured.url}/healthz").status_code == 200
    assert httpx.get(f"{secured.url}/api/v1/runs").status_code == 401
    assert httpx.get(f"{secured.url}/api/v1/runs", headers={"Authorization": "Bearer nope"}).status_code == 401
    admin = {"Authorization": f"Bearer {ADMIN}"}
    assert httpx.get(f"{secured.url}/api/v1/runs", headers=admin).json() == []
    assert httpx.post(f"{secured.url}/api/v1/silences", json={"matchers": {"run_name": "x"}, "duration_s": 5}).status_code == 401
    assert httpx.post(f"{secured.url}/api/v1/silences", json={"matchers": {"run_name": "x"}, "duration_s": 5}, headers=admin).status_code == 201


def test_ingest_websocket_refuses_without_ingest_scope(secured, database_url) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "keel", "token", "create", "--scopes", "read", "--database-url", database_url],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    read_token = result.stdout.splitlines()[0]
    assert read_token.startswith("keel_")
    url = f"{secured.ws_url}/api/v1/ingest"
    with connect(url) as ws:
        _closed_with(ws, 4401)
    with connect(url, additional_headers={"Authorization": f"Bearer {read_token}"}) as ws:
        _closed_with(ws, 4401)
    assert httpx.get(f"{secured.url}/api/v1/runs", headers={"Authorization": f"Bearer {read_token}"}).status_code == 200
    with connect(url, additional_headers={"Authorization": f"Bearer {ADMIN}"}) as ws:
        ws.send(json.dumps({"type": "hello", "protocol": 1, "run": new_run()}))
        assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
    with connect(f"{secured.ws_url}/api/v1/live") as live:
        _closed_with(live, 4401)


def test_dashboard_pages_redirect_to_login_and_cookie_signs_in(secured) -> None:
    page = httpx.get(f"{secured.url}/", follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"] == "/login"
    bad = httpx.post(f"{secured.url}/login", data={"token": "wrong"})
    assert bad.status_code == 401
    good = httpx.post(f"{secured.url}/login", data={"token": ADMIN}, follow_redirects=False)
    assert good.status_code == 303 and "keel_token" in good.cookies
    with httpx.Client(cookies=good.cookies) as client:
        assert client.get(f"{secured.url}/", follow_redirects=False).status_code == 200
        assert client.get(f"{secured.url}/api/v1/runs").status_code == 200


def test_serve_refuses_a_public_interface_with_auth_off(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "keel", "serve", "--host", "0.0.0.0", "--port", "1", "--database-url", f"sqlite:///{tmp_path}/x.db"],
        capture_output=True, text=True, timeout=60, env={"KEEL_AUTH": "false", "PATH": ""},
    )
    assert result.returncode == 2 and "refusing" in result.stdout


def test_a_token_in_the_query_string_is_not_accepted(secured) -> None:
    # URLs end up in access logs, proxies and browser history: a token belongs in a header or the cookie.
    assert httpx.get(f"{secured.url}/api/v1/runs", params={"token": ADMIN}).status_code == 401
    assert httpx.get(f"{secured.url}/", params={"token": ADMIN}, follow_redirects=False).status_code == 303
    with connect(f"{secured.ws_url}/api/v1/live?token={ADMIN}") as live:
        _closed_with(live, 4401)
    with connect(f"{secured.ws_url}/api/v1/ingest?token={ADMIN}") as ws:
        _closed_with(ws, 4401)


def test_the_live_websocket_accepts_the_login_cookie(secured) -> None:
    # A browser's same-origin websocket sends the cookie that /login set.
    run = new_run()
    with connect(f"{secured.ws_url}/api/v1/live?runs={run['id']}", additional_headers={"Cookie": f"keel_token={ADMIN}"}) as live:
        with connect(f"{secured.ws_url}/api/v1/ingest", additional_headers={"Authorization": f"Bearer {ADMIN}"}) as ws:
            ws.send(json.dumps({"type": "hello", "protocol": 1, "run": run}))
            assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
            ws.send(json.dumps({"type": "points", "seq": 0, "rows": [{"step": 3, "values": {"m": 1.0}}]}))
            assert json.loads(ws.recv(timeout=10))["type"] == "ack"
        message = json.loads(live.recv(timeout=10))
    assert message["type"] == "points" and message["rows"][0]["step"] == 3
