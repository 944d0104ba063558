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

__all__ = ["DROP", "REACH", "REGAIN", "SMOOTH_WINDOW", "WITHIN", "Falls", "Scan", "collapse_step", "falls", "resume", "smoothed"]

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
    return resume(Scan(), rewards, reach, drop, regain, within)[0]


@dataclass(frozen=True)
class Scan:
    """How far `falls` read a sequence, to go on from there once the sequence grows (a
    page that reads a run's label every few seconds then reads each new step about once)."""

    at: int = 0
    """The first index not settled: the scan goes on from here."""
    peak: float = -math.inf
    falling: bool = False
    dips: tuple[int, ...] = ()
    collapse: int | None = None
    """Once a fall lasted, the label is final: later values change nothing."""


def resume(
    scan: Scan,
    rewards: Sequence[float],
    reach: float = REACH,
    drop: float = DROP,
    regain: float = REGAIN,
    within: int = WITHIN,
) -> tuple[Falls, Scan]:
    """`falls(rewards)`, going on from `scan`, which an earlier call returned for a prefix
    of `rewards` (the same values, fewer of them), and where this call stopped."""
    if scan.collapse is not None:
        return Falls(scan.collapse, list(scan.dips)), scan
    peak, falling, dips = scan.peak, scan.falling, list(scan.dips)
    for step in range(scan.at, len(rewards)):
        reward = rewards[step]
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
            elif len(after) < within:  # read it again once more values arrived
                return Falls(None, dips, step), Scan(step, peak, False, tuple(dips))
            else:
                return Falls(step, dips), Scan(step, peak, False, tuple(dips), collapse=step)
    return Falls(None, dips), Scan(len(rewards), peak, falling, tuple(dips))


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
