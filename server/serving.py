"""How the app is served: one uvicorn Config from Settings, used by `keel serve` and by
the tests' in-process server, and the two deadlines uvicorn does not have (docs/security.md).

uvicorn bounds an idle kept-alive connection (`timeout_keep_alive`) and a websocket peer
that stops answering pings, but not a client that sends its request head slowly
(slowloris: h11 waits for the rest of a request line or header forever, on a fresh
connection too) nor one that sends its body slowly. `HeadDeadlineProtocol` closes a
connection whose request head is not complete `http_header_timeout_s` after it
connected, or after the first byte of its next request; `BodyDeadline` answers 408 to
a request whose body is not complete `http_body_timeout_s` after its head.

The websocket send buffer is bounded by uvicorn itself: its websocket `send` waits
while the transport's write buffer is above its high-water mark (asyncio's 64 KiB), so
at most that plus one message waits in the process for a peer that does not read.

The protocols are uvicorn's with three more things: the head deadline (above); the
security headers (server/origins.py) on the responses uvicorn makes itself (a malformed
request's 400, a 500, a refused websocket handshake), which no ASGI middleware sees; and
a websocket message over `max_frame_bytes` refused as Keel's protocol says (error
`too_large`, close 4413), as soon as its frame header announces it, where uvicorn would
close with 1009. Forwarded headers (X-Forwarded-For, -Proto) are believed only from
`forwarded_allow_ips` (uvicorn's default believes 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, ClassVar

import h11
import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE, H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.frames import CloseCode
from websockets.http11 import Response as WebSocketResponse
from websockets.protocol import State
from websockets.server import ServerProtocol

from server.bodies import Refused, answer_refusal
from server.config import Settings
from server.origins import SECURITY_HEADERS, with_security_headers
from server.redaction import logging_config
from wire import CLOSE_TOO_LARGE, ErrorMessage

__all__ = ["BodyDeadline", "HeadDeadlineProtocol", "KeelWebSocketProtocol", "uvicorn_config"]


def uvicorn_config(
    app: ASGIApp, settings: Settings, *, log_level: str | int = "info", keel_loggers: bool = False
) -> uvicorn.Config:
    """`keel_loggers`: Keel's own loggers log through uvicorn's handler too (server/redaction.py).
    `log_level` "trace" is run as "debug" (see `capped_log_level`)."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=capped_log_level(log_level),
        # Secrets masked in every line, the server's own (whatever their shape) included.
        log_config=logging_config(
            keel_loggers=keel_loggers, secrets=(settings.bootstrap_token, database_password(settings.database_url))
        ),
        lifespan="on",
        http=head_deadline_protocol(settings.http_header_timeout_s),
        # uvicorn's websockets-sansio implementation (pinned: the flow control described
        # above is its), refusing an oversized message with 4413.
        ws=KeelWebSocketProtocol,
        ws_max_size=settings.max_frame_bytes,
        ws_ping_interval=settings.ws_ping_interval_s,
        ws_ping_timeout=settings.ws_ping_timeout_s,
        timeout_keep_alive=settings.http_keep_alive_s,
        # X-Forwarded-For/-Proto only from the proxies the operator names; none by default.
        proxy_headers=bool(settings.forwarded_allow_ips),
        forwarded_allow_ips=list(settings.forwarded_allow_ips),
    )


def capped_log_level(level: str | int) -> str | int:
    """uvicorn's "trace" level logs every request's whole ASGI scope (its headers, the
    login cookie among them, and its raw query string) and every message: debug is the
    most a Keel server logs."""
    if isinstance(level, str):
        return "debug" if level.lower() == "trace" else level
    return max(level, logging.DEBUG)


def database_password(database_url: str) -> str | None:
    """The password in a database URL, in its userinfo or as `?password=`; None if none."""
    from sqlalchemy.engine import make_url

    try:
        url = make_url(database_url)
    except Exception:
        return None
    query_password = url.query.get("password")
    if isinstance(query_password, tuple):
        query_password = query_password[-1] if query_password else None
    return url.password or query_password


def _request_timeout_response(reason: str) -> bytes:
    body = reason.encode()
    security = b"".join(b"%s: %s\r\n" % header for header in SECURITY_HEADERS)
    return (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"connection: close\r\n%scontent-length: %d\r\n\r\n%s" % (security, len(body), body)
    )


class SecureHeadersConnection(h11.Connection):
    """h11's server side, adding the security headers to every response it sends: the
    app's (which has them already) and uvicorn's own (400, 500, 503)."""

    def send_with_data_passthrough(self, event: h11.Event) -> list[bytes] | None:  # what send() calls
        if isinstance(event, h11.Response):  # not 100 Continue, which carries no page
            headers = with_security_headers(event.headers.raw_items())
            if len(headers) != len(event.headers):
                event = h11.Response(
                    status_code=event.status_code, headers=headers, reason=event.reason, http_version=event.http_version
                )
        return super().send_with_data_passthrough(event)


