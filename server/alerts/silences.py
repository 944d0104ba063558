"""Silences, which mute the alerts they match (applied in notify.py): their REST operations."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import select

from server.errors import InvalidRequest, NotFound
from server.models import Silence
from server.storage import Store

__all__ = ["MAX_SILENCE_S", "create_silence", "expire_silence", "list_silences", "silence_json"]

MAX_SILENCE_S = 10 * 365 * 86400
"""A silence lasts at most 10 years and starts at most 10 years from now: one meant
"forever" is a mistake to refuse, not a mute to keep without anyone noticing."""


def silence_json(silence: Silence, now: float) -> dict[str, Any]:
    return {
        "id": silence.id, "matchers": silence.matchers, "starts_at": silence.starts_at, "ends_at": silence.ends_at,
        "comment": silence.comment, "created_by": silence.created_by, "active": silence.starts_at <= now < silence.ends_at,
    }


async def create_silence(
    store: Store, matchers: dict[str, str], starts_at: float, ends_at: float, comment: str, created_by: str, *, now: float
) -> Silence:
    if not matchers:
        raise InvalidRequest("a silence needs at least one matcher")
    if ends_at <= starts_at:
        raise InvalidRequest("ends_at must be after starts_at")
    if ends_at - starts_at > MAX_SILENCE_S or starts_at > now + MAX_SILENCE_S:
        raise InvalidRequest(f"a silence lasts at most 10 years ({MAX_SILENCE_S} s) and starts within 10 years from now")
    async with store.writing() as session:
        silence = Silence(matchers=matchers, starts_at=starts_at, ends_at=ends_at, comment=comment, created_by=created_by)
        session.add(silence)
    return silence


async def list_silences(store: Store, *, limit: int, before_id: int | None, active: bool | None, now: float) -> list[Silence]:
    """Newest first: at most `limit`, older than `before_id`, in force at `now` or not (`active`)."""
    query = select(Silence).order_by(Silence.id.desc()).limit(limit)
    if before_id is not None:
        query = query.where(Silence.id < before_id)
    in_force = (Silence.starts_at <= now) & (Silence.ends_at > now)
    if active is True:
        query = query.where(in_force)
    elif active is False:
        query = query.where(~in_force)
    async with store.sessions() as session:
        return list((await session.scalars(query)).all())


async def expire_silence(store: Store, silence_id: int) -> Silence:
    async with store.writing() as session:
        silence = await session.get(Silence, silence_id)
        if silence is None:
            raise NotFound(f"silence {silence_id} not found")
        silence.ends_at = min(silence.ends_at, time.time())
    return silence
