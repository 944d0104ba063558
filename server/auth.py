"""Who may do what: each request's token checked against its route's scope.

Off on loopback by default (local use); required on any other interface. A
token arrives as `Authorization: Bearer <token>`, or, for browsers, as the
HttpOnly `keel_token` cookie set by /login (a same-origin websocket sends it
too). Never in the URL: URLs are written to access logs, proxies and browser
history. Tokens themselves: server/tokens.py.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Depends, HTTPException
from starlette.requests import HTTPConnection

from server.deps import get_components
from server.tokens import token_scopes

COOKIE = "keel_token"


def presented_token(conn: HTTPConnection) -> str | None:
    header = conn.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return conn.cookies.get(COOKIE)


async def allowed(conn: HTTPConnection, scope: str) -> bool:
    components = get_components(conn)
    if not components.settings.auth_enabled:
        return True
    token = presented_token(conn)
    if not token:
        return False
    if scope == "read" and secrets.compare_digest(token, components.internal_token):
        return True
    scopes = await token_scopes(components.store, token)
    return scopes is not None and scope in scopes


def require(scope: str) -> Callable[[HTTPConnection], Coroutine[Any, Any, None]]:
    """A dependency that answers 401 unless the request carries a token with `scope`."""

    async def check(conn: HTTPConnection) -> None:
        if not await allowed(conn, scope):
            raise HTTPException(401, f"a token with the {scope!r} scope is required", headers={"WWW-Authenticate": "Bearer"})

    return check


READ = Depends(require("read"))
INGEST = Depends(require("ingest"))
ADMIN = Depends(require("admin"))
