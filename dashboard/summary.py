"""The per-run / per-group summary table of the compare page (pure)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dashboard.series import Alert, Series, nonfinite_points

__all__ = [
    "Headline",
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


def last_finite(series: Series) -> tuple[int, float] | None:
    """The last finite value and its step."""
    for step, value in zip(reversed(series.steps), reversed(series.values), strict=True):
        if math.isfinite(value):
            return step, value
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


def _higher(a: float | None, b: float | None) -> float | None:
    return b if a is None or (b is not None and b > a) else a


@dataclass(frozen=True)
class Headline:
    """What the summary reads of a run's points: its reward's last finite value and its peak
    (each with its step), the largest KL and ratio (+Inf counts, NaN does not), its non-finite
    points across SUMMARY_KEYS, and the last step it has read (`through`).

    Read once from the server when the page opens (`of`); then the points the live socket
    pushed come as the browser's tally of them (assets/live/tally.js) and are merged in
    (`merged`): the summary reads no point the page already has. Merging is idempotent (a
    largest or a last value seen twice is the same), and a tally's non-finite steps count only
    past `through`, so a tally sent again, or overlapping the read, counts nothing twice."""

    final: tuple[int, float] | None = None
    peak: tuple[int, float] | None = None
    max_kl: float | None = None
    max_ratio: float | None = None
    nonfinite: int = 0
    through: int | None = None

    @classmethod
    def of(cls, series: Mapping[str, Series]) -> Headline:
        reward = series.get(REWARD, Series.empty())
        top = peak(reward)
        lasts = [s.last_step for s in series.values() if s.last_step is not None]
        return cls(
            final=last_finite(reward),
            peak=(top[1], top[0]) if top else None,
            max_kl=series_max(series.get(KL, Series.empty())),
            max_ratio=series_max(series.get(RATIO, Series.empty())),
            nonfinite=sum(len(nonfinite_points(series[k])) for k in SUMMARY_KEYS if k in series),
            through=max(lasts) if lasts else None,
        )

    def merged(self, tally: Mapping[str, Any]) -> Headline:
        """This headline with a run's tally of pushed points: `{key: {"last": [step, value] |
        None (its last finite value), "top": [step, value] | None (its largest finite), "inf":
        bool (a +Inf came), "bad": [steps of non-finite values], "to": last step}}`."""
        final, top, max_kl, max_ratio, nonfinite, through = self.final, self.peak, self.max_kl, self.max_ratio, 0, self.through
        for key, seen in tally.items():
            if key not in SUMMARY_KEYS or not isinstance(seen, Mapping):
                continue
            last, best = _point(seen.get("last")), _point(seen.get("top"))
            if key == REWARD:
                if last is not None and (final is None or last[0] > final[0]):
                    final = last
                if best is not None and (top is None or best[1] > top[1]):
                    top = best
            highest = math.inf if seen.get("inf") is True else best[1] if best is not None else None
            if key == KL:
                max_kl = _higher(max_kl, highest)
            elif key == RATIO:
                max_ratio = _higher(max_ratio, highest)
            bad = seen.get("bad") or []
            nonfinite += sum(1 for step in bad if isinstance(step, int) and (self.through is None or step > self.through))
            to = seen.get("to")
            if isinstance(to, int) and (through is None or to > through):
                through = to
        return Headline(final, top, max_kl, max_ratio, self.nonfinite + nonfinite, through)

    def to_json(self) -> dict[str, Any]:
        """For the page's store (JSON: +Inf as the text "+Inf")."""
        return {
            "final": self.final, "peak": self.peak, "max_kl": wire(self.max_kl), "max_ratio": wire(self.max_ratio),
            "nonfinite": self.nonfinite, "through": self.through,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Headline:
        return cls(
            _point(data.get("final")), _point(data.get("peak")), _unwire(data.get("max_kl")), _unwire(data.get("max_ratio")),
            int(data.get("nonfinite") or 0), data.get("through"),
        )  # fmt: skip


def _point(pair: Any) -> tuple[int, float] | None:
    if isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], int) and isinstance(pair[1], (int, float)):
        return pair[0], float(pair[1])
    return None


def _unwire(value: Any) -> float | None:
    if value == "+Inf":
        return math.inf
    return float(value) if isinstance(value, (int, float)) else None


def summarise_run(
    name: str,
    group: str | None,
    headline: Headline,
    alerts: Sequence[Alert],
    hazard: Series | None = None,
    fell: str | None = None,
) -> RunSummary:
    """`headline`: what the run's SUMMARY_KEYS hold (Headline.of the series read). `hazard`: the run's collapse
    hazard as GET /runs/{id}/hazard answers it (buckets keep their highest hazard and its
    step, so its peak is the run's), up to where its reward fell (`fell`, said as
    HazardRead.fall says it)."""
    worst = peak(hazard) if hazard is not None else None
    critical = [
        a.started_step for a in alerts if a.severity == "critical" and a.started_step is not None
    ]
    return RunSummary(
        name=name,
        group=group,
        runs=1,
        final_reward=headline.final[1] if headline.final else None,
        peak_reward=headline.peak[1] if headline.peak else None,
        peak_step=headline.peak[0] if headline.peak else None,
        first_critical_step=min(critical) if critical else None,
        max_kl=headline.max_kl,
        max_ratio=headline.max_ratio,
        nonfinite=headline.nonfinite,
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
