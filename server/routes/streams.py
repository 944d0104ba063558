"""The two websockets: ingest (trainers push) and live (browsers subscribe)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from starlette.types import Message

from server.auth import allowed, presented_token, speaker_of
from server.config import Settings
from server.deps import CommittedDep, ComponentsDep, HubDep, IngestSlotsDep, SettingsDep, StoreDep
from server.errors import Forbidden
from server.fairlock import WRITE_OWNER
from server.ingest import IngestSession, IngestSlots, refuse_overloaded, refuse_unauthorized
from server.live import LiveHub
from server.ratelimit import RateLimited, RateLimits, client_key
from server.signals import SignalSources
from wire import CLOSE_AUTH, CLOSE_OVERLOADED, ProtocolError

router = APIRouter()

FELL_BEHIND = "subscriber fell behind; reload"


class IngestGate:
    """The receive side of an ingest socket, before the session sees a frame.

    The socket takes its ingest slot with its first frame (the hello): one that never
    says hello holds none, and the session's hello timeout closes it. Every frame is
    charged to the client's byte rate: held back while the wait is short (the client is
    paced: its socket is not read), refused (1013, `retry_after_s`) when it is not.
    """

    def __init__(self, websocket: WebSocket, slots: IngestSlots, limits: RateLimits, client: str):
        self.websocket = websocket
        self.slots = slots
        self.limits = limits
        self.client = client
        self.has_slot = False

    async def receive(self) -> Message:
        message = await self.websocket.receive()
        if message["type"] != "websocket.receive":
            return message
        if not self.has_slot:
            refused = self.slots.take(self.client)
            if refused is not None:
                raise ProtocolError(refused, code="overloaded", close_code=CLOSE_OVERLOADED)
            self.has_slot = True
        size = len(message.get("text") or message.get("bytes") or b"")
        reservation = self.limits.bytes.reserve(self.client, size, self.limits.max_pacing_s)
        if not reservation.granted:
            raise RateLimited(reservation.wait_s)
        if reservation.wait_s > 0:
            await asyncio.sleep(reservation.wait_s)
        return message

    def release(self) -> None:
        if self.has_slot:
            self.has_slot = False
            self.slots.give_back(self.client)


@router.websocket("/ingest")
async def ingest(
    websocket: WebSocket,
    store: StoreDep,
    committed: CommittedDep,
    slots: IngestSlotsDep,
    settings: SettingsDep,
    components: ComponentsDep,
) -> None:
    if slots.open >= slots.limit:  # cheap early refusal; the slot itself is taken at the hello
        await refuse_overloaded(websocket, f"too many ingest connections on this server ({slots.limit}); retry later")
        return
    if not await allowed(websocket, "ingest"):  # before any slot: strangers take none
        await refuse_unauthorized(websocket, "ingest")
        return
    client = client_key(websocket, settings.auth_enabled, presented_token(websocket))
    WRITE_OWNER.set(client)  # this socket's writes take their turn with other clients' (fairlock.py)
    try:
        speaker = await speaker_of(websocket)
    except Forbidden:  # revoked since `allowed`
        await refuse_unauthorized(websocket, "ingest")
        return
    gate = IngestGate(websocket, slots, components.rate_limits, client)
    gated = WebSocket(websocket.scope, receive=gate.receive, send=websocket.send)
    try:
        await gated.accept()
        session = IngestSession(
            gated,
            store,
            committed,
            settings.limits,
            budget=components.frame_budget,
            sources=SignalSources(store, components.hub, components.hazards),
            hello_timeout_s=settings.ingest_hello_timeout_s,
            idle_timeout_s=settings.ingest_idle_timeout_s,
            speaker=speaker,
        )
        serving = asyncio.create_task(session.serve())
        revoked = asyncio.create_task(token_revoked(websocket, "ingest", settings))
        try:
            await asyncio.wait((serving, revoked), return_when=asyncio.FIRST_COMPLETED)
            if revoked.done() and not serving.done():
                await session.revoked()  # the session then sees its socket close and ends
            await serving
        finally:
            for task in (serving, revoked):
                task.cancel()
            await asyncio.gather(serving, revoked, return_exceptions=True)
    finally:
        gate.release()


async def token_revoked(websocket: WebSocket, scope: str, settings: Settings) -> None:
    """Returns once the socket's token no longer has `scope` (revoked), looked at every
    `token_recheck_s`; never with auth off."""
    if not settings.auth_enabled:
        await asyncio.Event().wait()
    while True:
        await asyncio.sleep(settings.token_recheck_s)
        if not await allowed(websocket, scope):
            return


@router.websocket("/live")
async def live(websocket: WebSocket, hub: HubDep, settings: SettingsDep, components: ComponentsDep, runs: str | None = None) -> None:
    """Push committed points (and alert changes) of the given runs, or of all runs."""
    run_ids = frozenset(r for r in (runs or "").split(",") if r) or None
    if not await allowed(websocket, "read"):
        await refuse_unauthorized(websocket, "read")
        return
    client = client_key(websocket, settings.auth_enabled, presented_token(websocket))
    slots = components.live_slots
    refused = slots.take(client)
    if refused is not None:
        await refuse_overloaded(websocket, refused)
        return
    try:
        await _live(websocket, hub, settings, run_ids)
    finally:
        slots.give_back(client)


async def _live(websocket: WebSocket, hub: LiveHub, settings: Settings, run_ids: frozenset[str] | None) -> None:
    await websocket.accept()
    subscription = hub.subscribe(run_ids)

    async def push() -> None:
        while (text := await subscription.get()) is not None:
            await websocket.send_text(text)

    async def drain_client() -> None:
        # The client sends nothing we need; reading notices its disconnect.
        while True:
            await websocket.receive_text()

    pusher, reader = asyncio.create_task(push()), asyncio.create_task(drain_client())
    dropped = asyncio.create_task(subscription.wait_dropped())
    revoked = asyncio.create_task(token_revoked(websocket, "read", settings))
    tasks = (pusher, reader, dropped, revoked)
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if revoked.done() and not reader.done():
            pusher.cancel()
            await websocket.close(CLOSE_AUTH, "the token was revoked")
        elif subscription.dropped and not reader.done():
            # The pusher may be stuck sending to a peer that does not read: nothing of
            # that message was written yet, so it is safe to cancel. The close frame
            # then waits behind what is in the socket's buffer (bounded, see
            # server/serving.py), and reaches the page once it reads again.
            pusher.cancel()
            await websocket.close(CLOSE_OVERLOADED, FELL_BEHIND)
    except (WebSocketDisconnect, RuntimeError):
        return
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # retrieved, so asyncio logs none as lost
        hub.unsubscribe(subscription)
