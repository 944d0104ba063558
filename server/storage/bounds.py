"""What a run may grow to (docs/security.md, "Sizes"): its distinct metric keys, and its
config's size. Each write that could pass one is checked inside its transaction, under the
run's lock (server/storage/admission.py), so writers of one run on several replicas count
against the same total; a write that would pass it is refused whole (`TooLarge`), and
keys or config a run already holds are never refused.

- Metric keys (`max_keys_per_run`): a run with 100,000 keys would make its page draw
  100,000 charts. Counted in the database when a write names keys this process's
  series cache does not know (server/storage/writes.py); writes of known keys cost nothing.
- Config (`max_config_bytes`, as compact UTF-8 JSON): at the hello that creates the run,
  and after each `PATCH /runs/{id}` merges its keys in (five 7 MiB PATCHes made a 37 MB
  config, and a run page that took 18 s).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from server.errors import TooLarge
from server.models import Series

__all__ = ["KEYS_NAMED", "check_config", "check_new_keys", "config_bytes"]

KEYS_NAMED = 5
"""New keys a refusal names (of however many the write had)."""


def config_bytes(config: dict[str, Any]) -> int:
    """The config's size as compact UTF-8 JSON."""
    return len(json.dumps(config, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))


def check_config(run_id: str, config: dict[str, Any], max_bytes: int, what: str) -> None:
    """Raise TooLarge if `config` (the run's whole config, as it would be stored) is over `max_bytes`."""
    size = config_bytes(config)
    if size > max_bytes:
        raise TooLarge(
            f"{what} would make the config of run {run_id!r} {size} bytes of JSON, over the limit of"
            f" {max_bytes} (KEEL_MAX_CONFIG_BYTES); nothing was changed"
        )


async def check_new_keys(session: AsyncSession, run_id: str, keys: Sequence[str], max_keys: int) -> None:
    """Raise TooLarge if storing `keys` (keys the caller's cache does not know: the run may
    have some of them already) would give the run more than `max_keys` distinct keys.
    Counts the run's series in `session` (under the run's lock); reads the keys themselves
    only when the count alone cannot tell."""
    count: int = (await session.execute(select(func.count()).select_from(Series).where(Series.run_id == run_id))).scalar_one()
    if count + len(keys) <= max_keys:
        return
    stored = set((await session.execute(select(Series.key).where(Series.run_id == run_id))).scalars())
    new = [key for key in keys if key not in stored]
    if new and count + len(new) > max_keys:
        named = ", ".join(repr(key if len(key) <= 60 else key[:57] + "...") for key in sorted(new)[:KEYS_NAMED])
        more = f" and {len(new) - KEYS_NAMED} more" if len(new) > KEYS_NAMED else ""
        raise TooLarge(
            f"{len(new)} new metric keys would give run {run_id!r} {count + len(new)} keys, over the limit of"
            f" {max_keys} per run (KEEL_MAX_KEYS_PER_RUN): {named}{more}; nothing of the write was stored"
        )
