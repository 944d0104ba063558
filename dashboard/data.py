"""The dashboard's only data source: Keel's own REST API (docs/protocol.md), called in-process.

Pages read through the public API rather than the storage layer, so the
dashboard sees exactly what any other client sees (status, downsampling,
non-finite encoding) and needs no change when storage does. In the server the
transport is `httpx.ASGITransport` on the same FastAPI app: no socket, no
second server. Tests swap in `httpx.MockTransport` or a real URL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import httpx

from dashboard.series import Alert, Series
from wire.api import ApiCommand, ApiRun, as_read

__all__ = ["KeelApi", "in_process_client"]

# The newest alerts of the runs a page shows (the API's own maximum).
_ALERTS_LIMIT = 10_000
# The run_ids of one GET /alerts (the API's own maximum, server/routes/alerts.py).
_ALERTS_RUNS_PER_READ = 1000


def in_process_client(app: Any, token: str | None = None) -> httpx.AsyncClient:
    """An HTTP client whose requests are served by `app` directly (ASGI, same event loop).

    When auth is on, pages are already behind the login; their reads carry the
    process-local internal `token` (server.auth), never the user's.
    """
    # Identity: compressing a response only to decompress it in this process is work for nothing.
    headers = {"Accept-Encoding": "identity", **({"Authorization": f"Bearer {token}"} if token else {})}
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://localhost",  # a name the server serves (server/origins.py): this process
        timeout=30.0,
        headers=headers,
    )


class KeelApi:
    """Typed reads over /api/v1. Missing runs come back as None, never as exceptions."""

    def __init__(self, client: httpx.AsyncClient, *, concurrency: int = 16):
        self.client = client
        # Caps in-flight reads per page render: a compare page fans out to runs × metrics.
        self._limit = asyncio.Semaphore(concurrency)

    async def _get(self, path: str, **params: Any) -> httpx.Response:
        query = {k: v for k, v in params.items() if v is not None}
        async with self._limit:
            return await self.client.get(f"/api/v1{path}", params=query)

    async def runs(
        self,
        *,
        latest: Iterable[str] = (),
        hazard: bool = False,
        limit: int | None = None,
        project: str | None = None,
        group: str | None = None,
        run_ids: Iterable[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Every run (the `limit` newest; of `project` and `group`, or only `run_ids`, where
        given), newest first; with `latest` keys, each run's last point of each under "latest"
        (`{key: {"step", "value"}}`); with `hazard`, each running run's current collapse hazard
        under "hazard" (None while it warms up; absent on other runs)."""
        keys = ",".join(latest)
        ids = None if run_ids is None else list(dict.fromkeys(run_ids))
        if ids == []:
            return []  # no run_id would mean every run
        response = await self._get(
            "/runs", latest=keys or None, hazard="true" if hazard else None, limit=limit, project=project, group=group,
            run_id=ids,
        )  # fmt: skip
        response.raise_for_status()
        runs: list[dict[str, Any]] = as_read(ApiRun, response.json(), many=True)
        return runs

    async def run(self, run_id: str) -> dict[str, Any] | None:
        response = await self._get(f"/runs/{run_id}")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        run: dict[str, Any] = as_read(ApiRun, response.json())
        return run

    async def runs_by_id(self, run_ids: Iterable[str]) -> dict[str, dict[str, Any] | None]:
        """These runs (as the runs list gives them) in one read; None for an unknown id."""
        ids = list(dict.fromkeys(run_ids))
        if not ids:
            return {}
        response = await self._get("/runs", run_id=ids)
        response.raise_for_status()
        found = {run["id"]: run for run in as_read(ApiRun, response.json(), many=True)}
        return {run_id: found.get(run_id) for run_id in ids}

    async def keys(self, run_id: str) -> list[str]:
        response = await self._get(f"/runs/{run_id}/keys")
        if response.status_code == 404:
            return []
        response.raise_for_status()
        return [str(item["key"]) for item in response.json()]

    async def keys_of_runs(self, run_ids: Iterable[str]) -> dict[str, list[str]]:
        """The metric keys of each of these runs in one read ([] for an unknown run)."""
        ids = list(dict.fromkeys(run_ids))
        if not ids:
            return {}
        response = await self._get("/keys", run_id=ids)
        response.raise_for_status()
        found = response.json()["runs"]
        return {run_id: [str(item["key"]) for item in found.get(run_id, [])] for run_id in ids}

    async def last_steps(self, run_id: str) -> dict[str, int | None]:
        """Each metric key the run logs, with its last step ({} for an unknown run)."""
        response = await self._get(f"/runs/{run_id}/keys")
        if response.status_code == 404:
            return {}
        response.raise_for_status()
        return {str(item["key"]): item.get("last_step") for item in response.json()}

    async def series_of_runs(
        self,
        run_ids: Iterable[str],
        key: str,
        *,
        max_points: int = 1000,
        start: int | None = None,
        end: int | None = None,
    ) -> dict[str, Series]:
        """One metric of several runs in one read; a run without it (or unknown) is empty."""
        ids = list(dict.fromkeys(run_ids))
        if not ids:
            return {}
        response = await self._get("/series", key=key, run_id=ids, max_points=max_points, start=start, end=end)
        response.raise_for_status()
        found = response.json()["runs"]
        return {run_id: Series.from_json(found[run_id]) if run_id in found else Series.empty() for run_id in ids}

    async def hazards(self, run_ids: Iterable[str], *, max_points: int = 2000) -> dict[str, dict[str, Any] | None]:
        """The collapse hazard of each of these runs in one read, as `hazard` gives it (None
        for an unknown run)."""
        ids = list(dict.fromkeys(run_ids))
        if not ids:
            return {}
        response = await self._get("/hazard", run_id=ids, max_points=max_points)
        response.raise_for_status()
        found = response.json()["runs"]
        return {run_id: found.get(run_id) for run_id in ids}

    async def _details(self, path: str, **params: Any) -> dict[str, Any] | None:
        """A read of a run's step details; None for an unknown run, or a server that does not
        store step details (its API answers 404 for the path)."""
        response = await self._get(path, **params)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return dict(response.json())

    async def distributions(
        self,
        run_id: str,
        key: str,
        *,
        start: int | None = None,
        end: int | None = None,
        max_steps: int | None = None,
    ) -> dict[str, Any] | None:
        """Histograms of `key` per step, `{"key", "edges", "steps", "counts", "bucketed"}`
        (empty lists when the run has none); more than `max_steps` steps come in buckets of
        consecutive steps, counts summed."""
        params = {"key": key, "start": start, "end": end, "max_steps": max_steps}
        return await self._details(f"/runs/{run_id}/distributions", **params)

    async def samples(self, run_id: str, step: int | None = None) -> dict[str, Any] | None:
        """The worst sequences of the latest step ≤ `step` that has samples (the run's latest
        without `step`): `{"step", "samples"}`, `{"step": None, "samples": []}` for none."""
        return await self._details(f"/runs/{run_id}/samples", step=step)

    async def sample_steps(self, run_id: str) -> list[int] | None:
        """The steps of the run that have samples, ascending."""
        payload = await self._details(f"/runs/{run_id}/samples/steps")
        return None if payload is None else sorted(int(s) for s in payload.get("steps") or [])

    async def sequences(
        self, run_id: str, *, start: int | None = None, end: int | None = None, max_points: int | None = None
    ) -> dict[str, Any] | None:
        """(length, Σℓ) of the sequences of steps `start`..`end`, `{"steps", "length",
        "log_ratio", "fit"}`, the fit `{"slope_per_1k", "intercept", "n"}` or None."""
        params = {"start": start, "end": end, "max_points": max_points}
        return await self._details(f"/runs/{run_id}/sequences", **params)

    async def alerts(
        self, run_ids: str | Iterable[str], state: str | None = None
    ) -> list[Alert] | None:
        """Alerts of these runs (at most 1000 a read), or None when the server has no alerts
        API (yet) or a read fails."""
        ids = [run_ids] if isinstance(run_ids, str) else list(dict.fromkeys(run_ids))
        if not ids:
            return []  # no run_id would mean every run
        found: list[Alert] = []
        for first in range(0, len(ids), _ALERTS_RUNS_PER_READ):
            page = await self._alerts(run_id=ids[first : first + _ALERTS_RUNS_PER_READ], state=state)
            if page is None:
                return None
            found += page
        return found

    async def firing_alerts(self) -> list[Alert] | None:
        """Every firing alert of every run, newest first: one read per 10,000 alerts (paged by
        `before_id`), whatever the number of runs. None when a read fails."""
        found: list[Alert] = []
        before: int | None = None
        while True:
            page = await self._alerts(state="firing", before_id=before)
            if page is None:
                return None
            found += page
            ids = [int(alert.id) for alert in page if alert.id.isdigit()]
            if len(page) < _ALERTS_LIMIT or not ids or (before is not None and min(ids) >= before):
                return found
            before = min(ids)

    async def _alerts(self, **params: Any) -> list[Alert] | None:
        try:
            response = await self._get("/alerts", limit=_ALERTS_LIMIT, **params)
        except Exception:  # noqa: BLE001 - in-process, the app's own exception comes through
            return None
        if response.status_code != 200:
            return None
        if not response.headers.get("content-type", "").startswith("application/json"):
            return None
        payload = response.json()
        if not isinstance(payload, list):
            return None
        return [Alert.from_json(item) for item in payload if isinstance(item, dict)]

    async def commands(self, run_id: str) -> list[dict[str, Any]]:
        """The run's commands, newest first ([] for an unknown run or an older server)."""
        try:
            response = await self._get(f"/runs/{run_id}/commands")
        except httpx.HTTPError:
            return []
        if response.status_code != 200:
            return []
        commands: list[dict[str, Any]] = as_read(ApiCommand, response.json(), many=True)
        return commands

    async def backtest(self, run_id: str, rules: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """POST /backtest for one run: the default rules, or `rules`. Raises ValueError with
        the server's message when it refuses the rules (400, 404, 422)."""
        body: dict[str, Any] = {"run_ids": [run_id]}
        if rules is not None:
            body["rules"] = rules
        async with self._limit:
            response = await self.client.post("/api/v1/backtest", json=body)
        if response.status_code in (400, 404, 422):
            detail = response.json().get("detail")
            if isinstance(detail, list):
                detail = "; ".join(str(item.get("msg", item)) for item in detail if isinstance(item, dict)) or str(detail)
            raise ValueError(str(detail))
        response.raise_for_status()
        return dict(response.json()["runs"][0])
