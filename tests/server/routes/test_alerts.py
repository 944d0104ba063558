"""GET /alerts with many runs: up to 1000 run_ids read, more a 422 that says so (never a
500 from a statement past the database's parameter limit); every alert paged by before_id."""

from __future__ import annotations

import asyncio
import time
import urllib.parse
import uuid

import httpx

from server.routes.alerts import MAX_RUNS_PER_READ
from tests.support.toy_runs import LiveRun


def _firing_runs(server, count: int) -> list[str]:  # type: ignore[no-untyped-def]
    runs = [LiveRun(server, f"loud-{i}", "cispo") for i in range(count)]
    for run in runs:
        run.send([{"step": 1, "values": {"grad/norm": "inf"}}])  # non-finite: critical at once
        run.close()
    # Each run may fire more than one rule, not all in the same evaluation: wait until every
    # run fires and the firing set has stayed the same for a second (a loaded box is slow).
    deadline, seen, since = time.monotonic() + 30, None, time.monotonic()
    while True:
        firing = {(a["run_id"], a["id"]) for a in httpx.get(f"{server.url}/api/v1/alerts", params={"state": "firing"}).json()}
        if firing != seen:
            seen, since = firing, time.monotonic()
        elif len({run_id for run_id, _ in firing}) >= count and time.monotonic() - since >= 1.0:
            return [run.id for run in runs]
        assert time.monotonic() < deadline, f"the alerts did not fire and settle: {sorted(firing)}"
        time.sleep(0.05)


def test_alerts_of_many_run_ids_read_up_to_the_cap_and_say_too_many_past_it(server) -> None:
    url = f"{server.url}/api/v1/alerts"
    ids = _firing_runs(server, 2)
    strangers = [str(uuid.uuid4()) for _ in range(MAX_RUNS_PER_READ - len(ids))]
    at_cap = httpx.get(url, params={"run_id": [*strangers, *ids], "state": "firing"}, timeout=30)
    assert at_cap.status_code == 200, at_cap.text
    assert {alert["run_id"] for alert in at_cap.json()} == set(ids)

    too_many = httpx.get(url, params={"run_id": [*strangers, *ids, "one-more"]}, timeout=30)
    assert too_many.status_code == 422, too_many.text
    (problem,) = too_many.json()["detail"]
    assert problem["loc"] == ["query", "run_id"] and "1000" in problem["msg"], problem

    # The runs page's old ask, one run_id per run of 10,000, as the dashboard's in-process
    # client sends it (straight to the app: over a socket uvicorn drops a request line that
    # long, and httpx will not send a query past 64 KiB): a 422, not a 500.
    query = urllib.parse.urlencode([("run_id", str(uuid.uuid4())) for _ in range(10_000)])
    status, body = asyncio.run(_asgi_get(server.app, "/api/v1/alerts", query))
    assert status == 422 and b"1000" in body, body[:300]


async def _asgi_get(app, path: str, query: str) -> tuple[int, bytes]:  # type: ignore[no-untyped-def]
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
        "headers": [(b"host", b"localhost")], "client": ("127.0.0.1", 1), "server": ("localhost", 80),
    }  # fmt: skip
    sent: list[dict] = []  # type: ignore[type-arg]

    async def receive() -> dict:  # type: ignore[type-arg]
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:  # type: ignore[type-arg]
        sent.append(message)

    await app(scope, receive, send)
    return int(sent[0]["status"]), b"".join(m.get("body", b"") for m in sent[1:])


def test_every_firing_alert_pages_by_before_id(server) -> None:
    url = f"{server.url}/api/v1/alerts"
    ids = _firing_runs(server, 3)
    every = httpx.get(url, params={"state": "firing"}).json()
    paged: list[dict] = []  # type: ignore[type-arg]
    before: int | None = None
    while True:
        page = httpx.get(url, params={"state": "firing", "limit": 1, **({"before_id": before} if before else {})}).json()
        if not page:
            break
        paged += page
        before = page[-1]["id"]
    assert [a["id"] for a in paged] == [a["id"] for a in every]  # newest first, each once
    assert {a["run_id"] for a in paged} == set(ids)
    assert httpx.get(url, params={"before_id": 0}).status_code == 422
