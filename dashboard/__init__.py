"""The Keel dashboard (Dash), served by the same process as the API."""

from __future__ import annotations

from typing import Any

__all__ = ["mount_dashboard"]


def mount_dashboard(app: Any, settings: Any) -> None:
    """Attach the dashboard's pages to the FastAPI app."""
    from fastapi.responses import HTMLResponse

    @app.get("/", include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse("<!doctype html><title>Keel</title><h1>Keel</h1><p>API at <a href='/docs'>/docs</a>.</p>")
