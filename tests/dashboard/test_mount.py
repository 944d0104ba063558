"""Dash mounted on the FastAPI app: pages served, API routes untouched (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import re

import httpx
from websockets.sync.client import connect

from dashboard.app import ASSETS, LIVE_PARTS
from tests.support.toy_runs import LiveRun

DASH_ENTRY = 'id="react-entry-point"'


def test_pages_are_served_with_the_live_script(server) -> None:
    # A fresh server, first request straight to /compare: assets must already be in the page.
    for path in ("/compare?runs=a,b", "/", "/runs/abc", "/compare"):
        response = httpx.get(f"{server.url}{path}")
        assert response.status_code == 200, path
        assert response.headers["content-type"].startswith("text/html")
        assert DASH_ENTRY in response.text and "<title>Keel</title>" in response.text
        parts = re.findall(r'src="/assets/live/(\w+)\.js\?m=[\d.]+"', response.text)
        assert parts == ["math", "charts", "overlay", "scheduler", "tally", "socket", "start"], path  # in this order
        # ... after React (they are plain scripts) and before Dash's renderer, which draws the page
        scripts = re.findall(r'<script[^>]*src="([^"?]+)', response.text)
        renderer = next(i for i, src in enumerate(scripts) if "dash_renderer" in src)
        assert max(i for i, src in enumerate(scripts) if "/assets/live/" in src) < renderer, path
    script = httpx.get(f"{server.url}/assets/live/charts.js", headers={"accept-encoding": "gzip"})
    assert script.status_code == 200 and "extendTraces" in script.text
    assert script.headers["content-encoding"] == "gzip"  # compressed like the rest of the page
    assert httpx.get(f"{server.url}/_dash-layout").json()["type"] == "Div"


def _find(component: object, found: dict[str, dict]) -> dict[str, dict]:
    """Every component with an id in a Dash layout's JSON, by id."""
    if isinstance(component, dict):
        if isinstance(component.get("props"), dict):
            if isinstance(component["props"].get("id"), str):
                found[component["props"]["id"]] = component["props"]
            _find(component["props"].get("children"), found)
    elif isinstance(component, list):
        for child in component:
            _find(child, found)
    return found


def test_a_page_gets_its_layout_with_its_page_already_built(server) -> None:
    """The layout a page fetches when it starts holds the page of its URL (the request's
    Referer), and says for which URL, so the router does not build it again: the charts ask
    for their data one round trip sooner. Without a Referer from this server, the shell alone."""
    url = f"{server.url}/compare?runs=a,b"
    built = _find(httpx.get(f"{server.url}/_dash-layout", headers={"Referer": url}).json(), {})
    assert built["page-built-for"]["data"] == "/compare?runs=a,b"
    assert built["page-state"]["data"]["runs"] == ["a", "b"] and built["page"]["children"] is not None
    run_page = _find(httpx.get(f"{server.url}/_dash-layout", headers={"Referer": f"{server.url}/runs/abc"}).json(), {})
    assert run_page["page-built-for"]["data"] == "/runs/abc" and run_page["page-state"]["data"]["runs"] == ["abc"]
    for headers in ({}, {"Referer": "http://elsewhere.example/compare?runs=a,b"}, {"Referer": "not a url"}):
        shell = _find(httpx.get(f"{server.url}/_dash-layout", headers=headers).json(), {})
        assert shell["page-built-for"]["data"] is None and shell["page"]["children"] is None, headers
        assert "page-state" not in shell, headers


def test_every_live_script_is_in_the_declared_order_once() -> None:
    """A part added to assets/live/ must be listed in LIVE_PARTS (Dash no longer loads the
    folder by itself), and a listed part must exist."""
    on_disk = sorted(path.stem for path in (ASSETS / "live").iterdir())
    assert on_disk == sorted(LIVE_PARTS) and len(set(LIVE_PARTS)) == len(LIVE_PARTS)


def test_api_routes_keep_working_next_to_dash(server) -> None:
    run = LiveRun(server, "mounted", "g")
    run.history(3)
    run.close()
    runs = httpx.get(f"{server.url}/api/v1/runs")
    assert runs.status_code == 200 and [r["name"] for r in runs.json()] == ["mounted"]
    assert httpx.get(f"{server.url}/api/v1/runs/{run.id}").json()["group"] == "g"
    series = httpx.get(
        f"{server.url}/api/v1/runs/{run.id}/series", params={"key": "reward/mean"}
    ).json()
    assert series["steps"] == [0, 1, 2]
    assert httpx.get(f"{server.url}/api/v1/alerts", params={"run_id": run.id}).status_code == 200
    assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{server.url}/readyz").json() == {"status": "ok"}
    docs = httpx.get(f"{server.url}/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    paths = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    assert "/api/v1/runs" in paths and "/api/v1/runs/{run_id}/series" in paths
    assert not [p for p in paths if "_dash" in p or "{path" in p]  # Dash stays out of the API docs


def test_unknown_api_paths_are_json_404_not_the_dashboard(server) -> None:
    for method in ("GET", "POST", "DELETE"):
        response = httpx.request(method, f"{server.url}/api/v1/no-such-route")
        assert response.status_code == 404, method
        assert response.headers["content-type"] == "application/json"
        assert response.json() == {"detail": "Not Found"}
    assert httpx.get(f"{server.url}/api/v1/runs/unknown").status_code == 404


def test_api_routes_come_before_the_dash_catch_all(server) -> None:
    routes = server.app.router.routes
    paths = [getattr(r, "path", None) for r in routes]
    catch_all = paths.index("{path:path}")  # Dash adds it at startup, so it is last
    # API routers (included as nested routers), docs and the API fallback all match first.
    api = [
        i
        for i, p in enumerate(paths)
        if p is None or p in ("/docs", "/openapi.json", "/api/{path:path}")
    ]
    assert len(api) >= 5 and max(api) < catch_all


def test_live_websocket_still_pushes_next_to_dash(server) -> None:
    run = LiveRun(server, "pushed", None)
    with connect(f"{server.ws_url}/api/v1/live?runs={run.id}", open_timeout=10) as live:
        run.send([{"step": 5, "values": {"grad/norm": "inf"}}])
        message = json.loads(live.recv(timeout=10))
    run.close()
    assert message["type"] == "points" and message["rows"][0]["values"] == {"grad/norm": "inf"}


def test_wrong_method_on_an_api_route_is_still_405(server) -> None:
    response = httpx.delete(f"{server.url}/api/v1/runs")
    assert response.status_code == 405 and "GET" in response.headers["allow"]
