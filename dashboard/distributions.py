"""Arithmetic on per-step histograms of ℓ (GET /runs/{id}/distributions): shares and quantiles.

Pure functions, no I/O. A histogram is `edges` (n + 1 increasing numbers) and `counts` (n
non-negative integers, `counts[i]` in [edges[i], edges[i + 1])). Positions are in bin units:
position i + f is the fraction f of the way through bin i, which is how the heatmap's y axis
is laid out (one row per bin, however wide the bin is in ℓ).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Quantile", "QUANTILES", "histogram_quantile", "shares", "occupied_bins", "signed_log_ticks"]

QUANTILES = (0.001, 0.01, 0.99, 0.999)
"""The tail quantiles drawn over the heatmap: p0.1, p1, p99, p99.9."""


@dataclass(frozen=True)
class Quantile:
    value: float
    """The quantile in the histogram's units (ℓ), linear within its bin."""
    position: float
    """Where that is in bin units: bin index + the fraction of the way through it."""


def histogram_quantile(edges: Sequence[float], counts: Sequence[float], q: float) -> Quantile | None:
    """The q-quantile of the values counted, assuming each bin's values are spread evenly
    over it: the point where the cumulative count reaches q × total. None for an empty
    histogram."""
    total = sum(counts)
    if total <= 0 or len(edges) != len(counts) + 1:
        return None
    target = min(max(q, 0.0), 1.0) * total
    below = 0.0
    for index, count in enumerate(counts):
        if count > 0 and below + count >= target:
            fraction = min(max((target - below) / count, 0.0), 1.0)
            low, high = edges[index], edges[index + 1]
            return Quantile(low + fraction * (high - low), index + fraction)
        below += count
    last = max(i for i, c in enumerate(counts) if c > 0)  # rounding left target past the total
    return Quantile(edges[last + 1], last + 1.0)


def shares(counts: Sequence[float], total: float | None = None) -> list[float]:
    """Each bin's share of `total` (the histogram's own sum by default); zeros for an empty one."""
    whole = sum(counts) if total is None else total
    if whole <= 0:
        return [0.0] * len(counts)
    return [count / whole for count in counts]


def occupied_bins(counts_per_step: Sequence[Sequence[float]]) -> tuple[int, int] | None:
    """The first and last bin with a count at any step (None when every count is 0): the
    heatmap draws those rows only."""
    bins = len(counts_per_step[0]) if counts_per_step else 0
    used = [i for i in range(bins) if any(counts[i] > 0 for counts in counts_per_step)]
    return (used[0], used[-1]) if used else None


def signed_log_ticks(edges: Sequence[float], low: int = 0, high: int | None = None, most: int = 13) -> list[int]:
    """Indices of edges worth a tick label among edges[low..high]: 0 and the powers of ten
    (±0.001, ±0.1, ±1, ...) when the edges hold them, else every edge; at most `most`, and
    never two labels on neighbouring rows (±10⁻⁴ around a zero bin would overprint)."""
    high = len(edges) - 1 if high is None else high

    def round_number(value: float) -> bool:
        if value == 0:
            return True
        exponent = math.log10(abs(value))
        return abs(exponent - round(exponent)) < 1e-9

    candidates = [i for i in range(low, high + 1) if round_number(edges[i])]
    if len(candidates) < 3:
        candidates = list(range(low, high + 1))
    gap = max(2, -(-(high - low) // max(most - 1, 1)))
    chosen: list[int] = []
    for index in candidates:
        if not chosen or index - chosen[-1] >= gap:
            chosen.append(index)
    return chosen
