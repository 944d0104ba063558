"""The dashboard's REST client: in-process against the real app, and tolerant of a missing alerts API."""

from __future__ import annotations

import asyncio
import math

import httpx

from dashboard.data import KeelApi
from server.alerts.hazard import HORIZON, WARMUP
from tests.support.step_details import detail_rows
from tests.support.toy_runs import LiveRun


def _api(server) -> KeelApi:  # type: ignore[no-untyped-def]
    return KeelApi(httpx.AsyncClient(base_url=server.url))


def test_reads_runs_series_and_last_values(server) -> None:
    run = LiveRun(server, "reader", "cispo")
    run.history(50)
    run.send([{"step": 50, "values": {"grad/norm": "inf", "reward/mean": "nan"}}])
    run.close()

    async def read() -> None:
        api = _api(server)
        runs = await api.runs()
        assert [r["id"] for r in runs] == [run.id]
        found = await api.runs_by_id([run.id, "missing"])
        assert found[run.id]["name"] == "reader" and found["missing"] is None
        assert "reward/mean" in await api.keys(run.id) and await api.keys("missing") == []
        of_keys = await api.keys_of_runs([run.id, "missing", run.id])
        assert of_keys == {run.id: await api.keys(run.id), "missing": []} and "grad/norm" in of_keys[run.id]
        of_runs = await api.series_of_runs([run.id, "missing"], "reward/mean", max_points=10)
        series = of_runs[run.id]
        assert series.downsampled and len(series.steps) <= 10 and math.isnan(series.maxs[-1])
        (listed,) = await api.runs(latest=["grad/norm"])
        assert listed["latest"]["grad/norm"] == {"step": 50, "value": "inf"} and "hazard" not in listed
        (with_hazard,) = await api.runs(hazard=True)  # a running run: its current hazard
        current = (await api.hazards([run.id]))[run.id]
        assert current is not None and with_hazard["hazard"] == current["hazard"][-1]
        assert of_runs["missing"].steps == []
        assert await api.alerts(run.id) is not None  # the alerts API exists on this server
        hazard = (await api.hazards([run.id], max_points=5))[run.id]
        assert hazard is not None and hazard["run_id"] == run.id and hazard["horizon"] == HORIZON
        assert len(hazard["steps"]) == 5 and hazard["steps"][0] >= WARMUP and hazard["steps"][-1] <= 50
        assert all(0 <= p <= 1 for p in hazard["hazard"])
        assert await api.hazards([run.id, "missing"], max_points=5) == {run.id: hazard, "missing": None}
        alone = await api._get(f"/runs/{run.id}/hazard", max_points=5)
        assert alone.json() == hazard  # each run of the read exactly as its own GET /runs/{id}/hazard

    asyncio.run(read())


def test_reads_the_runs_of_one_group_of_one_project(server) -> None:
    # The run page's header reads its group on every data tick: the group alone, not every run.
    runs = [
        LiveRun(server, "a0", "arm-a", project="p"),
        LiveRun(server, "a1", "arm-a", project="p"),
        LiveRun(server, "b0", "arm-b", project="p"),
        LiveRun(server, "a-elsewhere", "arm-a", project="q"),
    ]
    for run in runs:
        run.close()

    async def read() -> None:
        api = _api(server)
        group = await api.runs(project="p", group="arm-a")
        assert sorted(r["name"] for r in group) == ["a0", "a1"]
        assert sorted(r["name"] for r in await api.runs(group="arm-a")) == ["a-elsewhere", "a0", "a1"]
        assert len(await api.runs()) >= 4
        # The runs table's read of the runs that streamed: those alone, each as the list has it.
        chosen = await api.runs(run_ids=[runs[2].id, runs[0].id, runs[2].id, "missing"], latest=["reward/mean"])
        assert sorted(r["name"] for r in chosen) == ["a0", "b0"]
        listed = {r["id"]: r for r in await api.runs(latest=["reward/mean"])}
        assert all(r == listed[r["id"]] for r in chosen)
        assert await api.runs(run_ids=[]) == []  # none asked: none read (not every run)

    asyncio.run(read())


