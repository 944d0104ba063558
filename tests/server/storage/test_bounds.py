"""What a run may grow to (server/storage/bounds.py), over real servers on both databases:
its distinct metric keys (a frame or REST write whose new keys would pass the limit is
refused whole; keys the run has are always taken), and its config's JSON size (at the
hello that creates the run, and after each PATCH's merge)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from tests.support.raw_client import hello, new_run, open_ingest, points, recv, series


def _keys(prefix: str, count: int, value: float = 0.5) -> dict[str, float]:
    return {f"{prefix}{index:02d}": value for index in range(count)}


def _keys_of(server: Any, run_id: str) -> set[str]:
    return {info["key"] for info in httpx.get(f"{server.url}/api/v1/runs/{run_id}/keys").json()}


def _refusal_names_the_limit(message: str, limit: int, first_new: str) -> None:
    assert f"limit of {limit}" in message and "KEEL_MAX_KEYS_PER_RUN" in message, message
    assert repr(first_new) in message, message


def test_a_frame_whose_new_keys_pass_the_runs_limit_is_rejected_whole(server_factory, database_url: str) -> None:
    server = server_factory(database_url, max_keys_per_run=50)
    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, [{"step": 0, "values": _keys("a", 40)}]))
        assert recv(ws) == {"type": "ack", "seq": 0}
        # 40 keys the run has and 11 new: 51. Refused whole, the known keys' points too.
        ws.send(points(1, [{"step": 1, "values": {**_keys("a", 40), **_keys("b", 11)}}]))
        rejected = recv(ws)
        assert rejected["type"] == "reject" and rejected["seq"] == 1 and rejected["code"] == "too_large", rejected
        _refusal_names_the_limit(rejected["message"], 50, "b00")
        assert "and 6 more" in rejected["message"]  # five keys named, the others counted
        # Up to the limit, new keys are taken; past it, only the keys the run has.
        ws.send(points(2, [{"step": 2, "values": {**_keys("a", 40), **_keys("b", 10)}}]))
        assert recv(ws) == {"type": "ack", "seq": 2}
        ws.send(points(3, [{"step": 3, "values": {"a00": 1.0, "c00": 1.0}}]))
        assert recv(ws)["type"] == "reject"
        ws.send(points(4, [{"step": 4, "values": {**_keys("a", 40), **_keys("b", 10)}}]))
        assert recv(ws) == {"type": "ack", "seq": 4}
    assert _keys_of(server, run["id"]) == set(_keys("a", 40)) | set(_keys("b", 10))
    assert series(server, run["id"], "a00")["steps"] == [0, 2, 4]
    assert httpx.get(f"{server.url}/api/v1/runs/{run['id']}").json()["acked_seq"] == 4
    # REST points: 413 with the same reason, nothing stored; known keys still taken.
    url = f"{server.url}/api/v1/runs/{run['id']}/points"
    refused = httpx.post(url, json={"rows": [{"step": 5, "values": {"a00": 2.0, "rest": 2.0}}]})
    assert refused.status_code == 413, refused.text
    _refusal_names_the_limit(refused.json()["detail"], 50, "rest")
    assert httpx.post(url, json={"rows": [{"step": 6, "values": {"a00": 2.0}}]}).status_code == 200
    assert series(server, run["id"], "a00")["steps"] == [0, 2, 4, 6]
    assert len(_keys_of(server, run["id"])) == 50


def test_a_frame_written_in_several_transactions_is_checked_before_the_first(server_factory, database_url: str) -> None:
    """6,000 points: three transactions. Its new keys are in its last rows; the first
    transaction checks them all, so none of its points is stored."""
    server = server_factory(database_url, max_keys_per_run=50)
    run = new_run()
    known = _keys("a", 30)
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, [{"step": 0, "values": known}]))
        assert recv(ws)["type"] == "ack"
        rows = [{"step": step, "values": known} for step in range(1, 200)]
        ws.send(points(1, [*rows, {"step": 200, "values": {**known, **_keys("z", 21)}}]))
        assert recv(ws)["type"] == "reject"
        assert series(server, run["id"], "a00")["steps"] == [0]  # not the first transactions' points either
        ws.send(points(2, [*rows, {"step": 200, "values": {**known, **_keys("z", 20)}}]))
        assert recv(ws) == {"type": "ack", "seq": 2}
    assert series(server, run["id"], "a00")["steps"] == list(range(201))
    assert series(server, run["id"], "z19")["steps"] == [200]
    assert len(_keys_of(server, run["id"])) == 50


def test_the_key_count_holds_across_servers_sharing_the_database(server_factory, postgres_url: str) -> None:
    """Two replicas: each caches the series it wrote, and neither knows the other's; the
    count is the database's."""
    first = server_factory(postgres_url, max_keys_per_run=50)
    second = server_factory(postgres_url, max_keys_per_run=50)
    run = new_run()
    with open_ingest(first) as ws:
        hello(ws, run)

    def post(server: Any, values: dict[str, float], step: int) -> httpx.Response:
        # A replica's first write on a loaded box can pass httpx's 5 s default.
        url = f"{server.url}/api/v1/runs/{run['id']}/points"
        return httpx.post(url, json={"rows": [{"step": step, "values": values}]}, timeout=60)

    assert post(first, _keys("a", 30), 0).status_code == 200
    assert post(second, _keys("b", 21), 1).status_code == 413
    assert post(second, {**_keys("a", 30), **_keys("b", 20)}, 2).status_code == 200
    refused = post(first, {**_keys("a", 30), "c00": 1.0}, 3)  # first's cache knows only its own 30
    assert refused.status_code == 413 and "'c00'" in refused.json()["detail"]
    assert post(first, _keys("b", 20), 4).status_code == 200
    assert len(_keys_of(first, run["id"])) == 50


