"""The SQLite write lock passes round-robin between clients, not first-come-first-served."""

from __future__ import annotations

import asyncio

from server.fairlock import WRITE_OWNER, FairLock


def test_a_client_with_a_backlog_does_not_hold_the_others_back() -> None:
    async def scenario() -> list[str]:
        lock, order = FairLock(), []

        async def write(owner: str, name: str) -> None:
            WRITE_OWNER.set(owner)
            async with lock.hold():
                order.append(name)
                await asyncio.sleep(0.01)

        flood = [asyncio.create_task(write("flood", f"f{i}")) for i in range(5)]
        await asyncio.sleep(0)  # the flood queues first
        trainer = asyncio.create_task(write("trainer", "t"))
        await asyncio.gather(*flood, trainer)
        return order

    # FIFO would give f0 f1 f2 f3 f4 t; round-robin lets the trainer in after one flood write.
    assert asyncio.run(scenario()) == ["f0", "f1", "t", "f2", "f3", "f4"]


def test_a_cancelled_waiter_neither_keeps_nor_loses_the_lock() -> None:
    async def scenario() -> bool:
        lock = FairLock()
        async with lock.hold("a"):
            waiter = asyncio.create_task(_hold(lock, "b"))
            await asyncio.sleep(0)
            waiter.cancel()
        async with lock.hold("c"):  # free again: taken at once
            return True

    assert asyncio.run(asyncio.wait_for(scenario(), 5))


async def _hold(lock: FairLock, owner: str) -> None:
    async with lock.hold(owner):
        await asyncio.sleep(1)
