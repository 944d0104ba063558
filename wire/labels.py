"""The collapse label: every corpus of reference runs is labelled by it (toy grid,
transformer grid), and the server says by it that a run has collapsed (its hazard's
`collapsed_at`, docs/alerts.md), so the two never disagree. Standard library only.

A *collapse* is a fall that lasts: the reward reached `reach` (0.5), fell `drop` (0.2)
below its running peak, and did not regain within `regain` (0.1) of that peak in the next
`within` (100) steps. A fall that regains is a *dip*: the run recovered on its own. A fall
with fewer than `within` steps after it cannot be judged (*unjudged*). After a dip regains,
the search goes on from there with the same running peak.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["DROP", "REACH", "REGAIN", "SMOOTH_WINDOW", "WITHIN", "Falls", "collapse_step", "falls", "smoothed"]

REACH = 0.5
DROP = 0.2
REGAIN = 0.1
WITHIN = 100
SMOOTH_WINDOW = 10
"""The real learner's labels are taken on the trailing mean of this many steps of the
reward: one batch is too noisy (single-step dips of 0.2 happen in runs that climb)."""


@dataclass(frozen=True)
class Falls:
    collapse: int | None
    """The first step of the first fall that lasted, or None."""
    dips: list[int] = field(default_factory=list)
    """First steps of the falls before it that regained within WITHIN steps."""
    unjudged: int | None = None
    """First step of a last fall with fewer than WITHIN steps after it (and no regain yet)."""


def falls(
    rewards: Sequence[float],
    reach: float = REACH,
    drop: float = DROP,
    regain: float = REGAIN,
    within: int = WITHIN,
) -> Falls:
    """The run's lasting collapse, its dips and an unjudged fall at the end (see the module)."""
    peak = -math.inf
    dips: list[int] = []
    falling = False
    for step, reward in enumerate(rewards):
        if falling:  # inside a dip: wait until it regains, then look for the next fall
            falling = not reward >= peak - regain
            peak = max(peak, reward)
            continue
        peak = max(peak, reward)
        if peak >= reach and reward <= peak - drop:
            after = rewards[step + 1 : step + 1 + within]
            if any(value >= peak - regain for value in after):
                dips.append(step)
                falling = True
            elif len(after) < within:
                return Falls(None, dips, step)
            else:
                return Falls(step, dips)
    return Falls(None, dips)


def collapse_step(rewards: Sequence[float], reach: float = REACH, drop: float = DROP) -> int | None:
    """The first step of a fall that lasts (`falls(...).collapse`)."""
    return falls(rewards, reach, drop).collapse


def smoothed(values: Sequence[float], window: int = SMOOTH_WINDOW) -> list[float]:
    """Trailing mean over the last `window` steps (fewer at the start)."""
    out, total = [], 0.0
    for step, value in enumerate(values):
        total += value - (values[step - window] if step >= window else 0.0)
        out.append(total / min(step + 1, window))
    return out