def test_missing_alerts_api_reads_as_none() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/alerts":
            return httpx.Response(404, json={"detail": "Not Found"})
        return httpx.Response(200, json=[])

    async def read() -> None:
        api = KeelApi(
            httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://t")
        )
        assert await api.alerts("r") is None
        assert await api.alerts(["r", "s"]) is None

    asyncio.run(read())


def test_alerts_of_several_runs_in_one_read(server) -> None:
    """GET /alerts with repeated run_id, on both databases: the firing alerts of the
    runs asked for, and of no other run."""
    runs = [LiveRun(server, name, "cispo") for name in ("a", "b", "other")]
    for run in runs:
        run.send([{"step": 1, "values": {"grad/norm": "inf"}}])  # non-finite: critical at once
        run.close()
    a, b, other = (run.id for run in runs)

    async def read() -> list:  # type: ignore[type-arg]
        api = _api(server)
        deadline = asyncio.get_running_loop().time() + 15
        seen = None
        while True:  # until every run has fired and two reads agree (a run may fire more than one rule)
            every = await api.alerts([a, b, other], "firing")
            now = None if every is None else sorted((x.run_id, x.id) for x in every)
            if (now is not None and now == seen and {r for r, _ in now} == {a, b, other}) or (
                asyncio.get_running_loop().time() > deadline
            ):
                break
            seen = now
            await asyncio.sleep(0.2)
        return [
            every,
            await api.alerts([a, b, a], "firing"),
            await api.alerts([b]),
            await api.alerts([]),
        ]

    every, firing, only_b, none = asyncio.run(read())
    assert every is not None and {x.run_id for x in every} == {a, b, other}
    assert firing is not None and {x.run_id for x in firing} == {a, b}
    assert len(firing) == len(every) * 2 // 3  # each run's alerts, once (a asked twice)
    assert firing[0].severity == "critical" and firing[0].started_step == 1
    assert only_b is not None and {x.run_id for x in only_b} == {b}
    assert none == []


def test_reads_step_details_and_none_for_a_server_without_them(server) -> None:
    run = LiveRun(server, "details", "cispo")
    rows = detail_rows(range(10), samples_every=3, sequences_per_step=8)
    assert httpx.post(f"{server.url}/api/v1/runs/{run.id}/points", json={"rows": rows}).status_code == 200
    run.close()

    async def read() -> None:
        api = _api(server)
        dist = await api.distributions(run.id, "mismatch/log_ratio", start=2, end=7, max_steps=3)
        assert dist is not None and dist["bucketed"] and len(dist["steps"]) == 3 and dist["steps"][-1] == 7
        assert [sum(c) for c in dist["counts"]] == [
            sum(sum(rows[s]["histograms"]["mismatch/log_ratio"]["counts"]) for s in bucket) for bucket in ((2, 3), (4, 5), (6, 7))
        ]
        assert (await api.distributions(run.id, "unknown/key") or {})["edges"] == []
        latest = await api.samples(run.id, 8)
        assert latest is not None and latest["step"] == 6 and latest["samples"][0]["seq_id"] == "s6-0"
        assert await api.sample_steps(run.id) == [0, 3, 6, 9]
        pairs = await api.sequences(run.id, start=5, end=6)
        assert pairs is not None and pairs["steps"] == [5] * 8 + [6] * 8 and pairs["fit"]["n"] == 16
        assert await api.samples("missing") is None and await api.sequences("missing") is None

    asyncio.run(read())

    def without(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"detail": "Not Found"})

    async def read_old() -> None:
        api = KeelApi(httpx.AsyncClient(transport=httpx.MockTransport(without), base_url="http://t"))
        assert await api.distributions("r", "mismatch/log_ratio") is None
        assert await api.sample_steps("r") is None

    asyncio.run(read_old())
