"""What a run stored on a real server, read back over the REST API: the native framework
loggers' tests (tests/trainer_hooks/integrations/) stream through the integration and check
the series, the keys and the run's record it left."""

from __future__ import annotations

from typing import Any

import httpx


def stored(url: str, run_id: str, key: str) -> dict[int, float]:
    """The run's series of `key`: {step: value} (NaN and Inf as floats)."""
    response = httpx.get(f"{url}/api/v1/runs/{run_id}/series", params={"key": key})
    response.raise_for_status()
    body = response.json()
    return {step: float(value) for step, value in zip(body["steps"], body["values"], strict=True)}


def run_of(url: str, run_id: str) -> dict[str, Any]:
    """The run's record (name, project, group, tags, status, config, ...)."""
    response = httpx.get(f"{url}/api/v1/runs/{run_id}")
    response.raise_for_status()
    return dict(response.json())


def run_named(url: str, name: str) -> dict[str, Any]:
    """The record of the one run named `name` (for a run an integration started itself)."""
    runs = httpx.get(f"{url}/api/v1/runs").json()
    items = runs["items"] if isinstance(runs, dict) else runs
    (run,) = [r for r in items if r["name"] == name]
    return run_of(url, run["id"])


def keys_of(url: str, run_id: str) -> set[str]:
    """Every metric key the run stored."""
    return {k["key"] for k in httpx.get(f"{url}/api/v1/runs/{run_id}/keys").json()}
