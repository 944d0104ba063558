"""Tokens: scoped, hashed, required off loopback; browsers sign in with a cookie."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
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


@pytest.mark.parametrize(
    ("method", "path", "body", "judged_status"),
    [
        ("POST", "/api/v1/rules", b"{not json", 422),  # parsed by FastAPI
        ("POST", "/api/v1/silences", b"\xff\xfe", 422),
        ("POST", "/api/v1/backtest", b"{", 422),
        ("PATCH", "/api/v1/runs/some-run", b"[1, 2", 400),  # parsed by the route, as a frame is
    ],
)
def test_a_body_that_is_not_json_is_refused_401_before_it_is_judged(
    secured, method: str, path: str, body: bytes, judged_status: int
) -> None:
    """Without a token, a body that does not parse says nothing about the route: 401, as a
    body that parses gets; with one, the parse error as before."""
    headers = {"Content-Type": "application/json"}
    refused = httpx.request(method, f"{secured.url}{path}", content=body, headers=headers)
    assert refused.status_code == 401, refused.text
    assert refused.headers["www-authenticate"] == "Bearer"
    wrong = httpx.request(method, f"{secured.url}{path}", content=body, headers={**headers, "Authorization": "Bearer keel_nope"})
    assert wrong.status_code == 401, wrong.text
    judged = httpx.request(method, f"{secured.url}{path}", content=body, headers={**headers, "Authorization": f"Bearer {ADMIN}"})
    assert judged.status_code == judged_status, judged.text


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


# -- failed authentications: limited per client address ---------------------------------

FAILURES = {"auth_failures_per_s": 0.1, "auth_failures_burst": 3}
"""Three failures, then one more every 10 s: slow enough that a loaded machine never refills the bucket mid-test."""


def _from(address: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=10)


def _socket_from(server, address: str, path: str, token: str):  # type: ignore[no-untyped-def]
    import socket

    sock = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])), source_address=(address, 0), timeout=10)
    return connect(f"{server.ws_url}{path}", sock=sock, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=10)


def _limited(response: httpx.Response) -> int:
    assert response.status_code == 429, (response.status_code, response.text)
    assert "too many failed authentications" in response.text
    return int(response.headers["Retry-After"])


def test_bad_bearer_tokens_are_limited_per_address_and_then_not_looked_up(server_factory, sqlite_url: str) -> None:
    """A client could try tokens as fast as the server answered 401 (the outside tester's finding)."""
    import time

    secured = server_factory(sqlite_url, auth=True, bootstrap_token=ADMIN, **FAILURES)
    runs = f"{secured.url}/api/v1/runs"
    with _from("127.0.0.2") as guesser:
        codes = [guesser.get(runs, headers={"Authorization": f"Bearer guess-{i}"}).status_code for i in range(3)]
        assert codes == [401, 401, 401]
        retry_after = _limited(guesser.get(runs, headers={"Authorization": "Bearer guess-3"}))
        assert 1 <= retry_after <= 10
        # While the address is limited, even a right token is not looked up (no oracle), nor a cookie.
        _limited(guesser.get(runs, headers={"Authorization": f"Bearer {ADMIN}"}))
        _limited(guesser.get(f"{secured.url}/", cookies={"keel_token": "guess-4"}))
        assert guesser.get(f"{secured.url}/healthz").status_code == 200  # no credential: served
        assert guesser.get(runs).status_code == 401
    with _from("127.0.0.1") as other:  # another address has its own bucket
        assert other.get(runs, headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200
        assert other.get(runs, headers={"Authorization": "Bearer nope"}).status_code == 401
    time.sleep(retry_after)
    with _from("127.0.0.2") as guesser:
        assert guesser.get(runs, headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200


def test_failed_logins_are_limited_per_address(server_factory, sqlite_url: str) -> None:
    secured = server_factory(sqlite_url, auth=True, bootstrap_token=ADMIN, **FAILURES)
    with _from("127.0.0.3") as browser:
        assert [browser.post(f"{secured.url}/login", data={"token": f"guess-{i}"}).status_code for i in range(3)] == [401] * 3
        refused = browser.post(f"{secured.url}/login", data={"token": ADMIN}, follow_redirects=False)
        assert _limited(refused) >= 1 and refused.headers["content-type"].startswith("text/html")
        assert browser.get(f"{secured.url}/login").status_code == 200  # the form itself is still served
    with _from("127.0.0.1") as browser:
        assert browser.post(f"{secured.url}/login", data={"token": ADMIN}, follow_redirects=False).status_code == 303


def test_bad_tokens_on_websockets_and_whoami_count_too(server_factory, sqlite_url: str) -> None:
    secured = server_factory(sqlite_url, auth=True, bootstrap_token=ADMIN, **FAILURES)
    with _socket_from(secured, "127.0.0.4", "/api/v1/ingest", "guess-0") as ws:
        _closed_with(ws, 4401)
    with _socket_from(secured, "127.0.0.4", "/api/v1/live", "guess-1") as ws:
        _closed_with(ws, 4401)
    with _from("127.0.0.4") as guesser:  # /whoami looks any token up: a failure like the others
        assert guesser.get(f"{secured.url}/api/v1/whoami", headers={"Authorization": "Bearer guess-2"}).status_code == 200
    with pytest.raises(InvalidStatus) as refused, _socket_from(secured, "127.0.0.4", "/api/v1/ingest", ADMIN):
        pass
    assert refused.value.response.status_code == 429 and int(refused.value.response.headers["Retry-After"]) >= 1
    with _socket_from(secured, "127.0.0.1", "/api/v1/ingest", ADMIN) as ws:  # another address
        ws.send(json.dumps({"type": "hello", "protocol": 1, "run": new_run()}))
        assert json.loads(ws.recv(timeout=10))["type"] == "welcome"


def test_a_token_with_characters_outside_ascii_is_refused_not_a_fault(secured) -> None:
    for headers in ({"Authorization": "Bearer jeton-\xe9".encode("latin-1")}, {"Cookie": "keel_token=jeton-\xe9".encode("latin-1")}):
        response = httpx.get(f"{secured.url}/api/v1/runs", headers=headers)
        assert response.status_code == 401, (headers, response.status_code)
        assert httpx.get(f"{secured.url}/", headers=headers, follow_redirects=False).status_code == 303


def test_the_failure_limit_defaults() -> None:
    from server.config import Settings

    settings = Settings()
    assert (settings.auth_failures_per_s, settings.auth_failures_burst) == (0.2, 20)


# -- webhook URLs: whole for an admin only -----------------------------------------------


def test_a_read_token_sees_webhook_urls_masked_an_admin_whole(server_factory, database_url) -> None:
    """A Slack or Discord webhook URL is its secret; a read token listed them whole."""
    secured = server_factory(database_url, auth=True, bootstrap_token=ADMIN, allow_private_webhooks=True)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    url = "http://127.0.0.1:9/services/T000/B000/slacksecret0123?token=qsecret"
    created = httpx.post(f"{secured.url}/api/v1/webhooks", json={"url": url, "format": "slack"}, headers=admin)
    assert created.status_code == 201 and created.json()["url"] == url
    result = subprocess.run(
        [sys.executable, "-m", "keel", "token", "create", "--scopes", "read,ingest", "--database-url", database_url],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    reader = {"Authorization": f"Bearer {result.stdout.splitlines()[0]}"}
    listed = httpx.get(f"{secured.url}/api/v1/webhooks", headers=reader)
    assert listed.status_code == 200
    assert [hook["url"] for hook in listed.json()] == ["http://127.0.0.1:9/***"]
    for secret in ("slacksecret0123", "qsecret", "services"):
        assert secret not in listed.text, secret
    assert [hook["url"] for hook in httpx.get(f"{secured.url}/api/v1/webhooks", headers=admin).json()] == [url]
    # With auth off, whoever reaches the server is an admin: whole.
    local = server_factory(database_url, allow_private_webhooks=True)
    assert [hook["url"] for hook in httpx.get(f"{local.url}/api/v1/webhooks").json()] == [url]
