"""In-process live fan-out: committed points and alert changes to browser subscribers.

Publishing never waits on a subscriber: each has a bounded queue, and one that
falls behind is dropped (its page reconnects and reloads history over REST).
Across replicas (PostgreSQL) the hub relays what it publishes to `server.fanout`,
which feeds the other replicas' hubs.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["LiveHub", "Subscription"]

ALL_RUNS = "*"


class Subscription:
    def __init__(self, hub: LiveHub, run_ids: frozenset[str], maxsize: int):
        self.hub = hub
        self.run_ids = run_ids
        self.queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=maxsize)
        self.dropped = False

    def offer(self, message: dict[str, Any]) -> None:
        if self.dropped:
            return
        try:
            self.queue.put_nowait(message)
        except asyncio.QueueFull:
            self.dropped = True
            self.hub.unsubscribe(self)
            # Wake the reader so it notices it was dropped.
            self.queue.get_nowait()
            self.queue.put_nowait(None)

    async def get(self) -> dict[str, Any] | None:
        """The next message, or None once this subscriber has been dropped."""
        return await self.queue.get()


Relay = Callable[[dict[str, Any]], None]
"""Hands a note to the other replicas (`server.fanout.Fanout.relay`); never waits."""


class LiveHub:
    def __init__(self, queue_size: int = 1000, relay: Relay | None = None):
        self.queue_size = queue_size
        self._by_run: dict[str, set[Subscription]] = defaultdict(set)
        self.relay = relay
        """Where other replicas hear of what is published here; None with one process."""

    def subscribe(self, run_ids: frozenset[str] | None) -> Subscription:
        """Subscribe to some runs, or to every run when `run_ids` is None."""
        subscription = Subscription(self, run_ids or frozenset({ALL_RUNS}), self.queue_size)
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

    def publish(self, run_id: str, message: dict[str, Any], *, relay: bool = True) -> None:
        """To this replica's subscribers of the run; also to the other replicas' (`relay`).
        Points go through `points_committed` instead."""
        for subscription in (*self._by_run.get(run_id, ()), *self._by_run.get(ALL_RUNS, ())):
            subscription.offer(message)
        if relay and self.relay is not None:
            self.relay({"t": "message", "r": run_id, "m": message})

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
