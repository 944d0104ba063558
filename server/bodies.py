"""Request bodies: each route's byte limit, enforced while the body is read, and the byte
rate charged for what is read (docs/security.md, "Sizes" and "Rate limits").

`BodyLimit` is an ASGI middleware just inside `SecurityHeaders`, so outside everything
that could read a body: authentication, the login form, FastAPI's body parsing, Dash. A
body is counted as it arrives, whether it is sent with a Content-Length or chunked: a
Content-Length over the route's limit is answered 413 before a byte of the body is read,
and a chunked body is answered 413 as soon as what was read passes the limit, so no body
larger than its route's limit is ever held in memory. The 413 closes the connection (the
rest of the body is never read).

Limits, per route: the frame limit (`max_frame_bytes`) for the bodies that carry what a
frame carries (`POST /api/v1/runs/{id}/points`, `PATCH /api/v1/runs/{id}`) and for the
dashboard's callbacks (which send a run's metric keys back); `LOGIN_BODY_BYTES` for
`POST /login`; `max_body_bytes` for every other request.

The bytes of a REST write (POST, PUT, PATCH, DELETE under /api/) are charged to its
client's byte bucket (server/ratelimit.py) when the app reads them: a Content-Length
whole at the first read, a chunked body chunk by chunk. Over the rate: 429 with
Retry-After, the body unprocessed; what is left of it (at most the route's limit) is read
and dropped first, so that a client still sending sees the answer on a connection that
stays open. A request refused before its body is read (a foreign page's, one without a
valid token on a route that checks it first) is charged nothing.

A refusal is raised inside the app from its read (`Refused`, an HTTPException: FastAPI's
body parsing passes it on, and the app answers it); whatever the app answers instead (a
parse error, a 500 for an exception group around it) is replaced by the refusal.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.auth import presented_token
from server.config import Settings
from server.ratelimit import client_key

__all__ = ["LOGIN_BODY_BYTES", "BodyLimit", "BodyOverRate", "BodyTooLarge", "Refused", "answer_refusal", "body_limit"]

log = logging.getLogger("keel.bodies")

LOGIN_BODY_BYTES = 4 * 1024
"""`POST /login`: a form with one token in it."""
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_FRAME_ROUTES = (
    ("POST", re.compile(r"/api/v1/runs/[^/]+/points")),
    ("PATCH", re.compile(r"/api/v1/runs/[^/]+")),
    ("POST", re.compile(r"/_dash-update-component")),
)
"""The requests whose bodies may be as large as a frame."""


def body_limit(settings: Settings, method: str, path: str) -> int:
    """The most bytes of body `method path` may send."""
    if method == "POST" and path == "/login":
        return LOGIN_BODY_BYTES
    for frame_method, pattern in _FRAME_ROUTES:
        if method == frame_method and pattern.fullmatch(path):
            return settings.max_frame_bytes
    return settings.max_body_bytes


class Refused(HTTPException):
    """What reading a body raises inside the app once the body is refused. FastAPI's body
    parsing passes an HTTPException on as it is, and the app's handler answers it; where
    something in between wraps it (a task group's exception group, a parse error), the
    middleware answers it itself, in place of whatever the app answered."""

    def response(self) -> JSONResponse:
        return JSONResponse({"detail": self.detail}, self.status_code, headers=self.headers)


class BodyTooLarge(Refused):
    """413; the connection is closed (the rest of the body is never read)."""

    def __init__(self, detail: str):
        super().__init__(413, detail, headers={"connection": "close"})


class BodyOverRate(Refused):
    """429: the client's byte bucket cannot give what the body costs now."""

    def __init__(self, retry_after_s: int):
        super().__init__(
            429, f"rate limit exceeded; retry in {retry_after_s} s", headers={"Retry-After": str(retry_after_s)}
        )


def _content_length(scope: Scope) -> int | None:
    value = Headers(scope=scope).get("content-length")
    try:
        return None if value is None else int(value)
    except ValueError:
        return None  # h11 refuses it before the app sees it


def _ours(exc: BaseException) -> bool:
    """Whether `exc` is a refusal (alone, or all of an exception group)."""
    if isinstance(exc, Refused):
        return True
    inner = getattr(exc, "exceptions", None)  # an exception group's (a task group's)
    return isinstance(inner, tuple) and bool(inner) and all(_ours(one) for one in inner)


class BodyLimit:
    """ASGI middleware: a body over its route's limit is refused with 413 while it is read
    (see the module doc), and REST write bodies are charged to the byte rate as they are read."""

    def __init__(self, app: ASGIApp, settings: Settings):
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        limit = body_limit(self.settings, method, path)
        length = _content_length(scope)
        if length is not None and length > limit:
            await BodyTooLarge(f"body of {length} bytes exceeds {limit}").response()(scope, receive, send)
            return
        charge = _byte_charge(scope) if method in WRITE_METHODS and path.startswith("/api/") else None
        read = 0
        charged_whole = False
        refusal: Refused | None = None

        async def drain(more: bool) -> None:
            """Read the rest of a body refused for the rate, not keeping it (at most the
            limit: it is answered on a connection kept open, and a client that is still
            sending would otherwise not see the answer)."""
            nonlocal read, refusal
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    return
                read += len(message.get("body", b""))
                if read > limit:
                    refusal = BodyTooLarge(f"body exceeds {limit} bytes")
                    return
                more = message.get("more_body", False)

        async def limited_receive() -> Message:
            nonlocal read, charged_whole, refusal
            if refusal is not None:
                raise refusal
            if charge is not None and length is not None and not charged_whole:
                charged_whole = True
                retry_after = charge(length)  # the whole body, before a byte of it is read
                if retry_after is not None:
                    refusal = BodyOverRate(retry_after)
                    await drain(length > 0)
                    raise refusal
            message = await receive()
            if message["type"] == "http.request":
                size = len(message.get("body", b""))
                read += size
                if read > limit:
                    refusal = BodyTooLarge(f"body exceeds {limit} bytes")
                    raise refusal
                if charge is not None and length is None and size:
                    retry_after = charge(size)
                    if retry_after is not None:
                        refusal = BodyOverRate(retry_after)
                        await drain(message.get("more_body", False))
                        raise refusal
            return message

        await answer_refusal(self.app, scope, limited_receive, receive, send, lambda: refusal)


async def answer_refusal(
    app: ASGIApp, scope: Scope, app_receive: Receive, receive: Receive, send: Send, refusal: Callable[[], Refused | None]
) -> None:
    """Run `app` with `app_receive`; once `refusal()` names what one of its reads raised, the
    client gets that refusal, whatever the app answers instead (a parse error's 400, a 500
    for an exception group around it) or raises, unless its own answer had already begun."""
    started = replaced = False

    async def guarded_send(message: Message) -> None:
        nonlocal started, replaced
        if message["type"] == "http.response.start":
            started = True
            refused = refusal()
            if refused is not None and message["status"] != refused.status_code:
                replaced = True  # the app made something else of its cut-short read: the client is told why
                await refused.response()(scope, receive, send)
                return
        if not replaced:
            await send(message)

    try:
        await app(scope, app_receive, guarded_send)
    except Exception as exc:
        refused = refusal()
        if refused is None or started:
            raise
        if not _ours(exc):  # what the app made of its cut-short read
            log.debug("%s %s failed once its body was refused", scope["method"], scope["path"], exc_info=exc)
        await refused.response()(scope, receive, send)


def _byte_charge(scope: Scope) -> Callable[[int], int | None] | None:
    """A function that spends `n` from the request's client's byte bucket, answering None,
    or, when the bucket cannot give it now, the seconds to wait (spending nothing); None
    when the app has no rate limits (yet)."""
    app = scope.get("app")
    components = getattr(app.state, "components", None) if app is not None else None
    if components is None:
        return None
    conn = HTTPConnection(scope)
    client = client_key(conn, components.settings.auth_enabled, presented_token(conn))
    limiter = components.rate_limits.bytes

    def charge(size: int) -> int | None:
        reservation = limiter.reserve(client, size)
        return None if reservation.granted else reservation.retry_after_s

    return charge
