"""The two websockets: ingest (trainers push) and live (browsers subscribe)."""

from __future__ import annotations

import asyncio

import orjson
from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from server.auth import allowed
from server.deps import CommittedDep, HubDep, IngestSlotsDep, SettingsDep, StoreDep
from server.ingest import IngestSession, refuse_overloaded, refuse_unauthorized

router = APIRouter()


@router.websocket("/ingest")
async def ingest(
    websocket: WebSocket, store: StoreDep, committed: CommittedDep, slots: IngestSlotsDep, settings: SettingsDep
) -> None:
    if slots.open >= slots.limit:
        await refuse_overloaded(websocket)
        return
    if not await allowed(websocket, "ingest"):
        await refuse_unauthorized(websocket, "ingest")
        return
    if not slots.take():  # taken by another socket while this one was authorised
        await refuse_overloaded(websocket)
        return
    try:
        await websocket.accept()
        await IngestSession(websocket, store, committed, settings.limits).serve()
    finally:
        slots.give_back()


@router.websocket("/live")
async def live(websocket: WebSocket, hub: HubDep, runs: str | None = None) -> None:
    """Push committed points (and alert changes) of the given runs, or of all runs."""
    run_ids = frozenset(r for r in (runs or "").split(",") if r) or None
    if not await allowed(websocket, "read"):
        await refuse_unauthorized(websocket, "read")
        return
    await websocket.accept()
    subscription = hub.subscribe(run_ids)

    async def drain_client() -> None:
        # The client sends nothing we need; reading notices its disconnect.
        while True:
            await websocket.receive_text()

    reader = asyncio.create_task(drain_client())
    try:
        while True:
            getter = asyncio.create_task(subscription.get())
            done, _ = await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
            if reader in done:
                getter.cancel()
                return
            message = getter.result()
            if message is None:
                await websocket.close(1013, "subscriber fell behind; reload")
                return
            await websocket.send_text(orjson.dumps(message).decode())
    except (WebSocketDisconnect, RuntimeError):
        return
    finally:
        reader.cancel()
        if reader.done() and not reader.cancelled():
            reader.exception()  # retrieved, so asyncio does not log it as lost
        hub.unsubscribe(subscription)
