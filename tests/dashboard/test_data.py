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
    requests: list[httpx.Request] = []

    def alert(run_id: str, state: str) -> dict[str, object]:
        return {
            "id": len(run_id),
            "run_id": run_id,
            "rule": "r",
            "metric": "grad/norm",
            "severity": "critical",
            "state": state,
            "started_step": 4,
            "resolved_step": None,
            "message": "m",
        }

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        state = request.url.params.get("state")
        run_id = request.url.params.get("run_id")
        if run_id is None:  # every run's alerts: the firing ones of a, b and an unrelated run
            return httpx.Response(200, json=[alert(r, "firing") for r in ("a", "b", "other")])
        return httpx.Response(200, json=[alert(run_id, state or "resolved")])

    async def read() -> None:
        api = KeelApi(
            httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://t")
        )
        firing = await api.alerts_for(["a", "b", "a"], "firing")
        assert firing is not None and sorted(a.run_id for a in firing) == ["a", "b"]
        assert firing[0].started_step == 4 and firing[0].severity == "critical"
        assert len(requests) == 1 and requests[0].url.params["state"] == "firing"
        every = await api.alerts_for(["a", "b"])
        assert every is not None and sorted(a.run_id for a in every) == ["a", "b"]
        assert [r.url.params["run_id"] for r in requests[1:]] == ["a", "b"]

    asyncio.run(read())
