"""Series reads: exact ranges and SQL-side downsampling that keeps extremes."""

from __future__ import annotations

import asyncio
import math
import time

import httpx
import pytest

from server import db
from server.storage import Store
from tests.support.raw_client import hello, new_run, open_ingest, points, recv, series
from wire import Row, RunInfo

N = 1_000_000


async def _bulk_load(database_url: str, run_id: str, values: dict[int, float], n: int) -> None:
    """Load a long series through the same storage path the ingest socket uses."""
    store = Store(db.create_engine(database_url))
    try:
        await store.open_run(RunInfo(id=run_id, name="long"), time.time())
        chunk = 100_000
        for start in range(0, n, chunk):
            rows = [Row(step=s, time=0.0, values={"x": values.get(s, math.sin(s / 1000))}) for s in range(start, min(n, start + chunk))]
            await store.write_points(run_id, rows, time.time())
    finally:
        await store.close()


@pytest.mark.slow
def test_one_spike_in_a_million_steps_survives_a_100_point_read(server) -> None:
    run_id = new_run()["id"]
    spike_step, dip_step, nan_step = 654_321, 123_457, 900_001
    asyncio.run(_bulk_load(server.database_url, run_id, {spike_step: math.inf, dip_step: -5.0, nan_step: math.nan}, N))

    data = series(server, run_id, "x", max_points=100)
    assert data["downsampled"] is True
    assert 95 <= len(data["steps"]) <= 100
    assert len(data["values"]) == len(data["min"]) == len(data["max"]) == len(data["steps"])
    assert data["steps"] == sorted(data["steps"]) and data["steps"][-1] == N - 1
    assert data["max"].count("inf") == 1
    assert data["min"].count(-5.0) == 1
    assert data["max"].count("nan") == 1
    # The bucket holding each extreme is the one whose last step bounds it.
    inf_bucket = data["max"].index("inf")
    assert data["steps"][inf_bucket - 1] < spike_step <= data["steps"][inf_bucket]
    dip_bucket = data["min"].index(-5.0)
    assert data["steps"][dip_bucket - 1] < dip_step <= data["steps"][dip_bucket]
    # Bucket value = the value at its last step.
    assert data["values"][-1] == math.sin((N - 1) / 1000)
    # Every other bucket's extremes stay within the sine's range.
    finite_max = [m for m in data["max"] if isinstance(m, float)]
    assert max(finite_max) <= 1.0 and min(data["min"]) == -5.0

    # Zooming on the spike returns it at full resolution.
    zoom = series(server, run_id, "x", max_points=1000, start=spike_step - 10, end=spike_step + 10)
    assert zoom["downsampled"] is False
    assert zoom["steps"] == list(range(spike_step - 10, spike_step + 11))
    assert zoom["values"][10] == "inf"


def test_range_reads_and_unknown_series(server) -> None:
    run_id = new_run()["id"]
    asyncio.run(_bulk_load(server.database_url, run_id, {}, 50))
    data = series(server, run_id, "x", start=10, end=14)
    assert data == {"key": "x", "downsampled": False, "steps": [10, 11, 12, 13, 14], "values": [math.sin(s / 1000) for s in range(10, 15)]}
    assert series(server, run_id, "missing") == {"key": "missing", "downsampled": False, "steps": [], "values": []}
    down = series(server, run_id, "x", max_points=5)
    assert down["steps"] == [9, 19, 29, 39, 49]
    assert down["min"] == [math.sin(s / 1000) for s in (0, 10, 20, 30, 40)]
    assert down["max"] == [math.sin(s / 1000) for s in (9, 19, 29, 39, 49)]
    response = httpx.get(f"{server.url}/api/v1/runs/nope/series", params={"key": "x"})
    assert response.status_code == 404
    assert httpx.get(f"{server.url}/api/v1/runs/{run_id}/series", params={"key": "x", "max_points": 0}).status_code == 422


