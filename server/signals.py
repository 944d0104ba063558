"""What an ingest socket tells its trainer: alerts, the hazard, commands (docs/protocol.md, "Signals").

One `TrainerSignals` per ingest socket that listens. It is a `Listener` of the run on the
hub, so alert changes and commands published anywhere (relayed from other replicas too)
reach it; it computes the run's hazard itself after each stored frame, since the rows of a
run arrive on the replica of its socket. What it sends waits in a small outbox drained by
a task of its own: the ingest loop only ever takes the socket's send lock for one small
message, so an ack never waits on a database read made for a signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from server import run_commands
from server.alerts import history
from server.alerts.hazard import HazardCache
from server.jsonview import wire_alert
from server.live import Listener, LiveHub
from server.storage import Store
from wire import ProtocolError
from wire.signals import (
    AlertMessage,
    AlertsMessage,
    CommandMessage,
    HazardMessage,
    Signal,
    read_signal,
)

__all__ = ["SignalSources", "TrainerSignals"]

log = logging.getLogger("keel.signals")

OUTBOX = 1024
"""Messages a socket holds for a trainer that does not read: past it the oldest go (an alert
is in the next snapshot, a command is sent again on the next connection)."""
HAZARD_PERIOD_S = 1.0
"""A socket computes its run's hazard at most this often (a read of the new rows each time):
a trainer acts on it within a second, and 64 runs streaming cost 64 small reads a second."""
FIRING_LISTED = 100
"""Open alerts in the snapshot a socket sends when it starts listening to alerts."""


@dataclass(frozen=True)
class SignalSources:
    """Where signals come from (the server's components)."""

    store: Store
    hub: LiveHub
    hazards: HazardCache


class TrainerSignals:
    def __init__(self, sources: SignalSources, run_id: str, send: Callable[[dict[str, Any]], Awaitable[None]]):
        self.sources = sources
        self.run_id = run_id
        self.signals: frozenset[str] = frozenset()
        self._send = send
        self._listener: Listener | None = None
        self._outbox: deque[Signal] = deque(maxlen=OUTBOX)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._snapshot = False  # the open alerts are to be sent
        self._resend = False  # the unanswered commands are to be sent
        self._hazard_of: float | None = None  # the run incarnation (started_at) whose hazard is due
        self._hazard_step = -1  # the step of the last hazard sent
        self._hazard_at = -HAZARD_PERIOD_S  # when it was last computed (monotonic)

    def listen(self, signals: frozenset[str]) -> None:
        """Listen to these signals from now on (replacing what was asked before)."""
        new = signals - self.signals
        self.signals = signals
        if self._listener is not None:
            self.sources.hub.unlisten(self._listener)
            self._listener = None
        if signals:
            self._listener = Listener(self.run_id, signals, self._deliver)
            self.sources.hub.listen(self._listener)
            if self._task is None:
                self._task = asyncio.create_task(self._serve(), name=f"keel-signals-{self.run_id}")
        self._snapshot |= "alerts" in new
        self._resend |= "commands" in new
        self._wake.set()

    def stored(self, started_at: float) -> None:
        """Rows of the run were just committed (by this socket)."""
        if "hazard" in self.signals:
            self._hazard_of = started_at
            self._wake.set()

    async def close(self) -> None:
        if self._listener is not None:
            self.sources.hub.unlisten(self._listener)
            self._listener = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _deliver(self, message: dict[str, Any]) -> None:
        """The hub hands over the JSON it publishes (and relays between replicas): it is read
        here, once, into its wire message; what is held and sent from now on is typed."""
        try:
            signal = read_signal(message)
        except ProtocolError as exc:
            log.warning("not sending run %s's trainer a malformed signal: %s", self.run_id, exc)
            return
        if signal is None:
            return
        self._outbox.append(signal)
        self._wake.set()

    async def _serve(self) -> None:
        while True:
            timeout = None  # wait for news; or, with a hazard due, until it may be computed
            if self._hazard_of is not None:
                timeout = max(0.0, self._hazard_at + HAZARD_PERIOD_S - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            try:
                await self._turn()
            except asyncio.CancelledError:
                raise
            except Exception:
                # The socket went away (the session ends and cancels us), or the database
                # failed: nothing of the run's data depends on a signal.
                log.debug("signals for run %s stopped a turn", self.run_id, exc_info=True)

    async def _send_commands(self, messages: list[CommandMessage]) -> None:
        """Send commands and mark them delivered. One that cannot be encoded (a payload no
        JSON encoder takes) is marked `failed` with the reason, and the others still go."""
        store, sent = self.sources.store, []
        for message in messages:
            encoded = message.to_json()
            try:
                orjson.dumps(encoded)
            except TypeError as exc:
                await run_commands.undeliverable(store, message.command.id, str(exc), time.time())
                continue
            await self._send(encoded)
            sent.append(message.command.id)
        await run_commands.delivered(store, sent, time.time())

    async def _turn(self) -> None:
        store = self.sources.store
        if self._snapshot:
            self._snapshot = False
            # The snapshot supersedes alert changes queued before it is read.
            kept = [m for m in self._outbox if not isinstance(m, AlertMessage)]
            self._outbox.clear()
            self._outbox.extend(kept)
            firing = await history.list_alerts(
                store, run_ids=[self.run_id], state="firing", severity=None, project=None, limit=FIRING_LISTED
            )
            await self._send(AlertsMessage(self.run_id, tuple(wire_alert(a) for a in reversed(firing))).to_json())
        if self._resend:
            # Every unanswered command, oldest first, a page at a time, straight to the socket
            # (not through the bounded outbox: however many there are, the oldest, a `stop`
            # say, goes out first). The ones published meanwhile come again: harmless, a
            # trainer answers a command id once.
            self._resend = False
            after: tuple[float, str] | None = None
            while page := await run_commands.unanswered(store, self.run_id, after=after):
                await self._send_commands([run_commands.signal_message(command) for command in page])
                after = (page[-1].created_at, page[-1].id)
        sent: list[CommandMessage] = []
        while self._outbox:
            message = self._outbox.popleft()
            if isinstance(message, CommandMessage):
                sent.append(message)
            else:
                await self._send(message.to_json())
        await self._send_commands(sent)
        if self._hazard_of is not None and time.monotonic() >= self._hazard_at + HAZARD_PERIOD_S:
            started_at, self._hazard_of = self._hazard_of, None
            self._hazard_at = time.monotonic()
            course = await self.sources.hazards.so_far(store, self.run_id, started_at)
            steps, hazard = course.steps, course.hazard
            if steps and steps[-1] > self._hazard_step:
                self._hazard_step = steps[-1]
                await self._send(HazardMessage(self.run_id, steps[-1], hazard[-1]).to_json())
