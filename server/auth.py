"""API tokens: scoped (ingest, read, admin), stored hashed, checked per request.

Off on loopback by default (local use); required on any other interface. A
token arrives as `Authorization: Bearer <token>`, or, for browsers, as the
`keel_token` cookie set by /login or a `token` query parameter (websockets).
"""

from __future__ import annotations

import hashlib
import ipaddress
import secrets
import time
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Depends, HTTPException
from sqlalchemy import select
from starlette.requests import HTTPConnection

from server.models import ApiToken
from server.storage import Store

SCOPES = ("ingest", "read", "admin")
COOKIE = "keel_token"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "keel_" + secrets.token_urlsafe(32)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def create_token(store: Store, name: str, scopes: list[str], token: str | None = None) -> str:
    unknown = set(scopes) - set(SCOPES)
    if unknown or not scopes:
        raise ValueError(f"scopes must be among {', '.join(SCOPES)}")
    token = token or new_token()
    async with store.writing() as session:
        existing = await session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token)))
        if existing is None:
            session.add(ApiToken(name=name, token_hash=hash_token(token), scopes=scopes, created_at=time.time(), revoked=False))
    return token


async def token_scopes(store: Store, token: str) -> set[str] | None:
    async with store.sessions() as session:
        row = await session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token), ApiToken.revoked.is_(False)))
    if row is None:
        return None
    scopes = set(row.scopes)
    return set(SCOPES) if "admin" in scopes else scopes


def presented_token(conn: HTTPConnection) -> str | None:
    header = conn.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return conn.cookies.get(COOKIE) or conn.query_params.get("token")


async def allowed(conn: HTTPConnection, scope: str) -> bool:
    if not conn.app.state.settings.auth_enabled:
        return True
    token = presented_token(conn)
    if not token:
        return False
    if scope == "read" and secrets.compare_digest(token, conn.app.state.internal_token):
        return True
    scopes = await token_scopes(conn.app.state.store, token)
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