def test_a_config_over_the_limit_is_refused_at_hello_and_after_a_merge(server_factory, database_url: str) -> None:
    server = server_factory(database_url, max_config_bytes=10_000)
    # A hello that would create a run with a larger config: error too_large, close 4413, no run.
    big = new_run(config={"blob": "x" * 20_000})
    with open_ingest(server) as ws:
        ws.send(json.dumps({"type": "hello", "protocol": 1, "run": big}))
        error = recv(ws)
        assert error["type"] == "error" and error["code"] == "too_large", error
        assert "limit of 10000" in error["message"] and "KEEL_MAX_CONFIG_BYTES" in error["message"]
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4413
    assert httpx.get(f"{server.url}/api/v1/runs/{big['id']}").status_code == 404
    # PATCH merges top-level keys: refused (413) when the merged config would pass the limit.
    run = new_run(config={"lr": 0.1})
    with open_ingest(server) as ws:
        hello(ws, run)
    url = f"{server.url}/api/v1/runs/{run['id']}"
    assert httpx.patch(url, json={"config": {"notes": "n" * 6000}}).status_code == 200
    refused = httpx.patch(url, json={"config": {"more": "m" * 6000}})
    assert refused.status_code == 413, refused.text
    assert "limit of 10000" in refused.json()["detail"] and "nothing was changed" in refused.json()["detail"]
    assert httpx.get(url).json()["config"] == {"lr": 0.1, "notes": "n" * 6000}
    # Replacing a large key with a small one makes room.
    assert httpx.patch(url, json={"config": {"notes": "short"}}).status_code == 200
    assert httpx.patch(url, json={"config": {"more": "m" * 6000}}).json()["config"] == {
        "lr": 0.1, "notes": "short", "more": "m" * 6000,
    }
    # A hello that resumes the run stores nothing of its config, so it is not checked.
    with open_ingest(server) as ws:
        assert hello(ws, {**run, "config": {"blob": "x" * 20_000}})["type"] == "welcome"
    assert httpx.get(url).json()["config"]["notes"] == "short"
