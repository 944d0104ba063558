"""A write lock shared fairly between clients (SQLite's single writer).

With a plain FIFO lock, one client with many writes queued (a REST flood, a huge frame cut
into transactions) makes every other client wait behind all of them. Here waiters queue per
owner, and the lock passes round-robin between owners: another client waits for at most
one write of each busy client, not for their whole backlog.

The owner of a write is the context variable `WRITE_OWNER`, set where a request or an
ingest socket is served (the client's token or address).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar

__all__ = ["WRITE_OWNER", "FairLock"]

WRITE_OWNER: ContextVar[str] = ContextVar("keel_write_owner", default="")


class FairLock:
    def __init__(self) -> None:
        self._held = False
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    @asynccontextmanager
    async def hold(self, owner: str | None = None) -> AsyncIterator[None]:
        owner = WRITE_OWNER.get() if owner is None else owner
        if not self._held and not self._waiting:
            self._held = True
        else:
            granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(owner, deque()).append(granted)
            try:
                await granted
            except asyncio.CancelledError:
                if granted.done() and not granted.cancelled():
                    self._pass_on()  # it was ours already: hand it to the next
                else:
                    queue = self._waiting.get(owner)
                    if queue is not None and granted in queue:
                        queue.remove(granted)
                        if not queue:
                            del self._waiting[owner]
                raise
        try:
            yield
        finally:
            self._pass_on()

    def _pass_on(self) -> None:
        while self._waiting:
            owner, queue = next(iter(self._waiting.items()))
            granted = queue.popleft()
            if queue:
                self._waiting.move_to_end(owner)  # its next write waits for the other owners'
            else:
                del self._waiting[owner]
            if not granted.done():
                granted.set_result(None)
                return  # still held, by the owner just woken
        self._held = False
