"""REST: run listing, POST points, health, stale status, live push, the collapse hazard."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from websockets.sync.client import connect

from server.alerts.hazard import HORIZON, WARMUP, hazard_series
from tests.support.hazard import RISING, SPIKE_STEP, collapsing_values, rising_model_file
from tests.support.monitor import wait_until
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


def test_silent_running_run_is_reported_silent(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url, silent_after_s=2.0)  # more than a loaded box's pause between two calls
    run = new_run()

    def status() -> str:
        return str(httpx.get(f"{server.url}/api/v1/runs/{run['id']}").json()["status"])

    with open_ingest(server) as ws:
        before_hello = time.monotonic()  # not after it: the server's clock starts at the hello
        hello(ws, run)
        assert status() == "running"
        wait_until(lambda: status() == "silent", timeout=15, what="the run to turn silent")
        # The server's clock is the wall clock (time.time), this one is monotonic: they agree to
        # a few milliseconds, not to the microsecond (a run of CI saw 1.9992 s).
        assert time.monotonic() - before_hello >= 2.0 - 0.05
        assert [r["id"] for r in httpx.get(f"{server.url}/api/v1/runs", params={"status": "silent"}).json()] == [run["id"]]
        # `stale`, the old name, still filters
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


def test_runs_with_their_latest_points_and_one_metric_of_several_runs_in_one_read(server) -> None:
    """What a page of many runs reads: GET /runs?latest= (the runs table) and GET /series
    (one chart of many runs), each the same numbers as the per-run reads."""
    first, second, third = new_run("one"), new_run("two"), new_run("three")
    for run, rows in (
        (first, [{"step": s, "values": {"a": float(s), "b": "nan" if s == 4 else 1.0}} for s in range(5)]),
        (second, [{"step": s, "values": {"a": -float(s)}} for s in range(3000)]),
        (third, [{"step": 0, "values": {"c": 2.0}}]),
    ):
        with open_ingest(server) as ws:
            hello(ws, run)
            ws.send(points(0, rows))
            assert recv(ws)["type"] == "ack"
    api = f"{server.url}/api/v1"
    listed = httpx.get(f"{api}/runs", params={"latest": "a,b,missing"}).json()
    by_id = {run["id"]: run for run in listed}
    assert by_id[first["id"]]["latest"] == {"a": {"step": 4, "value": 4.0}, "b": {"step": 4, "value": "nan"}}
    assert by_id[second["id"]]["latest"] == {"a": {"step": 2999, "value": -2999.0}}
    assert by_id[third["id"]]["latest"] == {}
    plain = httpx.get(f"{api}/runs").json()
    assert all("latest" not in run for run in plain) and [r["id"] for r in plain] == [r["id"] for r in listed]
    only = httpx.get(f"{api}/runs", params={"run_id": [first["id"], third["id"], "nope"]}).json()
    assert sorted(r["id"] for r in only) == sorted([first["id"], third["id"]])

    ids = [first["id"], second["id"], third["id"], "nope"]
    for params in ({"max_points": 100}, {"max_points": 5000}, {"start": 10, "end": 20}):
        batch = httpx.get(f"{api}/series", params={"key": "a", "run_id": ids, **params})
        assert batch.status_code == 200, batch.text
        body = batch.json()
        assert body["key"] == "a" and set(body["runs"]) == set(ids[:3])  # unknown runs left out
        for run_id in ids[:3]:
            one = httpx.get(f"{api}/runs/{run_id}/series", params={"key": "a", **params}).json()
            assert body["runs"][run_id] == one
    assert httpx.get(f"{api}/series", params={"key": "a"}).status_code == 422  # no run named


def test_collapse_hazard_of_a_run(server_factory, database_url, tmp_path) -> None:
    """GET /runs/{id}/hazard: the hazard the server computes from the stored points under its
    model (KEEL_HAZARD_MODEL), exactly hazard_series over the same rows, past the warm-up;
    buckets keep their highest hazard."""
    server = server_factory(database_url, hazard_model=rising_model_file(tmp_path))
    run = new_run("collapsing")
    values = [collapsing_values(step) for step in range(200)]
    with open_ingest(server) as ws:
        hello(ws, run)
        for seq, first in enumerate(range(0, 200, 50)):
            ws.send(points(seq, [{"step": s, "values": values[s]} for s in range(first, first + 50)]))
            assert recv(ws)["type"] == "ack"
        url = f"{server.url}/api/v1/runs/{run['id']}/hazard"
        whole = httpx.get(url)
        assert whole.status_code == 200, whole.text
        body = whole.json()
        expected = hazard_series(values, RISING)
        bucketed = httpx.get(url, params={"max_points": 7}).json()
    assert body["run_id"] == run["id"] and body["horizon"] == HORIZON == 50 and body["warmup"] == WARMUP
    # Its reward fell from step 126 on (read on the range it covered: it ends below 0) and has
    # not regained in the 73 steps since: a fall not judged yet.
    assert (body["falling_since"], body["collapsed_at"], body["dips"], body["missing"]) == (126, None, [], [])
    assert body["steps"] == list(range(WARMUP, 200))  # the warm-up has no hazard
    assert expected[:WARMUP] == [None] * WARMUP
    assert body["hazard"] == expected[WARMUP:]
    hazard = body["hazard"]
    assert hazard[0] < 0.01 and hazard[-1] > 0.5 and max(hazard) == hazard[-1]  # it rises to the collapse
    # 170 points in 7 buckets of 25 consecutive steps: each answered by its highest hazard and
    # that hazard's step, so the one-step spike survives as its own bucket's point.
    assert bucketed["run_id"] == run["id"] and bucketed["horizon"] == HORIZON
    chunks = [list(zip(body["steps"], hazard, strict=True))[i : i + 25] for i in range(0, 170, 25)]
    tops = [max(chunk, key=lambda point: point[1]) for chunk in chunks]
    assert list(zip(bucketed["steps"], bucketed["hazard"], strict=True)) == tops
    assert len(tops) == 7 and SPIKE_STEP in bucketed["steps"] and max(bucketed["hazard"]) == max(hazard)
    spike = body["steps"].index(SPIKE_STEP)
    assert hazard[spike] > 5 * hazard[spike - 1]


def test_runs_with_the_current_hazard_of_each_running_run(server_factory, database_url, tmp_path) -> None:
    """GET /runs?hazard=true: each running run with its current collapse hazard, the last value
    of its GET /runs/{id}/hazard (null while it warms up); a finished run has none, nor does
    any run without the parameter."""
    server = server_factory(database_url, hazard_model=rising_model_file(tmp_path))
    live, warming, finished = new_run("live"), new_run("warming"), new_run("finished")
    values = [collapsing_values(step) for step in range(160)]
    api = f"{server.url}/api/v1"

    def listed(**params: object) -> dict[str, dict]:
        response = httpx.get(f"{api}/runs", params=params)
        assert response.status_code == 200, response.text
        return {run["id"]: run for run in response.json()}

    with open_ingest(server) as live_ws, open_ingest(server) as warming_ws:
        with open_ingest(server) as ws:
            hello(ws, finished)
            ws.send(points(0, [{"step": s, "values": values[s]} for s in range(120)]))
            assert recv(ws)["type"] == "ack"
            ws.send(json.dumps({"type": "finish", "status": "finished"}))
            assert recv(ws) == {"type": "bye"}
        hello(warming_ws, warming)
        warming_ws.send(points(0, [{"step": s, "values": values[s]} for s in range(WARMUP)]))
        assert recv(warming_ws)["type"] == "ack"
        hello(live_ws, live)
        live_ws.send(points(0, [{"step": s, "values": values[s]} for s in range(120)]))
        assert recv(live_ws)["type"] == "ack"

        first = listed(hazard="true")  # the list reads first: the cache is cold
        whole = httpx.get(f"{api}/runs/{live['id']}/hazard").json()
        assert whole["steps"][-1] == 119
        assert first[live["id"]]["hazard"] == whole["hazard"][-1] == hazard_series(values[:120], RISING)[-1]
        assert first[live["id"]]["status"] == "running" and 0 < first[live["id"]]["hazard"] < 1
        assert first[warming["id"]]["status"] == "running" and first[warming["id"]]["hazard"] is None
        assert first[finished["id"]]["status"] == "finished" and "hazard" not in first[finished["id"]]
        assert all("hazard" not in run for run in listed().values())
        assert all("hazard" not in run for run in listed(latest="mismatch/kl").values())
        assert "hazard" not in listed(hazard="true", status="finished")[finished["id"]]
        assert "hazard" not in httpx.get(f"{api}/runs/{live['id']}").json()  # the run itself has no such field

        # More steps: the list answers the hazard after them (extended from the cache).
        live_ws.send(points(1, [{"step": s, "values": values[s]} for s in range(120, 160)]))
        assert recv(live_ws)["type"] == "ack"
        second = listed(hazard="true", run_id=[live["id"], warming["id"]])
        assert set(second) == {live["id"], warming["id"]}
        assert first[live["id"]]["collapsed_at"] is None
        assert second[live["id"]]["hazard"] == hazard_series(values, RISING)[-1] > first[live["id"]]["hazard"]  # KL climbs
        # Its reward fell from step 127 on, not long enough ago to be judged: still a hazard.
        whole = httpx.get(f"{api}/runs/{live['id']}/hazard").json()
        assert (whole["falling_since"], whole["collapsed_at"]) == (127, None) and second[live["id"]]["collapsed_at"] is None
        # 100 steps later it has not regained: a lasting collapse, and no hazard ahead of it.
        low = [{"step": s, "values": {**values[159], "reward/mean": 0.05}} for s in range(160, 260)]
        live_ws.send(points(2, low))
        assert recv(live_ws)["type"] == "ack"
        third = listed(hazard="true", run_id=[live["id"]])[live["id"]]
        assert (third["hazard"], third["collapsed_at"]) == (None, 127)
        assert httpx.get(f"{api}/runs/{live['id']}/hazard").json()["collapsed_at"] == 127
    assert httpx.get(f"{api}/runs", params={"hazard": "maybe"}).status_code == 422


def test_collapse_hazard_errors(server) -> None:
    assert httpx.get(f"{server.url}/api/v1/runs/nope/hazard").status_code == 404
    run = new_run("short")
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, [{"step": s, "values": {"reward/mean": 0.5}} for s in range(WARMUP)]))
        assert recv(ws)["type"] == "ack"
    url = f"{server.url}/api/v1/runs/{run['id']}/hazard"
    assert httpx.get(url).json() == {
        "run_id": run["id"], "horizon": HORIZON, "steps": [], "hazard": [], "warmup": WARMUP,
        "collapsed_at": None, "falling_since": None, "dips": [], "missing": ["mismatch/kl", "mismatch/ratio_max", "grad/norm"],
    }  # fmt: skip
    assert httpx.get(url, params={"max_points": 0}).status_code == 422
    assert httpx.get(url, params={"max_points": 100_001}).status_code == 422


def _secured(server_factory, database_url: str):  # type: ignore[no-untyped-def]
    """A server with auth on, and an ingest-only and a read-only token of it."""
    from server import db
    from server.api_tokens import create_token
    from server.storage import Store

    secured = server_factory(database_url, auth=True, bootstrap_token="keel_test_admin_token_0123456789abcdef")

    async def tokens() -> tuple[str, str]:
        store = Store(db.create_engine(database_url))
        try:
            return await create_token(store, "ingest only", ["ingest"]), await create_token(store, "reader", ["read"])
        finally:
            await store.close()

    ingest, read = asyncio.run(tokens())
    return secured, ingest, read


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_collapse_hazard_needs_the_read_scope(server_factory, database_url) -> None:
    secured, ingest, read = _secured(server_factory, database_url)
    url = f"{secured.url}/api/v1/runs/nope/hazard"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"Bearer {ingest}"}).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"Bearer {read}"}).status_code == 404  # let in, no such run
    schema = httpx.get(f"{secured.url}/openapi.json").json()
    operation = schema["paths"]["/api/v1/runs/{run_id}/hazard"]["get"]
    assert set(operation["responses"]) >= {"200", "401", "404", "422"}
    assert operation["responses"]["200"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/HazardOut"}


# -- PATCH /runs/{id}: config that arrives after the run started -------------------------------

CONFIG = {"lr": 1e-6, "algorithm": {"name": "grpo", "kl": 0.1}, "layers": [1, 2, 3], "seed": 7}


def _run_with_config(server) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    run = new_run("configured", config=CONFIG)
    with open_ingest(server) as ws:
        assert hello(ws, run)["type"] == "welcome"
        ws.send(points(0, [{"step": 0, "values": {"a": 1.0}}]))
        assert recv(ws)["type"] == "ack"
    return run["id"], f"{server.url}/api/v1/runs/{run['id']}"


def _nested(depth: int) -> dict[str, object]:
    """A config nesting `depth` levels, itself the first."""
    value: dict[str, object] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"k": value}
    return value


def test_patch_merges_top_level_config_keys_durably(server_factory, database_url) -> None:
    server = server_factory(database_url)
    run_id, url = _run_with_config(server)
    update = {"lr": 2e-6, "algorithm": {"name": "cispo"}, "late": {"deep": [True, None, "x"]}, "big": 2**63 + 5}
    merged = {**CONFIG, **update}
    assert merged["algorithm"] == {"name": "cispo"}  # a named key takes the new value whole
    response = httpx.patch(url, json={"config": update})
    assert response.status_code == 200, response.text
    assert response.json()["id"] == run_id and response.json()["config"] == merged
    assert response.json()["last_step"] == 0 and response.json()["status"] == "running"
    assert httpx.get(url).json()["config"] == merged
    # The same update again changes nothing (a client may repeat it); an empty one neither.
    assert httpx.patch(url, json={"config": update}).json()["config"] == merged
    assert httpx.patch(url, json={"config": {}}).json()["config"] == merged
    # A hello for the run (a trainer or watcher resuming) keeps it, and points still go in.
    with open_ingest(server) as ws:
        assert hello(ws, new_run("configured", id=run_id, config={"lr": 0.5}))["type"] == "welcome"
        ws.send(points(1, [{"step": 1, "values": {"a": 2.0}}]))
        assert recv(ws)["type"] == "ack"
    assert httpx.get(url).json()["config"] == merged
    # Stored in the database, not held by the process: another server on it reads the same.
    other = server_factory(database_url)
    assert httpx.get(f"{other.url}/api/v1/runs/{run_id}").json()["config"] == merged
    assert httpx.patch(f"{other.url}/api/v1/runs/{run_id}", json={"config": {"seed": 8}}).json()["config"] == {**merged, "seed": 8}
    assert httpx.get(url).json()["config"] == {**merged, "seed": 8}
    assert series(server, run_id, "a")["values"] == [1.0, 2.0]


def test_patch_refuses_bad_input_and_keeps_the_stored_config(server_factory, database_url) -> None:
    server = server_factory(database_url, max_frame_bytes=64 * 1024)
    run_id, url = _run_with_config(server)

    def refused(response: httpx.Response, status: int, words: str) -> None:
        assert response.status_code == status, (response.request.content[:80], response.status_code, response.text)
        detail = response.json()["detail"]
        text = detail if isinstance(detail, str) else " | ".join(item["msg"] for item in detail)
        assert words in text, text

    def raw(body: str) -> httpx.Response:
        return httpx.patch(url, content=body.encode(), headers={"content-type": "application/json"})

    refused(httpx.patch(f"{server.url}/api/v1/runs/nope", json={"config": {"lr": 1}}), 404, "run 'nope' not found")
    refused(raw("{oops"), 400, "body is not valid JSON")
    refused(raw('{"config": {"lr": NaN}}'), 400, "body is not valid JSON")
    refused(raw('{"config": {"lr": 1e400}}'), 400, "body is not valid JSON")
    refused(httpx.patch(url, json=[{"config": {}}]), 422, "body must be a JSON object")
    refused(httpx.patch(url, json={}), 422, "config is required")
    refused(httpx.patch(url, json={"config": None}), 422, "config must be a JSON object")
    refused(httpx.patch(url, json={"config": [["lr", 1]]}), 422, "config must be a JSON object")
    refused(httpx.patch(url, json={"config": {"lr": 1}, "name": "renamed"}), 422, "only the run's config can be changed")
    refused(httpx.patch(url, json={"config": {"deep": _nested(32)}}), 422, "config nests deeper than 32 levels")
    refused(httpx.patch(url, json={"config": {"lr": 1, "note": "a\x00b"}}), 422, "NUL")
    refused(httpx.patch(url, json={"config": {"lr": 1, "nested": {"a\x00": 1}}}), 422, "NUL")
    refused(httpx.patch(url, json={"config": {"blob": "x" * 70_000}}), 413, "exceeds 65536")
    assert httpx.get(url).json()["config"] == CONFIG  # nothing of any refused update was stored
    # The deepest config a hello may carry is taken by a PATCH too.
    deepest = _nested(31)
    assert httpx.patch(url, json={"config": {"deep": deepest}}).json()["config"] == {**CONFIG, "deep": deepest}
    schema = httpx.get(f"{server.url}/openapi.json").json()
    operation = schema["paths"]["/api/v1/runs/{run_id}"]["patch"]
    assert set(operation["responses"]) >= {"200", "400", "401", "404", "413", "422", "429"}
    assert operation["responses"]["404"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorOut"}
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["config"] and body["properties"]["config"]["type"] == "object"


def test_patch_needs_the_ingest_scope(server_factory, database_url) -> None:
    secured, ingest, read = _secured(server_factory, database_url)
    run = new_run("secured", config=CONFIG)
    with connect(f"{secured.ws_url}/api/v1/ingest", additional_headers={"Authorization": f"Bearer {ingest}"}) as ws:
        assert hello(ws, run)["type"] == "welcome"
    url = f"{secured.url}/api/v1/runs/{run['id']}"
    reader = {"Authorization": f"Bearer {read}"}
    # Refused as every route refuses a token without its scope: 401 (server/auth.py).
    assert httpx.patch(url, json={"config": {"lr": 1}}).status_code == 401
    refused = httpx.patch(url, json={"config": {"lr": 1}}, headers=reader)
    assert refused.status_code == 401 and "'ingest' scope" in refused.json()["detail"]
    assert httpx.get(url, headers=reader).json()["config"] == CONFIG
    allowed = httpx.patch(url, json={"config": {"lr": 1}}, headers={"Authorization": f"Bearer {ingest}"})
    assert allowed.status_code == 200 and allowed.json()["config"] == {**CONFIG, "lr": 1}
    assert httpx.get(url, headers=reader).json()["config"] == {**CONFIG, "lr": 1}


def test_runs_limit_reads_only_the_newest(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url, silent_after_s=0.5)
    for name in ("old", "middle", "new"):
        with open_ingest(server) as ws:
            assert hello(ws, new_run(name=name))["type"] == "welcome"
        time.sleep(0.01)  # started_at orders them
    runs = f"{server.url}/api/v1/runs"
    assert [r["name"] for r in httpx.get(runs, params={"limit": 2}).json()] == ["new", "middle"]
    assert [r["name"] for r in httpx.get(runs).json()] == ["new", "middle", "old"]
    assert httpx.get(runs, params={"limit": 0}).status_code == 422
    time.sleep(0.8)  # all three silent now: with a status, the limit applies to the runs of that status
    assert [r["name"] for r in httpx.get(runs, params={"status": "silent", "limit": 1}).json()] == ["new"]
