"""Foreign Host names and foreign pages are refused (server/origins.py), over real sockets:
DNS rebinding (a page's own name pointed at 127.0.0.1) and cross-site writes and websockets."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Origin

from server.app import create_app
from server.config import Settings
from server.origins import SitePolicy
from tests.support.raw_client import hello, new_run, open_ingest

SILENCE = {"matchers": {"run_name": "x"}, "duration_s": 60}
EVIL = "http://evil.example"


def _port(server: Any) -> int:
    return int(server.url.rsplit(":", 1)[1])


def open_socket(server: Any, path: str, *, host: str | None = None, origin: str | None = None) -> ClientConnection:
    """A websocket to the test server whatever `host` says: the name is sent in Host, never
    resolved (as after a DNS rebinding)."""
    sock = socket.create_connection(("127.0.0.1", _port(server)), timeout=10)
    uri = f"ws://{host or f'127.0.0.1:{_port(server)}'}{path}"
    return connect(uri, sock=sock, origin=None if origin is None else Origin(origin), open_timeout=10)


def refused_socket(server: Any, path: str, **headers: str) -> tuple[int, str]:
    with pytest.raises(InvalidStatus) as refused, open_socket(server, path, **headers):
        pass
    response = refused.value.response
    return response.status_code, bytes(response.body or b"").decode()


def dash_callback(server: Any, output: str, origin: str) -> httpx.Response:
    """The POST a page of the dashboard makes to run the callback that updates `output`."""
    httpx.get(f"{server.url}/")  # Dash sets itself up on its first page
    dependency = next(d for d in httpx.get(f"{server.url}/_dash-dependencies").json() if output in d["output"])
    outputs = [dict(zip(("id", "property"), o.rsplit(".", 1), strict=True)) for o in dependency["output"].strip(".").split("...")]
    body = {
        "output": dependency["output"], "outputs": outputs, "changedPropIds": [], "state": [],
        "inputs": [{**given, "value": None} for given in dependency["inputs"]],
    }
    return httpx.post(f"{server.url}/_dash-update-component", json=body, headers={"Origin": origin})


def test_a_foreign_host_is_refused_on_rest_pages_and_websockets(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url)
    for method, path in (("GET", "/api/v1/runs"), ("POST", "/api/v1/silences"), ("GET", "/"), ("GET", "/healthz")):
        response = httpx.request(method, f"{server.url}{path}", json=SILENCE, headers={"Host": "evil.example"})
        assert response.status_code == 400, path
        assert "'evil.example' is not a name of this server" in response.text and "KEEL_ALLOWED_HOSTS" in response.text
    for path in ("/api/v1/live", "/api/v1/ingest"):
        status, text = refused_socket(server, path, host=f"evil.example:{_port(server)}")
        assert status == 400 and "KEEL_ALLOWED_HOSTS" in text
    # Nothing got through: no silence was created.
    assert httpx.get(f"{server.url}/api/v1/silences").json() == []


def test_loopback_names_and_addresses_are_served(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url)
    port = _port(server)
    for host in (f"localhost:{port}", "localhost", "LOCALHOST.", f"127.0.0.1:{port}", f"[::1]:{port}", "10.1.2.3:8750"):
        assert httpx.get(f"{server.url}/api/v1/runs", headers={"Host": host}).status_code == 200, host
    with open_socket(server, "/api/v1/ingest", host=f"localhost:{port}") as ws:
        assert hello(ws, new_run())["type"] == "welcome"


def test_configured_names_are_served(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url, allowed_hosts=["keel.example"], public_url="https://keel.public.example/")
    for host, status in (("keel.example", 200), ("keel.example:8443", 200), ("keel.public.example", 200), ("other.example", 400)):
        assert httpx.get(f"{server.url}/api/v1/runs", headers={"Host": host}).status_code == status, host
    with open_socket(server, "/api/v1/live", host="keel.public.example") as live:
        live.ping().wait(10)
    anything = server_factory(sqlite_url, allowed_hosts=["*"])
    assert httpx.get(f"{anything.url}/api/v1/runs", headers={"Host": "whatever.example"}).status_code == 200


def test_a_foreign_page_cannot_write(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url)
    created = httpx.post(f"{server.url}/api/v1/silences", json=SILENCE).json()  # no Origin: a script
    for origin in (EVIL, "null", f"http://localhost:{_port(server)}", f"http://127.0.0.1:{_port(server) + 1}"):
        response = httpx.post(f"{server.url}/api/v1/silences", json=SILENCE, headers={"Origin": origin})
        assert response.status_code == 403 and "cross-site POST" in response.text, origin
        response = httpx.delete(f"{server.url}/api/v1/silences/{created['id']}", headers={"Origin": origin})
        assert response.status_code == 403, origin
    assert [s["active"] for s in httpx.get(f"{server.url}/api/v1/silences").json()] == [True]
    # A foreign page may still fetch (it cannot read the answer: no CORS headers are sent).
    reads = httpx.get(f"{server.url}/api/v1/runs", headers={"Origin": EVIL})
    assert reads.status_code == 200 and "access-control-allow-origin" not in reads.headers


def test_a_foreign_page_cannot_open_the_live_or_ingest_socket(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url)
    for path in ("/api/v1/live", "/api/v1/ingest"):
        for origin in (EVIL, "null"):
            status, text = refused_socket(server, path, origin=origin)
            assert status == 403 and "cross-site websocket" in text, (path, origin)
    assert httpx.get(f"{server.url}/api/v1/runs").json() == []


def test_the_servers_own_pages_and_clients_without_origin_are_served(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url)
    run = new_run()
    with open_ingest(server) as ws:  # the Monitor sends no Origin
        assert hello(ws, run)["type"] == "welcome"
    created = httpx.post(f"{server.url}/api/v1/silences", json=SILENCE, headers={"Origin": server.url})
    assert created.status_code == 201
    expired = httpx.delete(f"{server.url}/api/v1/silences/{created.json()['id']}", headers={"Origin": server.url})
    assert expired.status_code == 200 and expired.json()["active"] is False
    with open_socket(server, "/api/v1/live", origin=server.url) as live:
        live.ping().wait(10)
    with open_socket(server, "/api/v1/live", host=f"localhost:{_port(server)}", origin=f"http://localhost:{_port(server)}") as live:
        live.ping().wait(10)
    # The dashboard's callback POST; its rows come from the API, read in-process (dashboard/data.py).
    table = dash_callback(server, "runs-grid.rowData", server.url)
    assert table.status_code == 200
    assert [row["id"] for row in table.json()["response"]["runs-grid"]["rowData"]] == [run["id"]]
    assert dash_callback(server, "runs-grid.rowData", EVIL).status_code == 403


def test_configured_origins_may_write_and_open_sockets(server_factory, sqlite_url: str) -> None:
    server = server_factory(
        sqlite_url, allowed_origins=["https://notebook.example", "http://app.example:3000"], public_url="https://keel.public.example"
    )
    # Behind a proxy that ends TLS, the request arrives for an internal address: the public
    # origin is trusted all the same.
    for origin in ("https://notebook.example", "http://APP.example:3000", "https://keel.public.example"):
        response = httpx.post(f"{server.url}/api/v1/silences", json=SILENCE, headers={"Origin": origin})
        assert response.status_code == 201, origin
        with open_socket(server, "/api/v1/live", origin=origin) as live:
            live.ping().wait(10)
    for origin in ("http://notebook.example", "http://app.example:3001", "https://keel.public.example:8443"):
        assert httpx.post(f"{server.url}/api/v1/silences", json=SILENCE, headers={"Origin": origin}).status_code == 403, origin


def test_pages_may_not_be_framed_by_other_sites(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url)
    for path in ("/", "/api/v1/runs"):
        response = httpx.get(f"{server.url}{path}")
        assert response.headers["x-frame-options"] == "SAMEORIGIN"
        assert response.headers["content-security-policy"] == "frame-ancestors 'self'"
        assert response.headers["x-content-type-options"] == "nosniff"


def test_with_auth_off_only_the_servers_own_names_are_served() -> None:
    policy = SitePolicy.from_settings(Settings(host="127.0.0.1", public_url="https://keel.example.com"))
    assert all(policy.serves_host(h) for h in ("localhost:8750", "127.0.0.1:8750", "[::1]:8750", "KEEL.example.com"))
    assert not policy.serves_host("keel.lan:8750") and not policy.serves_host("evil.example")
    assert policy.trusts_origin("http://localhost:8750", "localhost:8750")
    assert not policy.trusts_origin("http://localhost:8750", "127.0.0.1:8750")
    named = SitePolicy.from_settings(Settings(host="keel.lan", auth=False, public_url="https://keel.example.com"))
    assert named.serves_host("keel.lan:8750") and not named.serves_host("keel-host:8750")
    assert named.trusts_origin("https://keel.example.com", "10.0.0.7:8750")


def test_with_auth_on_any_name_is_served_and_origins_are_still_checked() -> None:
    """Trainers reach a cluster's server as http://keel-host:8750 or, in compose, http://server:8750;
    a rebound page has no token or cookie to use, but a foreign page's write still carries the
    user's cookie: refused."""
    for settings in (Settings(host="0.0.0.0", public_url="http://127.0.0.1:8750"), Settings(host="127.0.0.1", auth=True)):
        policy = SitePolicy.from_settings(settings)
        assert all(policy.serves_host(h) for h in ("keel-host:8750", "server:8750", "evil.example", "localhost"))
        assert not policy.trusts_origin("http://evil.example", "keel-host:8750")
        assert policy.trusts_origin("http://keel-host:8750", "keel-host:8750")


def test_allowed_lists_are_read_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_ALLOWED_HOSTS", "keel.example, keel.lan")
    monkeypatch.setenv("KEEL_ALLOWED_ORIGINS", "https://notebook.example")
    settings = Settings()
    assert settings.allowed_hosts == ["keel.example", "keel.lan"]
    assert settings.allowed_origins == ["https://notebook.example"]


def test_an_origin_without_a_scheme_is_a_configuration_error(sqlite_url: str) -> None:
    with pytest.raises(ValueError, match="KEEL_ALLOWED_ORIGINS entries are origins like https://"):
        create_app(Settings(database_url=sqlite_url, allowed_origins=["notebook.example"]))
    with pytest.raises(ValueError, match="KEEL_PUBLIC_URL must be an http"):
        create_app(Settings(database_url=sqlite_url, public_url="keel.example.com"))
