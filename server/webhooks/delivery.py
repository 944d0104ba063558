"""The outbox worker: delivers queued webhook events, at least once, with retries.

Rows are claimed with a short lease (FOR UPDATE SKIP LOCKED on PostgreSQL, so
several workers never take the same row), sent concurrently, and settled:
2xx delivered; 410 disables the hook; 408/425/429/5xx and network errors retry
with exponential backoff and jitter, never sooner than Retry-After; redirects
are not followed; anything else fails. A crash mid-send leaves the row to be
retried when its lease ends; the stable webhook-id lets receivers deduplicate.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import time
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx
from sqlalchemy import select, update

from server.models import Delivery, Webhook
from server.storage import Store
from server.webhooks import formats, signing
from server.webhooks.netguard import checked_address

log = logging.getLogger("keel.webhooks")

RETRYABLE_STATUS = {408, 425, 429}


@dataclass(frozen=True)
class Outcome:
    status: str
    """delivered, retry, failed or gone."""
    error: str | None = None
    retry_after_s: float | None = None


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 10
    base_s: float = 1.0
    max_s: float = 600.0

    def delay(self, attempts: int, retry_after_s: float | None) -> float:
        backoff = min(self.max_s, self.base_s * 2 ** max(0, attempts - 1))
        jittered = backoff / 2 + random.uniform(0, backoff / 2)
        return max(jittered, min(retry_after_s or 0.0, 3600.0))


def parse_retry_after(value: str | None, now: float) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - now)
    except (TypeError, ValueError):
        return None


async def send(client: httpx.AsyncClient, hook: Webhook, delivery: Delivery, *, allow_private: bool) -> Outcome:
    body = formats.render(hook.format, delivery.payload)
    headers = {
        "content-type": "application/json",
        "user-agent": "Keel-Webhooks/1",
        **signing.headers(hook.secret, delivery.event_id, int(time.time()), body),
    }
    try:
        address = await checked_address(hook.url, allow_private=allow_private)
    except ValueError as exc:  # ForbiddenTarget included: not retried
        return Outcome("failed", str(exc))
    parts = urlsplit(hook.url)
    host = f"[{address}]" if address.version == 6 else str(address)
    pinned = urlunsplit((parts.scheme, f"{host}:{parts.port}" if parts.port else host, parts.path or "/", parts.query, ""))
    headers["host"] = parts.netloc
    try:
        response = await client.post(pinned, content=body, headers=headers, extensions={"sni_hostname": parts.hostname or ""})
    except httpx.HTTPError as exc:
        return Outcome("retry", f"{type(exc).__name__}: {exc}"[:500])
    code = response.status_code
    if 200 <= code < 300:
        return Outcome("delivered")
    if code == 410:
        return Outcome("gone", "410 Gone: receiver asked to stop")
    if 300 <= code < 400:
        return Outcome("failed", f"{code} redirect to {response.headers.get('location', '?')} not followed")
    if code in RETRYABLE_STATUS or code >= 500:
        return Outcome("retry", f"HTTP {code}", parse_retry_after(response.headers.get("retry-after"), time.time()))
    return Outcome("failed", f"HTTP {code}: {response.text[:200]}")


class DeliveryWorker:
    def __init__(
        self,
        store: Store,
        *,
        allow_private: bool,
        timeout_s: float = 5.0,
        policy: RetryPolicy = RetryPolicy(),
        lease_s: float = 60.0,
        poll_s: float = 1.0,
    ):
        self.store = store
        self.allow_private = allow_private
        self.policy = policy
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), follow_redirects=False, trust_env=False)
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run_forever(self) -> None:
        while True:
            try:
                while await self.drain_once():
                    pass
            except Exception:
                log.exception("webhook delivery pass failed")
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.poll_s)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    async def close(self) -> None:
        await self.client.aclose()

    async def _claim(self, now: float, limit: int = 32) -> list[tuple[Delivery, Webhook]]:
        async with self.store.writing() as session:
            query = (
                select(Delivery, Webhook)
                .join(Webhook, Webhook.id == Delivery.webhook_id)
                .where(Delivery.status == "pending", Delivery.next_attempt_at <= now)
                .order_by(Delivery.next_attempt_at, Delivery.id)
                .limit(limit)
                # Replicas claim different rows. SQLite has no row locks (SQLAlchemy leaves
                # the clause out): its one writer at a time claims alone.
                .with_for_update(skip_locked=True, of=Delivery)
            )
            claimed = [(delivery, hook) for delivery, hook in await session.execute(query)]
            for delivery, _ in claimed:
                delivery.next_attempt_at = now + self.lease_s
            return claimed

    async def drain_once(self) -> int:
        """Send every due delivery once; returns how many were attempted."""
        claimed = await self._claim(time.time())
        if not claimed:
            return 0
        outcomes = await asyncio.gather(
            *(send(self.client, hook, delivery, allow_private=self.allow_private) for delivery, hook in claimed)
        )
        now = time.time()
        async with self.store.writing() as session:
            for (delivery, hook), outcome in zip(claimed, outcomes, strict=True):
                await self._settle(session, delivery, hook, outcome, now)
        return len(claimed)

    async def _settle(self, session, delivery: Delivery, hook: Webhook, outcome: Outcome, now: float) -> None:  # type: ignore[no-untyped-def]
        row = await session.get(Delivery, delivery.id)
        if row is None:
            return
        row.attempts += 1
        row.last_error = outcome.error
        if outcome.status == "delivered":
            row.status, row.delivered_at = "delivered", now
        elif outcome.status == "gone":
            row.status = "dropped"
            await session.execute(
                update(Webhook).where(Webhook.id == hook.id).values(enabled=False, disabled_reason=f"{outcome.error} (delivery {row.event_id})")
            )
            await session.execute(
                update(Delivery).where(Delivery.webhook_id == hook.id, Delivery.status == "pending").values(status="dropped", last_error="webhook disabled")
            )
            log.warning("webhook %s disabled: receiver answered 410", hook.id)
        elif outcome.status == "retry" and row.attempts < self.policy.max_attempts:
            row.next_attempt_at = now + self.policy.delay(row.attempts, outcome.retry_after_s)
        else:
            row.status = "failed"
            log.warning("webhook %s delivery %s failed: %s", hook.id, row.event_id, outcome.error)
