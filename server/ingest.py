"""The ingest websocket: hello -> welcome, points -> ack (after commit), finish -> bye.

Every message it sends is built by its type in `wire` (wire/replies.py: Welcome, Ack,
Reject, Bye, ErrorMessage; wire/signals.py: the signals).

One connection streams one run as one writer (docs/protocol.md). Frames are handled in
the order they arrive, so a client may keep several in flight; each ack follows its
commit. A points frame whose seq is readable but whose rows break the protocol is
answered with `reject` (its seq used up, the connection kept); anything else that
breaks the protocol, with an error message and a close code. Neither ever touches what
was already acknowledged. A connection that sends no hello within `hello_timeout_s`, or
nothing for `idle_timeout_s`, is closed with 4408 and frees its slot.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import orjson
from psycopg_pool import PoolTimeout
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeout
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from server.errors import Conflict, Forbidden, TooLarge
from server.live import LiveHub
from server.run_commands import answer
from server.signals import SignalSources, TrainerSignals
from server.storage import FrameRef, Speaker, Store
from wire import (
    ACCEPTS,
    CLOSE_AUTH,
    CLOSE_CONFLICT,
    CLOSE_FORBIDDEN,
    CLOSE_IDLE,
    CLOSE_OVERLOADED,
    CLOSE_SERVER_FAULT,
    CLOSE_TOO_LARGE,
    Ack,
    Bye,
    ErrorMessage,
    Finish,
    Hello,
    Limits,
    LivePoints,
    LiveStatus,
    ProtocolError,
    Reject,
    Row,
    Welcome,
    parse_rows,
    parse_seq,
)
from wire.signals import SIGNALS, CommandResult, Listen

log = logging.getLogger("keel.ingest")

OFFLOAD_BYTES = 256 * 1024
"""Frames at least this large are decoded and validated on a worker thread, so a huge
frame does not hold the event loop (other clients' acks) for its whole parse."""

PointsListener = Callable[[str, float, list[Row]], Awaitable[None]]
"""Called after each commit with the run id, the incarnation of the run written to (its
`started_at`: a run id deleted and created again is another run) and the rows just stored
(alert engine seam)."""


class IngestState(enum.Enum):
    AWAIT_HELLO = "await_hello"
    STREAMING = "streaming"
    FINISHED = "finished"


class AfterCommit:
    """What follows every committed write, from the websocket or from REST: the live push
    (to this replica's pages, and a note to the other replicas'), then the listeners (the
    alert engine), in order."""

    def __init__(self, hub: LiveHub, listeners: Sequence[PointsListener] = ()):
        self.hub = hub
        self.listeners = list(listeners)

    async def points(self, run_id: str, started_at: float, rows: list[Row]) -> None:
        if self.hub.watching(run_id):
            self.hub.publish(run_id, LivePoints(run_id, rows).to_json(), relay=False)
        self.hub.points_committed(run_id, (row.step for row in rows))
        for listener in self.listeners:
            try:
                await listener(run_id, started_at, rows)
            except Exception:
                # A listener (alert engine) failing must not fail ingest: data is committed.
                log.exception("points listener failed for run %s", run_id)

    def status(self, run_id: str, status: str) -> None:
        self.hub.publish(run_id, LiveStatus(run_id, status).to_json())


class SocketSlots:
    """Counts open sockets of one kind against the server's maximum and each client's (a
    token, or an address with auth off: ratelimit.client_key), so that one client cannot take
    every slot and lock the others out."""

    def __init__(self, limit: int, per_client: int | None = None, what: str = "ingest"):
        self.limit = limit
        self.per_client = per_client if per_client is not None else limit
        self.what = what
        self.open = 0
        self._by_client: dict[str, int] = {}

    def take(self, client: str = "") -> str | None:
        """A slot for `client`; None when taken, else the refusal naming the cap it hit."""
        if self.open >= self.limit:
            return f"too many {self.what} connections on this server ({self.limit}); retry later"
        held = self._by_client.get(client, 0)
        if held >= self.per_client:
            return f"too many {self.what} connections for this token or address ({self.per_client}); retry later"
        self.open += 1
        self._by_client[client] = held + 1
        return None

    def give_back(self, client: str = "") -> None:
        self.open -= 1
        held = self._by_client.get(client, 1) - 1
        if held > 0:
            self._by_client[client] = held
        else:
            self._by_client.pop(client, None)


IngestSlots = SocketSlots
"""The ingest sockets' slots (the name the components use)."""


class FrameBudget:
    """Bytes of frames being decoded and written at once, over every ingest socket.

    A decoded frame holds about ten times its JSON in memory until its rows are written; a
    slow database would otherwise let every blocked socket keep one. A socket whose next
    frame does not fit waits (it is not read further: the client's window stalls), so
    server memory stays bounded however slow the database is.
    """

    def __init__(self, limit_bytes: int):
        self.limit = limit_bytes
        self.used = 0
        self._freed = asyncio.Condition()

    @asynccontextmanager
    async def reserve(self, size: int) -> AsyncIterator[None]:
        size = min(size, self.limit)  # a frame larger than the whole budget waits for all of it
        async with self._freed:
            await self._freed.wait_for(lambda: self.used + size <= self.limit)
            self.used += size
        try:
            yield
        finally:
            async with self._freed:
                self.used -= size
                self._freed.notify_all()


class _Silent(Exception):
    """The client sent nothing within the connection's timeout."""


class IngestSession:
    """The server side of one ingest websocket, as an explicit state machine."""

    def __init__(
        self,
        websocket: WebSocket,
        store: Store,
        committed: AfterCommit,
        limits: Limits,
        *,
        budget: FrameBudget,
        sources: SignalSources | None = None,
        hello_timeout_s: float = 10.0,
        idle_timeout_s: float = 300.0,
        speaker: Speaker | None = None,
    ):
        self.websocket = websocket
        self.speaker = speaker
        """Whose token this socket presented (None with auth off): it may write only to runs
        of that token's name (docs/security.md, "Who speaks for a run")."""
        self.store = store
        self.committed = committed
        self.limits = limits
        self.hello_timeout_s = hello_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.budget = budget
        self.state = IngestState.AWAIT_HELLO
        self.run_id: str | None = None
        self.writer = ""
        self.session_id = ""
        self._large = False  # the message being handled came in a frame >= OFFLOAD_BYTES
        self.sources = sources
        """Where the signals a trainer may listen to come from (None: this server sends none)."""
        self.signals: TrainerSignals | None = None
        self._sending = asyncio.Lock()  # acks and signals take turns on the socket

    async def serve(self) -> None:
        try:
            await self._serve()
        finally:
            if self.signals is not None:
                await self.signals.close()

    async def _serve(self) -> None:
        try:
            while self.state is not IngestState.FINISHED:
                raw = await self._receive()
                if raw is None:
                    return
                async with self.budget.reserve(len(raw)):
                    await self._dispatch(await self._decode(raw))
        except ProtocolError as exc:
            await self._fail(exc.to_message(), exc.close_code)
        except Conflict as exc:
            await self._fail(ErrorMessage(exc.code, str(exc)).to_json(), CLOSE_CONFLICT)
        except Forbidden as exc:  # a hello for another token's run: nothing of it changed
            await self._fail(ErrorMessage("forbidden", str(exc)).to_json(), CLOSE_FORBIDDEN)
        except (SQLAlchemyTimeout, PoolTimeout):
            # Every database connection is busy (a slow or locked database): overloaded,
            # not broken. Nothing of this frame was acked; the client resends it.
            await self._fail(ErrorMessage("overloaded", "the database is busy; retry later").to_json(), CLOSE_OVERLOADED)
        except _Silent:
            waited = "hello" if self.state is IngestState.AWAIT_HELLO else "frame"
            timeout = self.hello_timeout_s if self.state is IngestState.AWAIT_HELLO else self.idle_timeout_s
            await self._fail(ErrorMessage("timeout", f"no {waited} within {timeout:g} s").to_json(), CLOSE_IDLE)
        except WebSocketDisconnect:
            return
        except Exception:
            log.exception("ingest failed for run %s", self.run_id)
            await self._fail(ErrorMessage("server_fault", "internal error; retry").to_json(), CLOSE_SERVER_FAULT)

    async def _receive(self) -> str | bytes | None:
        """The next frame's text, or None once the client has gone."""
        timeout = self.hello_timeout_s if self.state is IngestState.AWAIT_HELLO else self.idle_timeout_s
        try:
            event = await asyncio.wait_for(self.websocket.receive(), timeout)
        except TimeoutError:
            raise _Silent() from None
        if event["type"] == "websocket.disconnect":
            return None
        raw: str | bytes | None = event.get("text")
        if raw is None:
            raw = event.get("bytes") or b""
        if len(raw) > self.limits.max_frame_bytes:
            raise ProtocolError(
                f"frame of {len(raw)} bytes exceeds the limit of {self.limits.max_frame_bytes}",
                code="too_large",
                close_code=CLOSE_TOO_LARGE,
            )
        return raw

    async def _decode(self, raw: str | bytes) -> dict[str, Any]:
        self._large = len(raw) >= OFFLOAD_BYTES
        try:
            message = await asyncio.to_thread(orjson.loads, raw) if self._large else orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ProtocolError(f"frame is not valid JSON: {exc}") from None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise ProtocolError("frame must be a JSON object with a string 'type'")
        return message

    async def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if self.state is IngestState.AWAIT_HELLO:
            hello = Hello.from_json(message, self.limits)
            info, self.writer = hello.run, hello.writer
            acked_seq, self.session_id = await self.store.open_run(info, time.time(), writer=self.writer, speaker=self.speaker)
            self.run_id = info.id
            self.state = IngestState.STREAMING
            signals = SIGNALS if self.sources is not None else None  # a server without them says nothing
            await self._send(Welcome(info.id, acked_seq, ACCEPTS, signals).to_json())
            await self._listen(Listen(hello.listen, hello.actions))
            return
        assert self.run_id is not None
        if kind == "points":
            frame = FrameRef(self.writer, self.session_id, parse_seq(message))
            try:
                if self._large:
                    rows = await asyncio.to_thread(parse_rows, message.get("rows"), self.limits)
                else:
                    rows = parse_rows(message.get("rows"), self.limits)
            except ProtocolError as exc:
                await self.store.reject_frame(self.run_id, frame, time.time())
                await self._send(Reject.of(frame.seq, exc).to_json())
                return
            try:
                result = await self.store.write_points(self.run_id, rows, time.time(), frame)
            except TooLarge as exc:  # new keys past the run's limit: nothing of it stored
                await self.store.reject_frame(self.run_id, frame, time.time())
                await self._send(Reject.of(frame.seq, exc).to_json())
                return
            await self._send(Ack(frame.seq).to_json())
            if result.stored:
                await self.committed.points(self.run_id, result.started_at, rows)
                if self.signals is not None:
                    self.signals.stored(result.started_at)
        elif kind == "finish":
            finish = Finish.from_json(message)
            await self.store.finish_run(self.run_id, finish.status, time.time(), writer=self.writer, last_seq=finish.last_seq)
            self.committed.status(self.run_id, finish.status)
            await self._send(Bye().to_json())
            self.state = IngestState.FINISHED
            await self.websocket.close(1000)
        elif kind == "listen":
            await self._listen(Listen.from_json(message))
        elif kind == "command_result":
            answered = CommandResult.from_json(message)
            if self.sources is not None:
                by = "local" if self.speaker is None else self.speaker.name
                await answer(self.sources.store, self.run_id, answered.id, answered.ok, answered.message, time.time(), by=by)
        elif kind == "hello":
            raise ProtocolError("hello was already received on this connection")
        else:
            raise ProtocolError(f"unknown message type {kind[:40]!r}")

    async def revoked(self) -> None:
        """The token this socket was opened with was revoked: say so and close (4401)."""
        await self._fail(ErrorMessage("unauthorized", "the token was revoked").to_json(), CLOSE_AUTH)

    async def _listen(self, listen: Listen) -> None:
        """A hello's or a listen message's `listen` (docs/protocol.md, "Signals"), and the
        command actions its trainer takes (stored on the run: the run page offers those)."""
        signals, actions = listen.signals, listen.actions
        if self.sources is None or self.run_id is None or (self.signals is None and not signals):
            return
        if "commands" in signals:
            await self.store.set_actions(self.run_id, {} if actions is None else actions)
        elif self.signals is not None and "commands" in self.signals.signals:
            await self.store.set_actions(self.run_id, None)  # it stopped listening
        if self.signals is None:
            self.signals = TrainerSignals(self.sources, self.run_id, self._send)
        self.signals.listen(signals)

    async def _send(self, message: dict[str, Any]) -> None:
        text = orjson.dumps(message).decode()
        async with self._sending:
            try:
                await self.websocket.send_text(text)
            except RuntimeError as exc:
                # The server closed this socket under the session (a keepalive ping went
                # unanswered): uvicorn refuses a send after its close. The client is gone as
                # surely as after a disconnect; it resends what was not acked.
                raise WebSocketDisconnect(1006, "the connection closed before this message") from exc

    async def _fail(self, message: dict[str, Any], close_code: int) -> None:
        if self.websocket.application_state is WebSocketState.CONNECTED:
            try:
                await self._send(message)
                await self.websocket.close(close_code)
            except (WebSocketDisconnect, RuntimeError):
                pass


async def refuse_unauthorized(websocket: WebSocket, scope: str) -> None:
    await websocket.accept()
    refusal = ErrorMessage("unauthorized", f"a token with the {scope!r} scope is required")
    await websocket.send_text(orjson.dumps(refusal.to_json()).decode())
    await websocket.close(CLOSE_AUTH)


async def refuse_overloaded(websocket: WebSocket, message: str = "too many ingest connections; retry later") -> None:
    await websocket.accept()
    await websocket.send_text(orjson.dumps(ErrorMessage("overloaded", message).to_json()).decode())
    await websocket.close(CLOSE_OVERLOADED, message[:120])


__all__ = [
    "AfterCommit", "IngestSession", "IngestSlots", "IngestState", "PointsListener", "SocketSlots", "refuse_overloaded",
    "refuse_unauthorized",
]
