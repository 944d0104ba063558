"""Pure data operations behind the charts: wire values, smoothing, group bands, non-finite points.

No I/O and no Plotly here; everything takes lists and returns lists so it can be
tested exactly. The same EMA runs in the browser (assets/live/) for live
points; `EmaState` is what the page hands over to continue it.
"""

from __future__ import annotations

import fnmatch
import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from wire import read_value
from wire.signals import Alert as WireAlert

__all__ = [
    "parse_value",
    "Series",
    "magnitude",
    "all_zero",
    "Alert",
    "alert_matches",
    "EmaState",
    "ema",
    "NonFinite",
    "nonfinite_points",
    "Band",
    "group_band",
]

def parse_value(raw: Any) -> float:
    """A wire value (number, "nan", "inf", "-inf" or null) as a float; null and junk read as NaN."""
    value = read_value(raw)
    return math.nan if value is None else value


@dataclass(frozen=True)
class Series:
    """One metric of one run, as GET /runs/{id}/series returns it."""

    steps: list[int]
    values: list[float]
    mins: list[float] | None = None
    """Per-bucket minimum when downsampled (spikes survive in `mins`/`maxs`)."""
    maxs: list[float] | None = None

    @property
    def downsampled(self) -> bool:
        return self.mins is not None and self.maxs is not None

    @property
    def last_step(self) -> int | None:
        return self.steps[-1] if self.steps else None

    @classmethod
    def empty(cls) -> Series:
        return cls(steps=[], values=[])

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> Series:
        steps = [int(s) for s in payload.get("steps", [])]
        values = _parse_values(payload.get("values", []))
        if payload.get("downsampled") and "min" in payload and "max" in payload:
            return cls(steps, values, _parse_values(payload["min"]), _parse_values(payload["max"]))
        return cls(steps, values)


def magnitude(series: Series) -> Series:
    """|x| of every point (NaN stays NaN, −Inf is +Inf); a downsampled bucket's band is the
    range of |x| over the bucket's [min, max]: from 0 when it straddles 0."""
    values = [abs(v) for v in series.values]
    if series.mins is None or series.maxs is None:
        return Series(list(series.steps), values)
    mins, maxs = [], []
    for lo, hi in zip(series.mins, series.maxs, strict=True):
        if math.isnan(lo) or math.isnan(hi):
            mins.append(abs(lo))
            maxs.append(math.nan)  # the bucket held a NaN: its marker stays
        elif lo >= 0:
            mins.append(lo)
            maxs.append(hi)
        elif hi <= 0:
            mins.append(-hi)
            maxs.append(-lo)
        else:
            mins.append(0.0)
            maxs.append(max(-lo, hi))
    return Series(list(series.steps), values, mins, maxs)


def _parse_values(raw: list[Any]) -> list[float]:
    # A JSON float is already what parse_value would return; the compare page's first draw
    # parses 16 runs x 500 buckets x 3 lists per chart, so the call is kept for the rest.
    return [v if type(v) is float else parse_value(v) for v in raw]


@dataclass(frozen=True)
class Alert:
    """One alert as the charts show it: the wire's alert (wire/signals.py, as GET
    /api/v1/alerts writes it) with its id as text, or a backtest's firing in the same shape."""

    id: str
    run_id: str
    rule: str
    metric: str | None
    severity: str
    state: str
    started_step: int | None
    resolved_step: int | None
    message: str = ""
    keys: tuple[str, ...] = ()
    """The metric keys that triggered it, when the server says (`metric` may be a rule pattern)."""

    def on_chart(self, key: str) -> bool:
        return key in self.keys if self.keys else alert_matches(self.metric, key)

    @classmethod
    def from_wire(cls, alert: WireAlert) -> Alert:
        """The wire's alert as the charts show it."""
        return cls(
            id=str(alert.id),
            run_id=alert.run_id,
            rule=alert.rule,
            metric=alert.metric or None,
            severity=alert.severity,
            state=alert.state,
            started_step=alert.started_step,
            resolved_step=alert.resolved_step,
            message=alert.message,
            keys=alert.keys,
        )

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> Alert:
        """An alert as GET /alerts writes it, read by the wire's `Alert` (a ProtocolError when
        malformed)."""
        return cls.from_wire(WireAlert.from_json(payload))

    def to_store(self) -> dict[str, Any]:
        """As a page's store keeps it (a backtest's firings between two callbacks)."""
        return {**asdict(self), "keys": list(self.keys)}

    @classmethod
    def from_store(cls, stored: dict[str, Any]) -> Alert:
        return cls(**{**stored, "keys": tuple(stored.get("keys", ()))})


def alert_matches(metric: str | None, key: str) -> bool:
    """Whether an alert belongs on the chart of `key`. A rule's metric may be one key or
    comma-separated globs ("reward/mean,loss/*", "*"), as the alert engine's rules are."""
    if not metric:
        return False
    return any(fnmatch.fnmatchcase(key, p.strip()) for p in metric.split(",") if p.strip())


# -- smoothing ---------------------------------------------------------------------------


@dataclass
class EmaState:
    """Where a debiased EMA stands: its current value and how many finite points fed it."""

    value: float = 0.0
    count: int = 0

    def push(self, value: float, weight: float) -> float:
        self.count += 1
        # TensorBoard's debiased EMA, b_n / (1 - w^n) with b_n = w·b_(n-1) + (1 - w)·x_n,
        # written as a running value that moves towards each point by (1 - w) / (1 - w^n).
        # The same numbers, but exact for a constant (x - value is 0): the quotient form
        # rounds a constant 1.0 to 1.0000000000000002 at some steps, and the axis zooms
        # into that.
        gain = (1.0 - weight) / (1.0 - weight**self.count)
        self.value = value if gain >= 1.0 else self.value + gain * (value - self.value)
        return self.value


