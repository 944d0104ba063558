"""Live fan-out across replicas: PostgreSQL LISTEN/NOTIFY feeding every replica's LiveHub.

Each replica publishes to its own hub; the hub relays what it publishes here, and this
notifies the other replicas on one channel. A notification about points carries only
the run and the step range (NOTIFY payloads are small): a replica whose browsers watch
that run reads the rows back from the database and publishes them. Alert and status
messages travel whole. Notes are sent from a queue by a background task, so the ingest
path never waits on them: what queued within `LINGER_S` goes in one statement, packed
many notes to a notification (`{"o": origin, "n": [note, ...]}`), so 64 live runs cost a
few dozen notifications a second to send and to receive, not one per frame. A replica
ignores its own.

Delivery is best effort, like the hub itself: while the listening connection is down
(it reconnects with backoff) other replicas' messages are missed, and a page reloads
history when its live socket reconnects. With SQLite there is one process: no fan-out.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from sqlalchemy.engine import make_url

from server.live import LiveHub
from server.storage import Store
from wire import LivePoints

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("keel.fanout")

CHANNEL = "keel_live"
MAX_PAYLOAD = 7900
"""PostgreSQL refuses NOTIFY payloads of 8000 bytes and more."""
SEND_BATCH = 2000
"""Notes sent in one statement at most."""
LINGER_S = 0.02
"""How long the sender waits after a note for others to join its statement."""


def libpq_url(database_url: str) -> str:
    """The libpq form of a postgresql[+driver]:// URL."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


class Fanout:
    """Built before the hub (the hub relays through it); `listen_forever` and
    `deliver_forever` are given the hub they feed."""

    def __init__(self, store: Store, database_url: str, queue_size: int = 10_000):
        self.store = store
        self.dsn = libpq_url(database_url)
        self.origin = uuid.uuid4().hex[:12]
        self._outgoing: asyncio.Queue[bytes] = asyncio.Queue(maxsize=queue_size)
        self._incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=queue_size)
        self._unsent: list[str] | None = None
        self._room = MAX_PAYLOAD - len(self._envelope(b""))
        """Bytes of notes one notification holds."""
        self.listening = asyncio.Event()
        """Set while the LISTEN connection is up (tests wait on it)."""

    # -- this replica -> the others ---------------------------------------------------

    def relay(self, note: dict[str, Any]) -> None:
        """Queue a notification for the other replicas (the hub calls this). Never waits."""
        encoded = orjson.dumps(note)
        if len(encoded) > self._room:
            log.warning("live message for run %s too large to relay (%d bytes)", note.get("r"), len(encoded))
            return
        try:
            self._outgoing.put_nowait(encoded)
        except asyncio.QueueFull:
            log.warning("live relay queue full; dropping a message for run %s", note.get("r"))

    async def send_forever(self) -> None:
        await self._connected_forever("relay", self._send)

    async def _send(self, conn: psycopg.AsyncConnection[Any]) -> None:
        while True:
            if self._unsent is None:
                # What queues up meanwhile goes in the same statement, in order: one round
                # trip and a few notifications per batch, not one per frame.
                notes = [await self._outgoing.get()]
                await asyncio.sleep(LINGER_S)
                while len(notes) < SEND_BATCH and not self._outgoing.empty():
                    notes.append(self._outgoing.get_nowait())
                self._unsent = self._pack(notes)
            await conn.execute("SELECT pg_notify(%s, payload) FROM unnest(%s::text[]) AS payload", (CHANNEL, self._unsent))
            self._unsent = None  # sent; a batch that failed is sent again on reconnecting

    def _envelope(self, notes: bytes) -> bytes:
        return b'{"o":"' + self.origin.encode() + b'","n":[' + notes + b"]}"

    def _pack(self, notes: list[bytes]) -> list[str]:
        """The notes as few payloads of at most MAX_PAYLOAD bytes, in order."""
        payloads: list[str] = []
        chunk: list[bytes] = []
        size = 0
        for note in notes:
            if chunk and size + 1 + len(note) > self._room:
                payloads.append(self._envelope(b",".join(chunk)).decode())
                chunk, size = [], 0
            chunk.append(note)
            size += len(note) + (1 if size else 0)
        payloads.append(self._envelope(b",".join(chunk)).decode())
        return payloads

    # -- the others -> this replica ---------------------------------------------------

    async def listen_forever(self, hub: LiveHub) -> None:
        await self._connected_forever("listen", lambda conn: self._listen(conn, hub))

    async def _listen(self, conn: psycopg.AsyncConnection[Any], hub: LiveHub) -> None:
        await conn.execute(f"LISTEN {CHANNEL}")
        self.listening.set()
        try:
            async for notify in conn.notifies():
                origin, notes = _parse(notify.payload)
                if origin == self.origin:
                    continue
                for note in notes:
                    if not hub.watching(note["r"]):
                        continue
                    try:
                        self._incoming.put_nowait(note)
                    except asyncio.QueueFull:
                        log.warning("live fan-in queue full; dropping a message for run %s", note["r"])
        finally:
            self.listening.clear()

    async def _connected_forever(
        self, what: str, use: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]
    ) -> None:
        """Run `use` on a connection of its own, reconnecting with backoff when it drops."""
        import psycopg

        delay = 0.5
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
                    delay = 0.5
                    await use(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database restarting, say
                log.warning("live %s connection lost (%s); retrying in %.1f s", what, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)

    async def deliver_forever(self, hub: LiveHub) -> None:
        """Publish what other replicas notified, in order, reading points back as needed."""
        while True:
            note = await self._incoming.get()
            run_id = note["r"]
            try:
                if note["t"] == "points":
                    rows = await self.store.rows(run_id, after=int(note["a"]) - 1, before=int(note["b"]) + 1)
                    if rows:
                        hub.publish(run_id, LivePoints(run_id, rows).to_json(), relay=False)
                else:
                    hub.publish(run_id, note["m"], relay=False)
            except Exception:
                log.exception("could not deliver a live message for run %s", run_id)


def _parse(payload: str) -> tuple[str | None, list[dict[str, Any]]]:
    """The sending replica and its notes, from a notification; the notes another replica
    could not have sent are left out (and logged)."""
    try:
        message = orjson.loads(payload)
    except orjson.JSONDecodeError:
        message = None
    if not isinstance(message, dict) or not isinstance(message.get("o"), str) or not isinstance(message.get("n"), list):
        log.warning("ignoring a notification on %s that no replica sent: %.200s", CHANNEL, payload)
        return None, []
    notes = [note for note in message["n"] if _valid(note)]
    if len(notes) < len(message["n"]):
        log.warning("ignoring notes on %s that no replica sent: %.200s", CHANNEL, payload)
    return message["o"], notes


def _valid(note: Any) -> bool:
    if not isinstance(note, dict) or not isinstance(note.get("r"), str):
        return False
    if note.get("t") == "points":
        return isinstance(note.get("a"), int) and isinstance(note.get("b"), int)
    return note.get("t") == "message" and isinstance(note.get("m"), dict)
