"""API tokens: scoped (ingest, read, admin), stored hashed, shown once at creation.

Checked per request by server.auth.
"""

from __future__ import annotations

import hashlib
import ipaddress
import secrets
import time
from collections.abc import Callable
from contextvars import ContextVar

from sqlalchemy import select, update

from server.models import ApiToken
from server.storage import Store

SCOPES = ("ingest", "read", "admin")


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


UNKNOWN_TOKEN_SEEN: ContextVar[Callable[[], None] | None] = ContextVar("keel_unknown_token_seen", default=None)
"""What to call when a lookup finds no live token: set per request by server.auth's
`FailedAuthLimit`, which counts it against the client's address (docs/security.md)."""


async def token_scopes(store: Store, token: str) -> set[str] | None:
    """The scopes of a live token, None for an unknown or revoked one (a failed
    authentication, reported to UNKNOWN_TOKEN_SEEN)."""
    async with store.sessions() as session:
        row = await session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token), ApiToken.revoked.is_(False)))
    if row is None:
        report = UNKNOWN_TOKEN_SEEN.get()
        if report is not None:
            report()
        return None
    scopes = set(row.scopes)
    return set(SCOPES) if "admin" in scopes else scopes


async def token_identity(store: Store, token: str) -> tuple[str, set[str]] | None:
    """(name, scopes) of a live token in one lookup, None for an unknown or revoked one."""
    async with store.sessions() as session:
        row = (await session.execute(
            select(ApiToken.name, ApiToken.scopes).where(ApiToken.token_hash == hash_token(token), ApiToken.revoked.is_(False))
        )).first()
    if row is None:
        return None
    scopes = set(row.scopes)
    return row.name, set(SCOPES) if "admin" in scopes else scopes


async def token_name(store: Store, token: str) -> str | None:
    """The name of a live (not revoked) token, None for an unknown one."""
    async with store.sessions() as session:
        return await session.scalar(
            select(ApiToken.name).where(ApiToken.token_hash == hash_token(token), ApiToken.revoked.is_(False))
        )


async def list_tokens(store: Store) -> list[ApiToken]:
    """Every token (live and revoked), oldest first; their hashes only, never the tokens."""
    async with store.sessions() as session:
        return list((await session.scalars(select(ApiToken).order_by(ApiToken.id))).all())


async def revoke_tokens(store: Store, name: str) -> int:
    """Revoke every live token named `name`; how many. A revoked token is refused by REST at
    once and its open sockets are closed within `token_recheck_s` (server/routes/streams.py)."""
    async with store.writing() as session:
        result = await session.execute(
            update(ApiToken).where(ApiToken.name == name, ApiToken.revoked.is_(False)).values(revoked=True)
        )
        return int(getattr(result, "rowcount", 0) or 0)


def token_json(token: ApiToken) -> dict[str, object]:
    return {"id": token.id, "name": token.name, "scopes": list(token.scopes), "created_at": token.created_at, "revoked": token.revoked}