def ema(values: Sequence[float], weight: float) -> tuple[list[float | None], EmaState]:
    """TensorBoard-style debiased exponential moving average.

    `weight` in [0, 1): 0 returns the values unchanged. Non-finite values do not
    feed the average and come out as None (a gap; they are drawn as markers).
    Returns the smoothed list and the state that continues it.
    """
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing weight must be in [0, 1), got {weight}")
    state = EmaState()
    out: list[float | None] = []
    for value in values:
        out.append(state.push(value, weight) if math.isfinite(value) else None)
    return out, state


# -- non-finite values -------------------------------------------------------------------

NonFiniteKind = Literal["nan", "+inf", "-inf"]


@dataclass(frozen=True)
class NonFinite:
    step: int
    kind: NonFiniteKind


def _kind(value: float) -> NonFiniteKind | None:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    return None


def _all_finite(values: Sequence[float]) -> bool:
    """True when no value is NaN or ±inf, in one C-speed pass: a sum of finite values is
    finite unless it overflows, and then the caller looks value by value anyway."""
    try:
        return math.isfinite(sum(values))
    except TypeError:  # a None among them: looked at value by value
        return False


def all_zero(series: Series) -> bool:
    """Whether the series has points and every one is exactly 0 (a bucket's min and max too)."""
    parts = (series.values, series.mins or (), series.maxs or ())
    return bool(series.steps) and all(v == 0 for part in parts for v in part)


def nonfinite_points(series: Series) -> list[NonFinite]:
    """Every non-finite point, including those hidden inside a downsampled bucket.

    A bucket whose max is NaN held a NaN; a max of +inf or min of -inf held an
    infinity. One step can carry several kinds; each is reported once.
    """
    found: list[NonFinite] = []
    if all(_all_finite(part) for part in (series.values, series.mins or (), series.maxs or ())):
        return found
    envelopes: Iterable[tuple[float, ...]]
    if series.downsampled:
        assert series.mins is not None and series.maxs is not None
        envelopes = zip(series.values, series.mins, series.maxs, strict=True)
    else:
        envelopes = ((v,) for v in series.values)
    for step, candidates in zip(series.steps, envelopes, strict=True):
        kinds: list[NonFiniteKind] = []
        for value in candidates:
            kind = _kind(value)
            if kind is not None and kind not in kinds:
                kinds.append(kind)
        found.extend(NonFinite(step, kind) for kind in kinds)
    return found


# -- group aggregation -------------------------------------------------------------------


@dataclass(frozen=True)
class Band:
    """Mean of a group of runs with a spread band, on a shared step grid."""

    steps: list[int]
    mean: list[float | None]
    lower: list[float | None]
    upper: list[float | None]
    count: list[int] = field(default_factory=list)
    """How many runs had a finite value at each step."""


def _grid(all_steps: Iterable[Sequence[int]], max_points: int, end: int | None = None) -> list[int]:
    union = sorted({s for steps in all_steps for s in steps if end is None or s <= end})
    if len(union) <= max_points:
        return union
    stride = len(union) / max_points
    picked = [union[int(i * stride)] for i in range(max_points)]
    if picked[-1] != union[-1]:
        picked.append(union[-1])
    return picked


def as_of(steps: Sequence[int], values: Sequence[float | None], at: int) -> float | None:
    """The value last reported at or before `at`, only inside the run's own step range."""
    if not steps or at < steps[0] or at > steps[-1]:
        return None
    return values[bisect_right(steps, at) - 1]


def band_at(
    present: Iterable[float | None], spread: Literal["std", "stderr"]
) -> tuple[float, float, float, int] | None:
    """(mean, lower, upper, n) of the runs' values at one step: non-finite and missing values
    left out, the sample std (ddof=1) as the half-width, or std/√n for `stderr`; None when no
    value is finite. The page extends a live band with the same arithmetic (math.js `band`)."""
    finite = [v for v in present if v is not None and math.isfinite(v)]
    n = len(finite)
    if n == 0:
        return None
    if min(finite) == max(finite):
        # fsum(v, v, v) / 3 need not give v back; equal runs must give a line, not a band.
        mu, std = finite[0], 0.0
    else:
        mu = math.fsum(finite) / n
        std = math.sqrt(math.fsum((v - mu) * (v - mu) for v in finite) / (n - 1))  # as math.js squares
    half = std / math.sqrt(n) if spread == "stderr" else std
    return mu, mu - half, mu + half, n


def group_band(
    runs: Sequence[tuple[Sequence[int], Sequence[float | None]]],
    spread: Literal["std", "stderr"] = "std",
    max_points: int = 1000,
    end: int | None = None,
) -> Band:
    """Mean ± spread across runs (seeds of one arm), each given as (steps, values), at the
    steps up to `end` (None: every step).

    Runs rarely report the same steps (different downsampling buckets, crashes),
    so each is read "as of" every step of a shared grid, and only inside its own
    range: a run that died at step 500 stops counting after 500 (`band_at` at each step).
    With one run the band is the line itself.
    """
    grid = _grid((steps for steps, _ in runs), max_points, end)
    mean: list[float | None] = []
    lower: list[float | None] = []
    upper: list[float | None] = []
    count: list[int] = []
    for step in grid:
        at = band_at((as_of(steps, values, step) for steps, values in runs), spread)
        mu, lo, hi, n = at if at is not None else (None, None, None, 0)
        mean.append(mu)
        lower.append(lo)
        upper.append(hi)
        count.append(n)
    return Band(steps=grid, mean=mean, lower=lower, upper=upper, count=count)
