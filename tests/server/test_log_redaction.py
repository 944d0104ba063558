"""No secret in `keel serve`'s log (server/redaction.py): a real server process, its whole
log read back after real requests that carry secrets in their URLs."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
from websockets.typing import Origin

from server.redaction import RedactSecrets, redact
from tests.support.local_server import free_port
from tests.support.server import keel_serve

QUERY_TOKEN = "qtok-6f1c2a9e0b7d"
LIVE_TOKEN = "ltok-93a0c1d2e4f5"
PAGE_TOKEN = "ptok-5b8e7d6c4a3f"
ACCESS_TOKEN = "atok-0a1b2c3d4e5f"
DB_PASSWORD = "dbpass-7c6b5a4d3e2f"
WEBHOOK_SECRET = "whsec_" + "c2VjcmV0LWtleS1mb3ItdGhlLXRlc3QtMDEyMzQ1Njc="
HOOK_TOKEN = "hooktok-1e2d3c4b5a69"
FAIL_AT_ONCE = {"KEEL_WEBHOOK_MAX_ATTEMPTS": "1"}
"""A failed webhook delivery is logged at once."""


def test_secrets_in_urls_and_bodies_never_reach_the_log(sqlite_url: str, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with keel_serve(sqlite_url, log, "--allow-private-webhooks", env=FAIL_AT_ONCE) as server:
        url, ws_url = server.url, server.ws_url
        assert httpx.get(f"{url}/api/v1/runs", params={"token": QUERY_TOKEN}).status_code == 200
        assert httpx.get(f"{url}/compare", params={"runs": "a,b", "token": PAGE_TOKEN}).status_code == 200
        params = {"access_token": ACCESS_TOKEN, "password": ACCESS_TOKEN, "secret": ACCESS_TOKEN}
        assert httpx.get(f"{url}/api/v1/runs", params=params).status_code == 200
        with connect(f"{ws_url}/api/v1/live?runs=x&token={LIVE_TOKEN}") as live:
            live.ping().wait(10)
        with pytest.raises(InvalidStatus), connect(f"{ws_url}/api/v1/live?token={LIVE_TOKEN}", origin=Origin("http://evil.example")):
            pass  # refused, and logged as such, with its URL
        hook = httpx.post(
            f"{url}/api/v1/webhooks",
            json={"url": f"http://127.0.0.1:{free_port()}/hook?token={HOOK_TOKEN}", "secret": WEBHOOK_SECRET},
        )
        assert hook.status_code == 201, hook.text
        assert httpx.post(f"{url}/api/v1/webhooks/{hook.json()['id']}/test").status_code == 202
        deadline = time.monotonic() + 30
        while "delivery" not in log.read_text() and time.monotonic() < deadline:  # the refused delivery
            time.sleep(0.1)
    text = log.read_text()
    # The requests are in the log, their secrets are not.
    assert '"GET /api/v1/runs?token=*** HTTP/1.1" 200' in text
    assert "/compare?runs=a%2Cb&token=*** HTTP/1.1" in text
    assert "access_token=***&password=***&secret=***" in text
    assert '"WebSocket /api/v1/live?runs=x&token=***" [accepted]' in text
    assert '"WebSocket /api/v1/live?token=***" 403' in text
    assert "webhook 1 delivery" in text and "failed" in text
    for secret in (QUERY_TOKEN, PAGE_TOKEN, ACCESS_TOKEN, LIVE_TOKEN, WEBHOOK_SECRET, HOOK_TOKEN):
        assert secret not in text, secret


def test_the_database_password_never_reaches_the_log(postgres_url: str, tmp_path: Path) -> None:
    # The test PostgreSQL trusts local connections: any password is accepted.
    database_url = make_url(postgres_url).set(password=DB_PASSWORD).render_as_string(hide_password=False)
    log = tmp_path / "serve.log"
    with keel_serve(database_url, log, env=FAIL_AT_ONCE) as server:
        assert httpx.get(f"{server.url}/api/v1/runs", params={"token": QUERY_TOKEN}).status_code == 200
    text = log.read_text()
    assert "(database: postgresql://postgres:***@127.0.0.1" in text
    assert "token=***" in text
    assert DB_PASSWORD not in text and QUERY_TOKEN not in text


BOOTSTRAP = "bootstrap-admin-secret-7d1e0c9b"
"""An admin token the operator chose: not in Keel's token shape, so no pattern finds it."""
AUTH_PARAM = "authparam-4c3b2a1f0e9d"
AUTHORIZATION_PARAM = "authzparam-8e7d6c5b4a3f"
COOKIE_TOKEN = "cookietok-2b3c4d5e6f7a"
HEADER_TOKEN = "headertok-9f8e7d6c5b4a"


