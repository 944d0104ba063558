"""The per-run / per-group summary table of the compare page (pure)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dashboard.series import Alert, Series, nonfinite_points

__all__ = [
    "RunSummary",
    "summarise_run",
    "summarise_group",
    "last_finite",
    "peak",
    "series_max",
    "wire",
]

REWARD = "reward/mean"
KL = "mismatch/kl"
RATIO = "mismatch/ratio_max"
SUMMARY_KEYS = (REWARD, KL, RATIO, "gate/frac", "grad/norm")


@dataclass(frozen=True)
class RunSummary:
    name: str
    group: str | None
    runs: int
    final_reward: float | None
    peak_reward: float | None
    peak_step: int | None
    first_critical_step: int | None
    max_kl: float | None
    max_ratio: float | None
    nonfinite: int
    """Non-finite points across the headline metrics."""
    peak_hazard: float | None = None
    """The highest collapse hazard of the run (a group: of its runs); None: none yet."""
    peak_hazard_step: int | None = None
    """The step of the run's highest hazard (the first, on a tie); None for a group."""
    fell: str | None = None
    """Where the run's reward fell ("collapsed at step N", "falling since step N"): its peak
    hazard is of the steps before. None: it did not (or a group)."""

    def row(self) -> dict[str, Any]:
        """A JSON-safe table row (non-finite numbers as "NaN"/"+Inf"/"−Inf" text)."""
        return {
            "name": self.name,
            "group": self.group or "—",
            "runs": self.runs,
            "final_reward": wire(self.final_reward),
            "peak_reward": wire(self.peak_reward),
            "peak_step": self.peak_step,
            "first_critical_step": self.first_critical_step,
            "max_kl": wire(self.max_kl),
            "max_ratio": wire(self.max_ratio),
            "nonfinite": self.nonfinite,
            "peak_hazard": self.peak_hazard,
            "peak_hazard_step": self.peak_hazard_step,
            "fell": self.fell or "",
        }


def wire(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "+Inf" if value > 0 else "−Inf"


def last_finite(series: Series) -> float | None:
    for value in reversed(series.values):
        if math.isfinite(value):
            return value
    return None


def peak(series: Series) -> tuple[float, int] | None:
    """Highest finite value and its step; bucket maxima count, so a one-step peak survives downsampling."""
    candidates = series.maxs if series.downsampled and series.maxs is not None else series.values
    best: tuple[float, int] | None = None
    for step, value in zip(series.steps, candidates, strict=True):
        if math.isfinite(value) and (best is None or value > best[0]):
            best = (value, step)
    return best


def series_max(series: Series) -> float | None:
    """Largest value, +Inf included (a ratio that overflowed is the headline); NaN ignored."""
    candidates = list(series.values) + list(series.maxs or [])
    present = [v for v in candidates if not math.isnan(v)]
    return max(present) if present else None


def summarise_run(
    name: str,
    group: str | None,
    series: Mapping[str, Series],
    alerts: Sequence[Alert],
    hazard: Series | None = None,
    fell: str | None = None,
) -> RunSummary:
    """`hazard`: the run's collapse hazard as GET /runs/{id}/hazard answers it (buckets keep
    their highest hazard and its step, so its peak is the run's), up to where its reward
    fell (`fell`, said as HazardRead.fall says it)."""
    reward = series.get(REWARD, Series.empty())
    top = peak(reward)
    worst = peak(hazard) if hazard is not None else None
    critical = [
        a.started_step for a in alerts if a.severity == "critical" and a.started_step is not None
    ]
    return RunSummary(
        name=name,
        group=group,
        runs=1,
        final_reward=last_finite(reward),
        peak_reward=top[0] if top else None,
        peak_step=top[1] if top else None,
        first_critical_step=min(critical) if critical else None,
        max_kl=series_max(series.get(KL, Series.empty())),
        max_ratio=series_max(series.get(RATIO, Series.empty())),
        nonfinite=sum(len(nonfinite_points(series[k])) for k in SUMMARY_KEYS if k in series),
        peak_hazard=worst[0] if worst else None,
        peak_hazard_step=worst[1] if worst else None,
        fell=fell,
    )


def _mean(values: Sequence[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return math.fsum(finite) / len(finite) if finite else None


def _max(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None and not math.isnan(v)]
    return max(present) if present else None


def summarise_group(group: str, members: Sequence[RunSummary]) -> RunSummary:
    """One row for an arm: mean final/peak reward over its seeds, worst-case mismatch and
    collapse hazard, earliest alert."""
    critical = [m.first_critical_step for m in members if m.first_critical_step is not None]
    return RunSummary(
        name=f"{group} (mean of {len(members)})",
        group=group,
        runs=len(members),
        final_reward=_mean([m.final_reward for m in members]),
        peak_reward=_mean([m.peak_reward for m in members]),
        peak_step=None,
        first_critical_step=min(critical) if critical else None,
        max_kl=_max([m.max_kl for m in members]),
        max_ratio=_max([m.max_ratio for m in members]),
        nonfinite=sum(m.nonfinite for m in members),
        peak_hazard=_max([m.peak_hazard for m in members]),
    )
