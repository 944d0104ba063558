"""Reading back what `keel watch` streamed (tests/keel/test_watch*.py)."""

from __future__ import annotations

from typing import Any

import httpx


def api_get(url: str, path: str, **params: Any) -> Any:
    """GET /api/v1{path}: its JSON, or None for a 404."""
    response = httpx.get(f"{url}/api/v1{path}", params=params, timeout=30)
    if response.status_code == 404:
        return None
    response.raise_for_status()
    return response.json()


def stored_series(url: str, run_id: str, key: str) -> dict[int, float]:
    body = api_get(url, f"/runs/{run_id}/series", key=key, max_points=100_000)
    return {} if body is None else dict(zip(body["steps"], body["values"], strict=True))