HEAD_TIMEOUT_RESPONSE = _request_timeout_response("request head not received in time")


class HeadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request head (see the module doc), and a
    lingering close after the 400 it answers to a request it cannot read."""

    header_timeout_s: ClassVar[float] = 10.0
    linger_s: ClassVar[float] = 2.0
    """After a 400 for an unreadable request: how long what the client still sends is read and
    dropped before the connection closes."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._lingering = False
        max_event = self.config.h11_max_incomplete_event_size
        self.conn = SecureHeadersConnection(h11.SERVER, DEFAULT_MAX_INCOMPLETE_EVENT_SIZE if max_event is None else max_event)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's 400 for a request h11 cannot read (a request line or head longer than
        `h11_max_incomplete_event_size`, bytes that are no HTTP), closed lingering: a socket
        closed with the rest of a request unread is reset by the kernel, and a client still
        sending a long request line would get the reset and not the 400. So the 400 is sent,
        the write side shut after it, and what the client still sends is dropped until it
        closes or `linger_s` passes."""
        body = json.dumps({"detail": msg}).encode()  # the API's error body (server/schemas.py ErrorOut)
        for event in (
            h11.Response(status_code=400, headers=[(b"content-type", b"application/json"), (b"connection", b"close")], reason=b"Bad Request"),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event) or b"")
        self._disarm()
        self._lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(self.linger_s, self.transport.close)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # the rest of a request already answered with a 400
        if self._head_timer is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)
        # Past IDLE: the head is complete (a body, a websocket upgrade, or an error follows).
        if self.conn.their_state is not h11.IDLE:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if (
            self.transport.is_closing()
            or self.transport.get_protocol() is not self  # upgraded to a websocket meanwhile
            or self.conn.their_state is not h11.IDLE
        ):
            return
        self.transport.write(HEAD_TIMEOUT_RESPONSE)
        self.transport.close()


def head_deadline_protocol(timeout_s: float) -> type[HeadDeadlineProtocol]:
    """The protocol class uvicorn builds per connection, with this deadline."""
    return type("HeadDeadlineProtocol", (HeadDeadlineProtocol,), {"header_timeout_s": timeout_s})


class _KeelServerProtocol(ServerProtocol):
    """websockets' server side: a message over the size limit is answered as Keel's
    protocol says, `{"type": "error", "code": "too_large", ...}` then close 4413, and
    every handshake response carries the security headers."""

    def fail(self, code: CloseCode | int, reason: str = "") -> None:
        if code == CloseCode.MESSAGE_TOO_BIG and self.state is State.OPEN:
            # The frame's header announced more than max_size: refused before its payload
            # is read (or, compressed, as soon as it inflates past it).
            limit = self.max_message_size
            message = ErrorMessage("too_large", f"frame exceeds the limit of {limit} bytes")
            self.send_text(json.dumps(message.to_json()).encode())
            code, reason = CLOSE_TOO_LARGE, "frame too large"
        super().fail(code, reason)

    def reject(self, status: Any, text: str) -> WebSocketResponse:
        return _secured(super().reject(status, text))

    def send_response(self, response: WebSocketResponse) -> None:
        super().send_response(_secured(response))


def _secured(response: WebSocketResponse) -> WebSocketResponse:
    for name, value in SECURITY_HEADERS:
        if name.decode() not in response.headers:
            response.headers[name.decode()] = value.decode()
    return response


class KeelWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol, with `_KeelServerProtocol` as its websocket."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        built = self.conn
        self.conn = _KeelServerProtocol(
            extensions=built.available_extensions, max_size=self.config.ws_max_size, logger=built.logger
        )


class _BodyTimeout(Refused):
    """What a read past the body's deadline raises: 408, the connection closed. A refusal
    (server/bodies.py), so FastAPI's body parsing passes it on as it is (any other exception
    there becomes its 400)."""

    def __init__(self, timeout_s: float):
        super().__init__(408, f"request body not received within {timeout_s:g} s", headers={"connection": "close"})


class BodyDeadline:
    """ASGI middleware: a request body must be complete `timeout_s` after its head, else
    408 with `connection: close` (the app's half-read request is abandoned), whoever read
    it: a route, FastAPI's parsing, the login form."""

    def __init__(self, app: ASGIApp, timeout_s: float):
        self.app = app
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        body_complete = False
        timed_out: _BodyTimeout | None = None

        async def timed_receive() -> Message:
            nonlocal body_complete, timed_out
            if body_complete:  # later reads wait for a disconnect: no deadline
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                timed_out = _BodyTimeout(self.timeout_s)
                raise timed_out from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_complete = True
            return message

        await answer_refusal(self.app, scope, timed_receive, receive, send, lambda: timed_out)
