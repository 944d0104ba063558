"""A minimal protocol client for tests, written from docs/protocol.md (raw JSON, no Keel client code)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect


def new_run(name: str = "run", **extra: Any) -> dict[str, Any]:
    return {"id": str(uuid.uuid4()), "name": name, "project": "default", "group": None, "config": {}, "tags": [], **extra}


def hello(ws: ClientConnection, run: dict[str, Any]) -> dict[str, Any]:
    ws.send(json.dumps({"type": "hello", "protocol": 1, "run": run}))
    return dict(json.loads(ws.recv(timeout=10)))


def points(seq: int, rows: list[dict[str, Any]]) -> str:
    return json.dumps({"type": "points", "seq": seq, "rows": rows})


def recv(ws: ClientConnection) -> dict[str, Any]:
    return dict(json.loads(ws.recv(timeout=10)))


def open_ingest(server: Any) -> ClientConnection:
    return connect(f"{server.ws_url}/api/v1/ingest", max_size=None, open_timeout=10)


def series(server: Any, run_id: str, key: str, **params: Any) -> dict[str, Any]:
    response = httpx.get(
        f"{server.url}/api/v1/runs/{run_id}/series", params={"key": key, "max_points": 100_000, **params}
    )
    response.raise_for_status()
    return dict(response.json())