def test_one_read_of_many_runs_answers_each_run_as_its_own_read_does(server) -> None:
    """GET /series (one key, many runs, read in one session): each run exactly as
    GET /runs/{id}/series answers it, in the order asked, a repeated run once, a run that
    does not log the key empty, an unknown run left out."""
    long_run, short_run, other = new_run()["id"], new_run()["id"], new_run()["id"]
    asyncio.run(_bulk_load(server.database_url, long_run, {7: math.inf, 8: math.nan}, 300))
    asyncio.run(_bulk_load(server.database_url, short_run, {}, 20))
    asyncio.run(_bulk_load(server.database_url, other, {}, 0))
    asked = [short_run, "no-such-run", long_run, other, short_run]
    for params in ({"max_points": 50}, {"max_points": 1000}, {"max_points": 10, "start": 5, "end": 200}):
        response = httpx.get(f"{server.url}/api/v1/series", params={"key": "x", "run_id": asked, **params})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["key"] == "x" and list(body["runs"]) == [short_run, long_run, other]
        for run_id in (short_run, long_run):
            alone = series(server, run_id, "x", **params)
            assert body["runs"][run_id] == alone, (run_id, params)
        assert body["runs"][other]["steps"] == []
    assert body["runs"][long_run]["downsampled"] is True and body["runs"][long_run]["max"][0] == "nan"


def test_finishing_an_unknown_run_is_refused(database_url) -> None:
    from server.errors import UnknownRun

    db.upgrade(database_url)

    async def go() -> None:
        store = Store(db.create_engine(database_url))
        try:
            with pytest.raises(UnknownRun):
                await store.finish_run("no-such-run", "finished", time.time())
        finally:
            await store.close()

    asyncio.run(go())


def test_downsampling_a_run_whose_steps_reach_2_to_the_62(server) -> None:
    """Bucketing used to multiply (step - lo) by the bucket count: "bigint out of range"."""
    run = new_run()
    steps = [0, 1, 2**40, 2**61, 2**62 - 2, 2**62 - 1]
    rows = [{"step": step, "values": {"x": float(index)}} for index, step in enumerate(steps)]
    response = httpx.post(f"{server.url}/api/v1/runs/{run['id']}/points", json={"rows": rows})
    assert response.status_code == 404  # no such run yet: say hello first
    from tests.support.raw_client import hello, open_ingest, points, recv

    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, rows))
        assert recv(ws) == {"type": "ack", "seq": 0}
    data = series(server, run["id"], "x", max_points=3)
    assert data["downsampled"] is True
    assert data["steps"] == [2**40, 2**61, 2**62 - 1]
    assert data["min"] == [0.0, 3.0, 4.0] and data["max"] == [2.0, 3.0, 5.0]


def test_the_keys_of_many_runs_are_each_runs_own_keys(server) -> None:
    """GET /keys (many runs, one session): each run's keys, counts and last steps exactly as
    GET /runs/{id}/keys answers them, in the order asked, a repeated run once, a run with no
    points with no keys, an unknown run left out."""
    second_run = new_run("second")
    first, second, empty = new_run()["id"], second_run["id"], new_run()["id"]
    asyncio.run(_bulk_load(server.database_url, first, {3: math.nan}, 40))
    asyncio.run(_bulk_load(server.database_url, empty, {}, 0))
    with open_ingest(server) as ws:
        assert hello(ws, second_run)["type"] == "welcome"
        ws.send(points(0, [{"step": s, "values": {"b": 1.0, "a": float(s)} if s % 2 else {"a": 2.0}} for s in range(7)]))
        assert recv(ws)["type"] == "ack"
    response = httpx.get(f"{server.url}/api/v1/keys", params={"run_id": [second, "no-such-run", first, empty, second]})
    assert response.status_code == 200, response.text
    runs = response.json()["runs"]
    assert list(runs) == [second, first, empty]
    for run_id in (first, second):
        assert runs[run_id] == httpx.get(f"{server.url}/api/v1/runs/{run_id}/keys").json()
    assert runs[second] == [{"key": "a", "count": 7, "last_step": 6}, {"key": "b", "count": 3, "last_step": 5}]
    assert runs[first] == [{"key": "x", "count": 40, "last_step": 39}]
    assert runs[empty] == []
    assert httpx.get(f"{server.url}/api/v1/keys").status_code == 422
