"""The Keel dashboard (Dash), served by the same process as the API.

Dash >= 4.2 runs natively on FastAPI: `Dash(server=<FastAPI app>)` registers
its routes (`/_dash-*`, `/assets`) on our app and adds its ASGI middleware; no
Flask, no WSGI bridge. Nothing is imported or built until `mount_dashboard` is
called by `server.app.create_app`, after every API route, so API routes match first.
"""

from __future__ import annotations

from typing import Any

__all__ = ["mount_dashboard"]


def mount_dashboard(app: Any, *, internal_token: str | None = None) -> None:
    """Build the Dash app on the FastAPI `app` and serve its pages at /, /compare, /runs/<id>.

    `internal_token` is the read token its in-process API reads carry when auth is on.
    """
    from dashboard.app import mount

    mount(app, internal_token=internal_token)
