"""Token-bucket rate limits per client identity (docs/security.md).

A client is its API token when it presents one and auth is on, else its address. Each
identity has a request bucket (REST writes) and a byte bucket (ingest frames and REST
write bodies together). A bucket holds up to `burst` tokens and refills at `rate` per
second; a cost is granted when the tokens it lacks would refill within `max_wait_s`,
and then spent at once, so the bucket goes into debt and whoever asks next waits longer:
several sockets of one identity share one rate, whatever their number. REST asks with
no wait (over the rate: 429 + Retry-After); ingest waits, pacing the sender, and closes
the socket (1013, `retry_after_s`) only when the wait would pass `ingest_max_pacing_s`.

Failed authentications (a token that is no token's, at /login or in a request) spend a
third bucket, per client address whatever the token (server/auth.py): once it is empty,
the address's credentials are answered 429 without being looked up.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import HTTPConnection

from server.config import Settings
from wire import CLOSE_OVERLOADED, ErrorMessage, ProtocolError

__all__ = ["RateLimited", "RateLimiter", "RateLimits", "Reservation", "TokenBucket", "address_key", "client_key"]

MAX_KEYS = 10_000
"""Identities tracked at once; full buckets (clients quiet long enough) are forgotten first."""


@dataclass(frozen=True)
class Reservation:
    granted: bool
    wait_s: float
    """Granted: how long to hold the work back. Refused: how long until it would be granted."""

    @property
    def retry_after_s(self) -> int:
        """`wait_s` as whole seconds, at least 1 (HTTP's Retry-After)."""
        return max(1, math.ceil(self.wait_s))


GRANTED = Reservation(True, 0.0)


class TokenBucket:
    def __init__(self, rate: float, burst: float, now: float):
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.updated = now

    def reserve(self, cost: float, now: float, max_wait_s: float) -> Reservation:
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        # A cost above the burst could never be granted; it drains a full bucket instead.
        cost = min(cost, self.burst)
        wait_s = max(0.0, (cost - self.tokens) / self.rate)
        if wait_s > max_wait_s:
            return Reservation(False, wait_s)
        self.tokens -= cost
        return Reservation(True, wait_s)

    def peek(self, cost: float, now: float) -> Reservation:
        """What `reserve(cost, now, 0)` would answer, spending nothing."""
        tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        wait_s = max(0.0, (min(cost, self.burst) - tokens) / self.rate)
        return Reservation(wait_s <= 0, wait_s)

    def full(self, now: float) -> bool:
        return self.tokens + (now - self.updated) * self.rate >= self.burst


class RateLimiter:
    """One bucket per key; `rate` <= 0 turns the limit off."""

    def __init__(self, rate: float, burst: float, *, clock: Callable[[], float] = time.monotonic, max_keys: int = MAX_KEYS):
        self.rate = rate
        self.burst = max(burst, 1.0)
        self.clock = clock
        self.max_keys = max_keys
        self._buckets: dict[str, TokenBucket] = {}

    def reserve(self, key: str, cost: float, max_wait_s: float = 0.0) -> Reservation:
        if self.rate <= 0:
            return GRANTED
        now = self.clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                self._forget(now)
            bucket = self._buckets[key] = TokenBucket(self.rate, self.burst, now)
        return bucket.reserve(cost, now, max_wait_s)

    def peek(self, key: str, cost: float) -> Reservation:
        """Whether `cost` would be granted now without waiting, spending nothing."""
        bucket = self._buckets.get(key) if self.rate > 0 else None
        return GRANTED if bucket is None else bucket.peek(cost, self.clock())

    def _forget(self, now: float) -> None:
        # A full bucket is what a new one would be: forgetting it changes nothing.
        for key in [key for key, bucket in self._buckets.items() if bucket.full(now)]:
            del self._buckets[key]
        while len(self._buckets) >= self.max_keys:  # all in use: the oldest go
            del self._buckets[next(iter(self._buckets))]

    def __len__(self) -> int:
        return len(self._buckets)


@dataclass(frozen=True)
class RateLimits:
    requests: RateLimiter
    """REST writes, one per request."""
    bytes: RateLimiter
    """Ingest frames and REST write bodies, by their length."""
    max_pacing_s: float
    auth_failures: RateLimiter
    """Failed authentications, one each, per client address (server/auth.py)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> RateLimits:
        return cls(
            requests=RateLimiter(settings.write_requests_per_s, settings.write_requests_burst),
            bytes=RateLimiter(settings.ingest_bytes_per_s, settings.ingest_bytes_burst),
            max_pacing_s=settings.ingest_max_pacing_s,
            auth_failures=RateLimiter(settings.auth_failures_per_s, settings.auth_failures_burst),
        )


class RateLimited(ProtocolError):
    """An ingest frame over the rate that pacing cannot absorb: error frame, then close 1013."""

    def __init__(self, retry_after_s: float):
        super().__init__(
            f"rate limit exceeded; retry in {retry_after_s:.1f} s", code="rate_limited", close_code=CLOSE_OVERLOADED
        )
        self.retry_after_s = retry_after_s

    def to_message(self) -> dict[str, Any]:
        return ErrorMessage(self.code, str(self), round(self.retry_after_s, 3)).to_json()


def address_key(conn: HTTPConnection) -> str:
    """The client's address as a key: its connection's, or the forwarded one from a proxy
    named in KEEL_FORWARDED_ALLOW_IPS (server/serving.py)."""
    return "addr:" + (conn.client.host if conn.client else "unknown")


def client_key(conn: HTTPConnection, auth_enabled: bool, token: str | None) -> str:
    """Whom a request is counted against: its token (hashed: no secret kept in memory),
    or, with auth off or no token presented, its address."""
    if auth_enabled and token:
        return "token:" + hashlib.sha256(token.encode()).hexdigest()[:32]
    return address_key(conn)
