"""The live pushes, server -> browser, on `/api/v1/live` (docs/protocol.md, "Live"):
what `dashboard/assets/live/` reads. Each is built by its typed message in `wire.live`
(`LivePoints`, `LiveStatus`; alert changes are `wire.signals.AlertMessage`), encoded once
here for the hub, which queues the same JSON for every subscriber and relays it to the
other replicas. Rows go without their step details (up to 64 KiB of samples a step: pages
read those over REST)."""

from __future__ import annotations

from typing import Any

from wire import LivePoints, LiveStatus, Row

__all__ = ["live_points_message", "live_status_message"]


def live_points_message(run_id: str, rows: list[Row]) -> dict[str, Any]:
    return LivePoints(run_id, rows).to_json()


def live_status_message(run_id: str, status: str) -> dict[str, Any]:
    return LiveStatus(run_id, status).to_json()
