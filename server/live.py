"""In-process live fan-out: committed points and alert changes to browser subscribers.

Publishing never waits on a subscriber. A message is encoded to JSON text once, when it
is published, and the same text is queued for every subscriber. Queues are bounded in
bytes (the encoded length, counted for each subscriber that holds it): one subscriber
may hold `buffer_bytes`, all together `total_buffer_bytes`. A subscriber past its own
bound, or the one furthest behind when the total is reached, is dropped: its queue is
freed at once and its socket closed with 1013 (its page reconnects and reloads history
over REST). Across replicas (PostgreSQL) the hub relays what it publishes to
`server.fanout`, which feeds the other replicas' hubs.

Trainers listen too (docs/protocol.md, "Signals"): an ingest socket that asked for a run's
alerts or commands is a `Listener` of that run; it is handed the messages of those kinds
(alert changes, commands) as they are published, on this replica or relayed from another.
Browsers are sent only what a page reads (points, alerts, statuses).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from wire import LIVE_TYPES

__all__ = ["Listener", "LiveHub", "Subscription"]

ALL_RUNS = "*"
FOR_BROWSERS = frozenset(LIVE_TYPES)
"""The message types a browser subscriber is sent (wire.live: points, alert, status)."""
SIGNAL_OF = {"alert": "alerts", "command": "commands", "hazard": "hazard"}
"""The signal (docs/protocol.md) a trainer listens to for each message type."""


class Listener:
    """A trainer's ingest socket listening to some signals of its run. `deliver` is called on
    the event loop for each message of a kind it listens to; it must not wait."""

    def __init__(self, run_id: str, signals: frozenset[str], deliver: Callable[[dict[str, Any]], None]):
        self.run_id = run_id
        self.signals = signals
        self.deliver = deliver


class Subscription:
    def __init__(self, hub: LiveHub, run_ids: frozenset[str]):
        self.hub = hub
        self.run_ids = run_ids
        self._queue: deque[tuple[str, int]] = deque()
        self._ready = asyncio.Event()
        self._dropped = asyncio.Event()
        self.queued_bytes = 0
        self.dropped = False

    def offer(self, text: str, size: int) -> None:
        if self.dropped:
            return
        if self.queued_bytes + size > self.hub.buffer_bytes:
            self.drop()
            return
        self._queue.append((text, size))
        self.queued_bytes += size
        self.hub.buffered_bytes += size
        self._ready.set()

    def drop(self) -> None:
        """Stop receiving, free the queue, and wake the reader so it closes the socket."""
        if self.dropped:
            return
        self.dropped = True
        self.hub.unsubscribe(self)
        self.hub.buffered_bytes -= self.queued_bytes
        self._queue.clear()
        self.queued_bytes = 0
        self._ready.set()
        self._dropped.set()

    async def wait_dropped(self) -> None:
        """Returns once the hub has dropped this subscriber (even while its socket is
        stuck sending to a peer that does not read)."""
        await self._dropped.wait()

    async def get(self) -> str | None:
        """The next message as JSON text, or None once this subscriber has been dropped."""
        while not self._queue and not self.dropped:
            self._ready.clear()
            await self._ready.wait()
        if self.dropped:
            return None
        text, size = self._queue.popleft()
        self.queued_bytes -= size
        self.hub.buffered_bytes -= size
        return text


Relay = Callable[[dict[str, Any]], None]
"""Hands a note to the other replicas (`server.fanout.Fanout.relay`); never waits."""


class LiveHub:
    def __init__(
        self,
        buffer_bytes: int = 8 * 1024 * 1024,
        total_buffer_bytes: int = 256 * 1024 * 1024,
        relay: Relay | None = None,
    ):
        self.buffer_bytes = buffer_bytes
        self.total_buffer_bytes = total_buffer_bytes
        self.buffered_bytes = 0
        """What all subscribers' queues hold now."""
        self._by_run: dict[str, set[Subscription]] = defaultdict(set)
        self._listeners: dict[str, set[Listener]] = defaultdict(set)
        self.relay = relay
        """Where other replicas hear of what is published here; None with one process."""

    def subscribe(self, run_ids: frozenset[str] | None) -> Subscription:
        """Subscribe to some runs, or to every run when `run_ids` is None."""
        subscription = Subscription(self, run_ids or frozenset({ALL_RUNS}))
        for run_id in subscription.run_ids:
            self._by_run[run_id].add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        for run_id in subscription.run_ids:
            subscribers = self._by_run.get(run_id)
            if subscribers is not None:
                subscribers.discard(subscription)
                if not subscribers:
                    del self._by_run[run_id]

    def listen(self, listener: Listener) -> None:
        self._listeners[listener.run_id].add(listener)

    def unlisten(self, listener: Listener) -> None:
        listeners = self._listeners.get(listener.run_id)
        if listeners is not None:
            listeners.discard(listener)
            if not listeners:
                del self._listeners[listener.run_id]

    def listening(self, run_id: str, signal: str) -> bool:
        """Whether a trainer socket on this replica listens to this signal of the run."""
        return any(signal in listener.signals for listener in self._listeners.get(run_id, ()))

    def publish(self, run_id: str, message: dict[str, Any], *, relay: bool = True) -> None:
        """To this replica's subscribers of the run (browsers: the types they read) and its
        listening trainers; also to the other replicas' (`relay`). Points go through
        `points_committed` instead."""
        signal = SIGNAL_OF.get(message.get("type", ""))
        for listener in list(self._listeners.get(run_id, ())):
            if signal in listener.signals:
                listener.deliver(message)
        subscribers = {*self._by_run.get(run_id, ()), *self._by_run.get(ALL_RUNS, ())}
        if subscribers and message.get("type") in FOR_BROWSERS:
            encoded = orjson.dumps(message)  # once, whatever the number of subscribers
            text, size = encoded.decode(), len(encoded)
            for subscription in subscribers:
                self._make_room(size)
                subscription.offer(text, size)
        if relay and self.relay is not None:
            self.relay({"t": "message", "r": run_id, "m": message})

    def _make_room(self, size: int) -> None:
        """Drop the subscribers furthest behind until `size` more bytes fit in the total."""
        while self.buffered_bytes + size > self.total_buffer_bytes:
            queued = [s for subs in self._by_run.values() for s in subs if s.queued_bytes]
            if not queued:
                return
            max(queued, key=lambda s: s.queued_bytes).drop()

    def points_committed(self, run_id: str, steps: Iterable[int]) -> None:
        """Tell the other replicas which steps of a run were just stored (they read them back)."""
        if self.relay is not None:
            steps = list(steps)
            if steps:
                self.relay({"t": "points", "r": run_id, "a": min(steps), "b": max(steps)})

    def watching(self, run_id: str) -> bool:
        """Whether anyone would receive a message about this run (skip building it otherwise)."""
        return run_id in self._by_run or ALL_RUNS in self._by_run

    @property
    def subscriber_count(self) -> int:
        return len({s for subs in self._by_run.values() for s in subs})