def test_credentials_under_other_names_the_bootstrap_token_and_trace_never_reach_the_log(sqlite_url: str, tmp_path: Path) -> None:
    """`?auth=` and `?authorization=Bearer%20...` were logged as sent; `--log-level trace`
    logged each request's raw scope (query string, cookie, headers); a bootstrap token
    not shaped like Keel's was logged wherever a client put it."""
    log = tmp_path / "serve.log"
    with keel_serve(sqlite_url, log, "--log-level", "trace", token=BOOTSTRAP) as server:
        url = server.url
        admin = {"Authorization": f"Bearer {BOOTSTRAP}"}
        assert httpx.get(f"{url}/api/v1/runs", params={"auth": AUTH_PARAM}, headers=admin).status_code == 200
        assert httpx.get(f"{url}/api/v1/runs?authorization=Bearer%20{AUTHORIZATION_PARAM}", headers=admin).status_code == 200
        assert httpx.get(f"{url}/api/v1/runs/{BOOTSTRAP}", headers=admin).status_code == 404  # a token pasted into a path
        assert httpx.get(f"{url}/api/v1/runs", params={"key": BOOTSTRAP}).status_code == 401
        assert httpx.get(f"{url}/api/v1/runs", headers={"Authorization": f"Bearer {HEADER_TOKEN}"}).status_code == 401
        assert httpx.get(f"{url}/", cookies={"keel_token": COOKIE_TOKEN}).status_code in (200, 303)
    text = log.read_text()
    assert "--log-level trace logs requests' headers and query strings unmasked; logging at debug instead" in text
    assert "ASGI [" not in text  # uvicorn's trace lines: each request's scope and messages
    assert '"GET /api/v1/runs?auth=*** HTTP/1.1" 200' in text
    assert '"GET /api/v1/runs?authorization=*** HTTP/1.1" 200' in text
    assert '"GET /api/v1/runs/*** HTTP/1.1" 404' in text
    assert '"GET /api/v1/runs?key=*** HTTP/1.1" 401' in text
    for secret in (BOOTSTRAP, AUTH_PARAM, AUTHORIZATION_PARAM, COOKIE_TOKEN, HEADER_TOKEN):
        assert secret not in text, secret


def test_a_database_password_given_as_a_query_parameter_is_masked(postgres_url: str, tmp_path: Path) -> None:
    # libpq takes the password as a URL parameter too; the test PostgreSQL accepts any.
    database_url = f"{postgres_url}?password={DB_PASSWORD}"
    log = tmp_path / "serve.log"
    with keel_serve(database_url, log) as server:
        assert httpx.get(f"{server.url}/api/v1/runs").status_code == 200
    text = log.read_text()
    assert "?password=***)" in text
    assert DB_PASSWORD not in text


def test_a_formatted_message_and_its_traceback_are_masked() -> None:
    import logging

    try:
        raise RuntimeError(f"could not reach postgresql://keel:{DB_PASSWORD}@db/keel")
    except RuntimeError:
        record = logging.LogRecord(
            "keel.test", logging.ERROR, __file__, 1, "connecting with password=%s to %s", (DB_PASSWORD, "db"), sys.exc_info()
        )
    assert RedactSecrets().filter(record)
    formatted = logging.Formatter().format(record)
    assert "connecting with password=*** to db" in formatted and "postgresql://keel:***@db/keel" in formatted
    assert DB_PASSWORD not in formatted


def test_what_is_masked_and_what_is_not() -> None:
    assert redact("/api/v1/runs?limit=5&token=abc&x=1") == "/api/v1/runs?limit=5&token=***&x=1"
    assert redact("redis://:pw@cache:6379 and http://127.0.0.1:8750/runs") == "redis://:***@cache:6379 and http://127.0.0.1:8750/runs"
    assert redact("Authorization: Bearer abc.def") == "Authorization: Bearer ***"
    assert redact("token keel_" + "x" * 43 + " here") == "token *** here"
    assert redact("step=3 token_count=5 tokens=7") == "step=3 token_count=5 tokens=7"
    assert redact("/runs?auth=a1&authorization=Bearer%20b2&credentials=c3&x=1") == "/runs?auth=***&authorization=***&credentials=***&x=1"
    assert redact("/hook/Bearer%20abc?q=1 and Bearer+def") == "/hook/Bearer%20***?q=1 and Bearer+***"
    # As uvicorn prints a scope: inside a bytes value.
    assert redact("'query_string': b'token=abc', (b'cookie', b'keel_token=def')") == "'query_string': b'token=***', (b'cookie', b'keel_token=***')"
    assert redact("author=me oauthor=x") == "author=me oauthor=x"


def test_the_servers_own_secrets_are_masked_whatever_their_shape() -> None:
    import logging

    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5", "GET", f"/api/v1/runs/{BOOTSTRAP}x", "1.1", 404), None)  # fmt: skip
    assert RedactSecrets(secrets=[BOOTSTRAP, None, "keel"]).filter(record)  # type: ignore[list-item]
    assert record.getMessage() == '127.0.0.1:5 - "GET /api/v1/runs/***x HTTP/1.1" 404'
    # Too short to mask by value (compose's database password is "keel"): ordinary words stay.
    other = logging.LogRecord("keel.server", logging.INFO, __file__, 1, "keel started", None, None)
    RedactSecrets(secrets=["keel"]).filter(other)
    assert other.getMessage() == "keel started"
