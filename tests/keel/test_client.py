"""`keel.client.Client` against a real server: runs, keys and exact or downsampled series."""

from __future__ import annotations

import math

import numpy as np
import pytest

from keel.client import Client, ClientError
from keel.importers import ImportedRun, PointTable
from keel.transfer import upload_run


def _run(
    url: str, name: str, points: dict[str, dict[int, float]], *, project: str = "default",
    group: str | None = None, seed: int = 0,
) -> str:
    """A run stored through the ingest protocol, as `keel import` stores one."""
    table = PointTable()
    for key, series in points.items():
        for step, value in series.items():
            table.add(step, key, value)
    run = ImportedRun(identity=f"test/{name}/{project}/{group}/{seed}", name=name, table=table)
    assert upload_run(run, table.rows(), url, project=project, group=group, timeout=60) is None
    return run.run_id


def _uneven_steps() -> dict[int, float]:
    """Dense at the start, sparse after: equal step ranges hold very unequal point counts."""
    steps = [*range(4000), *range(10_000, 1_000_000, 1000)]
    return {step: (math.nan if step == 3 else math.inf if step == 500_000 else math.sin(step)) for step in steps}


def test_a_full_resolution_read_pages_through_ranges_and_misses_nothing(server) -> None:
    values = _uneven_steps()
    run_id = _run(server.url, "paged", {"x": values})
    client = Client(server.url, page_points=500)

    full = client.series(run_id, "x")
    assert full.downsampled is False
    assert full.steps.dtype == np.int64 and full.values.dtype == np.float64
    assert full.steps.tolist() == sorted(values)
    np.testing.assert_array_equal(full.values, np.array([values[s] for s in sorted(values)]))
    assert math.isnan(full.values[3]) and full.values[full.steps.tolist().index(500_000)] == math.inf

    window = client.series(run_id, "x", start=3_500, end=600_000)
    expected = [s for s in sorted(values) if 3_500 <= s <= 600_000]
    assert window.steps.tolist() == expected
    np.testing.assert_array_equal(window.values, np.array([values[s] for s in expected]))
    # The same points as plain lists, without numpy (keel parity on the base install).
    steps, plain = client.points(run_id, "x", start=3_500, end=600_000)
    assert steps == expected and all(type(v) is float for v in plain)
    np.testing.assert_array_equal(np.array(plain), np.array([values[s] for s in expected]))


def test_a_series_longer_than_the_servers_largest_page_comes_back_exact(server_factory, sqlite_url) -> None:
    server = server_factory(sqlite_url)
    n = 150_001
    values = {step: (math.nan if step % 997 == 0 else float(step % 13)) for step in range(n)}
    run_id = _run(server.url, "long", {"x": values})

    full = Client(server.url).series(run_id, "x")
    assert len(full.steps) == n and full.steps[0] == 0 and full.steps[-1] == n - 1
    np.testing.assert_array_equal(full.values, np.array([values[s] for s in range(n)]))


def test_max_points_gives_the_servers_buckets_with_min_and_max(server) -> None:
    values = {step: (100.0 if step == 77 else 1.0) for step in range(1000)}
    run_id = _run(server.url, "buckets", {"x": values})
    client = Client(server.url)

    coarse = client.series(run_id, "x", max_points=10)
    assert coarse.downsampled is True and len(coarse.steps) == 10
    assert coarse.steps[-1] == 999 and coarse.maxs.max() == 100.0 and coarse.mins.min() == 1.0

    frame = client.series(run_id, "x", max_points=10, as_="pandas")
    assert list(frame.columns) == ["value", "min", "max"] and frame.index.name == "step"
    assert frame["max"].max() == 100.0
    with pytest.raises(ValueError, match="max_points"):
        client.series(run_id, "x", max_points=100_001)


def test_runs_filters_by_project_and_group_and_names_resolve(server) -> None:
    a = _run(server.url, "alpha", {"loss": {0: 1.0, 1: math.inf}}, project="p1")
    b = _run(server.url, "beta", {"loss": {0: 2.0}, "kl": {5: -1.5}}, project="p2")
    client = Client(server.url)

    assert {run["id"] for run in client.runs()} == {a, b}
    assert client.run("beta")["id"] == b
    assert client.run(b)["name"] == "beta" and "config" in client.run(b)
    assert [(k["key"], k["count"], k["last_step"]) for k in client.keys("beta")] == [("kl", 1, 5), ("loss", 1, 0)]

    frame = client.runs(as_="pandas")
    assert set(frame["name"]) == {"alpha", "beta"} and {"id", "status", "last_step"} <= set(frame.columns)
    assert client.runs(project="nope") == []
    assert [run["id"] for run in client.runs(project="p1")] == [a]

    series = client.series("beta", "kl", as_="pandas")
    assert series.name == "kl" and series.index.tolist() == [5] and series.tolist() == [-1.5]
    with pytest.raises(ClientError, match="no run with id or name 'gamma'") as missing:
        client.run("gamma")
    assert missing.value.status == 404


