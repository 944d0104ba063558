"""The collapse label every corpus of reference runs uses (toy grid, transformer grid)."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["collapse_step"]


def collapse_step(rewards: Sequence[float], reach: float = 0.5, drop: float = 0.2) -> int | None:
    """First step where the reward is >= `drop` below a running peak that reached `reach`."""
    peak = -math.inf
    for step, reward in enumerate(rewards):
        peak = max(peak, reward)
        if peak >= reach and reward <= peak - drop:
            return step
    return None
