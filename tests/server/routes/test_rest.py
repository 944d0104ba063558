"""REST: run listing, POST points, health, stale status, live push."""

from __future__ import annotations

import json
import time

import httpx
from websockets.sync.client import connect

from tests.support.raw_client import hello, new_run, open_ingest, points, recv, series


def test_post_points_has_websocket_storage_semantics(server) -> None:
    run = new_run("rest")
    with open_ingest(server) as ws:
        hello(ws, run)
    url = f"{server.url}/api/v1/runs/{run['id']}/points"
    body = {"rows": [{"step": 0, "values": {"a": 1.5, "b": "-inf"}}, {"step": 1, "values": {"a": "nan"}}]}
    response = httpx.post(url, json=body)
    assert response.status_code == 200, response.text
    assert response.json() == {"stored_rows": 2, "last_step": 1}
    # Resent: a stored point keeps its first value.
    assert httpx.post(url, json={"rows": [{"step": 0, "values": {"a": 2.0}}]}).status_code == 200
    assert series(server, run["id"], "a")["values"] == [1.5, "nan"]
    assert series(server, run["id"], "b")["values"] == ["-inf"]


def test_post_points_errors_lose_nothing(server) -> None:
    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, [{"step": 0, "values": {"a": 1.0}}]))
        assert recv(ws)["type"] == "ack"
    url = f"{server.url}/api/v1/runs/{run['id']}/points"
    assert httpx.post(f"{server.url}/api/v1/runs/unknown/points", json={"rows": []}).status_code == 404
    assert httpx.post(url, content=b"{oops").status_code == 400
    bad = httpx.post(url, json={"rows": [{"step": 1, "values": {"a": 1}}, {"step": "two", "values": {}}]})
    assert bad.status_code == 422 and "step" in bad.json()["detail"][0]["msg"]
    too_many = httpx.post(url, json={"rows": [{"step": s, "values": {"a": 1}} for s in range(10_001)]})
    assert too_many.status_code == 413
    # The invalid request is all-or-nothing: its valid first row was not stored.
    assert series(server, run["id"], "a")["steps"] == [0]


def test_run_listing_fields_filters_and_unknown(server) -> None:
    a, b = new_run("a", group="is", project="p1", tags=["x"]), new_run("b", group="cispo", project="p2")
    for run in (a, b):
        with open_ingest(server) as ws:
            hello(ws, run)
            ws.send(points(0, [{"step": 7, "values": {"m": 1}}]))
            recv(ws)
    runs = httpx.get(f"{server.url}/api/v1/runs").json()
    assert {r["name"] for r in runs} == {"a", "b"}
    first = next(r for r in runs if r["name"] == "a")
    assert set(first) >= {"id", "name", "project", "group", "status", "last_step", "started_at", "last_seen_at", "tags"}
    assert first["status"] == "running" and first["last_step"] == 7 and first["tags"] == ["x"]
    assert [r["name"] for r in httpx.get(f"{server.url}/api/v1/runs", params={"project": "p2"}).json()] == ["b"]
    assert [r["name"] for r in httpx.get(f"{server.url}/api/v1/runs", params={"group": "is"}).json()] == ["a"]
    assert httpx.get(f"{server.url}/api/v1/runs/nope").status_code == 404
    assert httpx.get(f"{server.url}/api/v1/runs/nope/keys").status_code == 404


def test_silent_running_run_is_reported_stale(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url, stale_after_s=0.5)
    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
        assert httpx.get(f"{server.url}/api/v1/runs/{run['id']}").json()["status"] == "running"
        time.sleep(0.8)
        assert httpx.get(f"{server.url}/api/v1/runs/{run['id']}").json()["status"] == "stale"
        assert [r["id"] for r in httpx.get(f"{server.url}/api/v1/runs", params={"status": "stale"}).json()] == [run["id"]]
        ws.send(points(0, [{"step": 0, "values": {"m": 1}}]))
        recv(ws)
        assert httpx.get(f"{server.url}/api/v1/runs/{run['id']}").json()["status"] == "running"


def test_health_and_readiness(server) -> None:
    assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{server.url}/readyz").json() == {"status": "ok"}
    assert httpx.get(f"{server.url}/openapi.json").status_code == 200


def test_live_pushes_committed_points_of_subscribed_runs(server) -> None:
    watched, other = new_run("watched"), new_run("other")
    with connect(f"{server.ws_url}/api/v1/live?runs={watched['id']}") as live:
        for run in (other, watched):
            with open_ingest(server) as ws:
                hello(ws, run)
                ws.send(points(0, [{"step": 3, "time": 5.0, "values": {"m": "inf", "n": 0.25}}]))
                assert recv(ws)["type"] == "ack"
        message = json.loads(live.recv(timeout=10))
    assert message == {
        "type": "points",
        "run_id": watched["id"],
        "rows": [{"step": 3, "time": 5.0, "values": {"m": "inf", "n": 0.25}}],
    }


def test_latest_point_per_key(server) -> None:
    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, [{"step": s, "values": {"a": float(s), "b": "nan" if s == 4 else 1.0}} for s in range(5)]))
        ws.send(points(1, [{"step": 7, "values": {"a": "-inf"}}]))
        assert [recv(ws)["seq"] for _ in range(2)] == [0, 1]
    latest = httpx.get(f"{server.url}/api/v1/runs/{run['id']}/latest", params={"keys": "a,b,missing"}).json()
    assert latest == {"a": {"step": 7, "value": "-inf"}, "b": {"step": 4, "value": "nan"}}
    assert httpx.get(f"{server.url}/api/v1/runs/nope/latest", params={"keys": "a"}).status_code == 404