def test_a_name_shared_by_two_runs_asks_for_an_id(server) -> None:
    first = _run(server.url, "twin", {"x": {0: 1.0}}, seed=0)
    second = _run(server.url, "twin", {"x": {0: 2.0}}, seed=1)
    client = Client(server.url)
    with pytest.raises(ClientError, match="2 runs are named 'twin'"):
        client.series("twin", "x")
    assert client.series(first, "x").values.tolist() == [1.0]
    assert client.series({"id": second}, "x").values.tolist() == [2.0]


def test_project_and_group_filters_reach_the_server(server) -> None:
    for project, group in (("p", "g1"), ("p", "g2"), ("q", "g1")):
        _run(server.url, f"{project}-{group}", {"x": {0: 1.0}}, project=project, group=group)
    client = Client(server.url)
    assert {run["name"] for run in client.runs(project="p")} == {"p-g1", "p-g2"}
    assert {run["name"] for run in client.runs(group="g1")} == {"p-g1", "q-g1"}
    assert [run["name"] for run in client.runs(project="p", group="g2")] == ["p-g2"]


def test_a_token_is_sent_and_a_refusal_is_a_clear_error(server_factory, sqlite_url) -> None:
    admin = "keel_test_admin_token_0123456789abcdef"
    server = server_factory(sqlite_url, auth=True, bootstrap_token=admin)
    with pytest.raises(ClientError, match="HTTP 401") as refused:
        Client(server.url).runs()
    assert refused.value.status == 401
    assert Client(server.url, token=admin).runs() == []


def test_an_unreachable_server_is_a_client_error() -> None:
    from tests.support.local_server import free_port

    with pytest.raises(ClientError, match="cannot reach"):
        Client(f"http://127.0.0.1:{free_port()}", timeout=2).runs()
    with pytest.raises(ValueError, match="http://host:port"):
        Client("127.0.0.1:8750")


def test_an_answer_that_is_not_a_keel_run_is_a_client_error_naming_the_field() -> None:
    """The client reads runs through wire.api.ApiRun: a server (or a proxy) that answers
    something else fails on the field, not with a KeyError in the caller."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    run = {
        "id": "r", "name": "n", "project": "p", "group": None, "status": "paused", "last_step": 3,
        "started_at": "2026-01-01T00:00:00+00:00", "last_seen_at": "2026-01-01T00:00:00+00:00",
        "finished_at": None, "tags": [], "unsent": None, "actions": None, "latest": None,
    }  # fmt: skip

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = json.dumps([run] if self.path.startswith("/api/v1/runs?") or self.path == "/api/v1/runs" else run).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        client = Client(f"http://127.0.0.1:{httpd.server_address[1]}", timeout=10)
        for read in (client.runs, lambda: client.run("r")):
            with pytest.raises(ClientError, match=r"not a Keel run: run\.status must be one of running, finished"):
                read()
        run["status"] = "finished"
        assert client.run("r") == run and client.runs() == [run]
    finally:
        httpd.shutdown()


def _post_details(url: str, run_id: str, rows: list[dict[str, object]]) -> None:
    import httpx

    response = httpx.post(f"{url}/api/v1/runs/{run_id}/points", json={"rows": rows}, timeout=30)
    assert response.status_code == 200, response.text


def test_step_details_come_back_as_the_servers_json(server) -> None:
    run_id = _run(server.url, "detailed", {"x": {0: 1.0}})
    edges = [0.0, 1.0, 2.0]
    _post_details(server.url, run_id, [
        {"step": step, "values": {}, "histograms": {"h": {"edges": edges, "counts": [step, 1]}},
         "samples": [{"seq_id": step, "reward": "nan", "tokens": ["a"], "log_ratio": [0.5]}],
         "sequences": {"length": [10, 20], "log_ratio": [step * 0.1, "inf"]}}
        for step in range(1, 6)
    ])
    client = Client(server.url)
    assert client.distributions(run_id, "h", start=2, end=4) == {
        "key": "h", "edges": edges, "steps": [2, 3, 4], "counts": [[2, 1], [3, 1], [4, 1]], "nan": [0, 0, 0],
        "bucketed": False, "left_out": 0,
    }
    assert client.distributions("detailed", "h", max_steps=2)["counts"] == [[1 + 2 + 3, 3], [4 + 5, 2]]
    assert client.samples(run_id, step=3) == {"step": 3, "samples": [{"seq_id": 3, "reward": "nan", "tokens": ["a"], "log_ratio": [0.5]}]}
    assert client.samples(run_id)["step"] == 5
    assert client.sample_steps(run_id) == [1, 2, 3, 4, 5]
    pairs = client.sequences(run_id, start=4, max_points=3)
    assert pairs["steps"] == [4, 4, 5] and pairs["log_ratio"][1] == "inf" and pairs["fit"] is None
    assert len(list(client.details(run_id, page=4))) == 15
    with pytest.raises(ClientError) as missing:
        client.samples({"id": "nope"})
    assert missing.value.status == 404
