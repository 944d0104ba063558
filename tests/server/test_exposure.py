"""What the server shows without being asked: pages open without login only at their exact
paths, and no command prints the database password."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
from sqlalchemy.engine import make_url

from tests.support.local_server import LocalServer
from tests.support.server import keel_serve

ADMIN = "keel_test_admin_token_0123456789abcdef"
PASSWORD = "s3cret-Passw0rd"


def test_paths_that_only_start_like_an_open_one_need_the_login(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url, auth=True, bootstrap_token=ADMIN)
    for path in ("/loginX", "/login/x", "/docsX", "/healthzfoo", "/readyz2", "/logout.html", "/openapi.jsonx", "/apix"):
        page = httpx.get(f"{server.url}{path}", follow_redirects=False)
        assert page.status_code == 303 and page.headers["location"] == "/login", path


def test_open_paths_stay_open(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url, auth=True, bootstrap_token=ADMIN)
    for path, status in (("/login", 200), ("/healthz", 200), ("/readyz", 200), ("/docs", 200), ("/openapi.json", 200)):
        assert httpx.get(f"{server.url}{path}", follow_redirects=False).status_code == status, path
    # Under /api/ the routes answer for themselves: 401, not a redirect to a form.
    assert httpx.get(f"{server.url}/api/v1/runs", follow_redirects=False).status_code == 401


def _url_with_password(postgres_url: str) -> str:
    # The test server trusts local connections: any password is accepted.
    return make_url(postgres_url).set(password=PASSWORD).render_as_string(hide_password=False)


def test_db_upgrade_prints_the_url_without_its_password(empty_postgres_url: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "keel", "db", "upgrade", "--database-url", _url_with_password(empty_postgres_url)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "database at head" in result.stdout
    assert PASSWORD not in result.stdout + result.stderr
    assert "***@" in result.stdout


def test_serve_prints_the_url_without_its_password(postgres_url: str, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with keel_serve(_url_with_password(postgres_url), log):
        pass
    line = next((line for line in log.read_text().splitlines() if "serving on" in line), "")
    assert "serving on" in line and "***@" in line and PASSWORD not in line


def test_the_local_server_is_served_like_keel_serve(sqlite_url: str) -> None:
    from server.serving import HeadDeadlineProtocol, KeelWebSocketProtocol

    local = LocalServer(sqlite_url, ws_ping_timeout_s=33.0, http_keep_alive_s=7, max_frame_bytes=1_000_000)
    config = local.server.config
    assert config.ws_ping_timeout == 33.0 and config.ws_ping_interval == local.settings.ws_ping_interval_s
    assert config.timeout_keep_alive == 7
    assert config.ws_max_size == 1_000_000 and config.ws is KeelWebSocketProtocol  # over it: 4413
    assert isinstance(config.http, type) and issubclass(config.http, HeadDeadlineProtocol)
    assert config.proxy_headers is False  # no forwarded header believed (KEEL_FORWARDED_ALLOW_IPS)
