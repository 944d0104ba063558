"""The live pushes, server -> browser, on `/api/v1/live` (docs/protocol.md, "Live"):
what `dashboard/assets/live/` reads. Rows are encoded as in an ingest frame, without their
step details (up to 64 KiB of samples a step: pages read those over REST)."""

from __future__ import annotations

from typing import Any

from wire import Row, encode_rows

__all__ = ["live_points_message", "live_status_message"]


def live_points_message(run_id: str, rows: list[Row]) -> dict[str, Any]:
    return {"type": "points", "run_id": run_id, "rows": encode_rows(rows, details=False)}


def live_status_message(run_id: str, status: str) -> dict[str, Any]:
    return {"type": "status", "run_id": run_id, "status": status}
