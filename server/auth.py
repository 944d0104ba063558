"""Who may do what: each request's token checked against its route's scope.

Off on loopback by default (local use); required on any other interface. A
token arrives as `Authorization: Bearer <token>`, or, for browsers, as the
HttpOnly `keel_token` cookie set by /login (a same-origin websocket sends it
too). Never in the URL: URLs are written to access logs, proxies and browser
history. Tokens themselves: server/api_tokens.py.

Guessing is limited per client address (`FailedAuthLimit`): every token looked up for a
request and found to be no live token's (a bad bearer token or cookie, a wrong token at
/login, an unknown token at /whoami) spends one from the address's bucket
(`auth_failures_per_s`, `auth_failures_burst`); while it is empty, a request from that
address that carries a credential, or signs in, is answered 429 with Retry-After before
anything is looked up.
"""

from __future__ import annotations

import logging
import secrets

from fastapi import Depends, HTTPException
from starlette.requests import HTTPConnection
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from server.api_tokens import UNKNOWN_TOKEN_SEEN, token_identity, token_scopes
from server.deps import get_components
from server.errors import Forbidden
from server.ratelimit import RateLimiter, address_key
from server.storage.admission import Speaker

COOKIE = "keel_token"
LOGIN_PATH = "/login"

log = logging.getLogger("keel.auth")


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
    if _same(token, components.internal_token):  # the dashboard's own reads: never looked up
        return scope == "read"
    scopes = await token_scopes(components.store, token)
    return scopes is not None and scope in scopes


async def speaker_of(conn: HTTPConnection) -> Speaker | None:
    """Who a request or socket speaks as when it writes to a run: its token's name and
    whether that token is an admin's; None with auth off (every writer is the same)."""
    components = get_components(conn)
    if not components.settings.auth_enabled:
        return None
    token = presented_token(conn) or ""
    identity = await token_identity(components.store, token) if token else None
    if identity is None:  # `allowed` let it in: a token revoked in between
        raise Forbidden("the token was revoked")
    name, scopes = identity
    return Speaker(name, admin="admin" in scopes)


def _same(token: str, secret: str) -> bool:
    # As bytes: compare_digest refuses str with non-ASCII characters (a header may hold any latin-1).
    return secrets.compare_digest(token.encode(), secret.encode())


def unauthorized(scope: str) -> HTTPException:
    return HTTPException(401, f"a token with the {scope!r} scope is required", headers={"WWW-Authenticate": "Bearer"})


class Require:
    """A route dependency that answers 401 unless the request carries a token with `scope`.
    server.schemas.ApiRoute reads `scope` too: FastAPI parses a JSON body before it resolves
    dependencies, and a body that does not parse must not be judged before its sender is."""

    def __init__(self, scope: str):
        self.scope = scope

    async def __call__(self, conn: HTTPConnection) -> None:
        if not await allowed(conn, self.scope):
            raise unauthorized(self.scope)


class FailedAuthLimit:
    """ASGI middleware (inside OriginGuard): counts each failed token lookup of a request
    against the client's address, and answers 429 to a request that carries a credential
    (Authorization: Bearer, the login cookie) or signs in (POST /login) from an address
    whose bucket is empty, before its token is looked up. The dashboard's own in-process
    reads (the internal token) are never held. With auth off, nothing is counted."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        components = getattr(scope["app"].state, "components", None) if "app" in scope else None
        if scope["type"] not in ("http", "websocket") or components is None or not components.settings.auth_enabled:
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        limiter = components.rate_limits.auth_failures
        address = address_key(conn)
        token = presented_token(conn)
        signs_in = scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == LOGIN_PATH
        if signs_in or (token and not _same(token, components.internal_token)):
            state = limiter.peek(address, 1)
            if not state.granted:
                await _too_many_failures(state.retry_after_s, signs_in)(scope, receive, send)
                return
        reset = UNKNOWN_TOKEN_SEEN.set(lambda: _failed(limiter, address))
        try:
            await self.app(scope, receive, send)
        finally:
            UNKNOWN_TOKEN_SEEN.reset(reset)


def _failed(limiter: RateLimiter, address: str) -> None:
    limiter.reserve(address, 1)
    if not limiter.peek(address, 1).granted:
        log.warning("too many failed authentications from %s: its credentials are refused (429) for now", address[5:])


def _too_many_failures(retry_after_s: int, signs_in: bool) -> Response:
    message = f"too many failed authentications from this address; retry in {retry_after_s} s"
    headers = {"Retry-After": str(retry_after_s)}
    if signs_in:  # a browser's form post: a page, not JSON
        return HTMLResponse(f"<!doctype html><title>Keel: sign in</title><p>{message}</p>", 429, headers=headers)
    return JSONResponse({"detail": message}, 429, headers=headers)


READ = Depends(Require("read"))
INGEST = Depends(Require("ingest"))
ADMIN = Depends(Require("admin"))
