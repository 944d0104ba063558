"""The dashboard's REST client: in-process against the real app, and tolerant of a missing alerts API."""

from __future__ import annotations

import asyncio
import math

import httpx

from dashboard.data import KeelApi
from tests.dashboard.streams import LiveRun


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
        series = await api.series(run.id, "reward/mean", max_points=10)
        assert series.downsampled and len(series.steps) <= 10 and math.isnan(series.maxs[-1])
        tail = await api.last_value(run.id, "grad/norm")
        assert tail.steps == [50] and tail.values == [math.inf]
        assert (await api.series("missing", "reward/mean")).steps == []
        assert await api.alerts(run.id) is not None  # the alerts API exists on this server

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
        assert await api.alerts_for(["r", "s"]) is None

    asyncio.run(read())


def test_alerts_are_parsed_and_merged_across_runs() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        run_id = request.url.params["run_id"]
        assert request.url.params["state"] == "firing"
        return httpx.Response(
            200,
            json=[
                {
                    "id": 1,
                    "run_id": run_id,
                    "rule": "r",
                    "metric": "grad/norm",
                    "severity": "critical",
                    "state": "firing",
                    "started_step": 4,
                    "resolved_step": None,
                    "message": "m",
                }
            ],
        )

    async def read() -> None:
        api = KeelApi(
            httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://t")
        )
        alerts = await api.alerts_for(["a", "b", "a"], "firing")
        assert alerts is not None and sorted(a.run_id for a in alerts) == ["a", "b"]
        assert alerts[0].started_step == 4 and alerts[0].severity == "critical"

    asyncio.run(read())
