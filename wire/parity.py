"""The statistics and the verdict of parity: is B's sampler–learner mismatch the same as A's?
Pure functions of per-step values, standard library only (and `wire` for JSON numbers).

`keel parity A B` (keel/parity.py: the command and its reads through keel.client) and the
compare page's parity view (dashboard/views/parity.py: its reads through dashboard.data) both
decide with `compare_groups`, so the page and the command give one verdict for the same
values. It lives in `wire`, which both may import (docs/architecture.md), and imports
nothing but the standard library and `wire`, so `keel parity` runs on the base install (no
Dash, no FastAPI, no numpy; tests/test_layering.py holds it to that).

What is compared (docs/parity.md): the mismatch scalars both sides log (SCALAR_KEYS) and,
from the `mismatch/log_ratio` histogram, each step's share of tokens in each tail.

The unit of evidence. Steps are not independent: a step's mismatch is close to its
neighbours' (same weights a few updates apart, same policy sharpness), and two seeds are two
trajectories of the policy whose mismatch differs for as long as they run. A per-step test
therefore calls any two long runs different. Here each run is cut into BLOCKS contiguous
blocks of steps, a block summarised by log(mean + floor) of its steps' values (the floor:
numerical noise, below which values are zero for any engine), and the sides are compared on
those summaries:

- one run a side: block k of A against block k of B (the same stretch of training, so the
  mismatch's trend cancels); the ten differences give the estimate, its standard error and
  a t distribution with 9 degrees of freedom. How much two seeds of one engine differ cannot
  be seen from one run each, so the margin (SEED_TOLERANCE) holds it: measured on `keel lm`
  (bench/parity_calibration.py);
- several runs (seeds) on a side: each run's mean block summary is one observation; the
  spread of the runs within each side is the noise (pooled, nA + nB − 2 degrees of freedom),
  so seed-to-seed variation is measured, and the margin (DEFAULT_TOLERANCE) is only what
  counts as practically the same.

The verdict per metric, on the log scale with the margin ±log(1 + tolerance): it *differs*
when log(B/A) is beyond the margin with one-sided p < α after Holm's adjustment over the
metrics (a t test on the blocks or the runs); otherwise it is the *same* when its own
(1 − 2α) interval reaches inside the margin (p ≥ α for this metric alone) and the comparison
could have seen a change of CANNOT_TELL_BEYOND times the margin (its `detectable` ratio: the
margin times exp(t · standard error) at Holm's strictest level), and *cannot tell* when
either fails. The report is different when any metric differs; else same when its headline
metric (the KL, or a framework's mean |ℓ|: `ParityReport.headline`) is the same, else cannot
tell. Not different is not proof of equality: the report says, per metric, what it could
have detected.

Why not an equivalence test (TOST: same only when the interval fits inside the margin): two
seeds of one `keel lm` engine differ, at 100 steps, by 90 % intervals reaching 5.5x on the KL
(95th percentile of pairs; 12x at most) and up to 95x on the |ℓ| ≥ 1 tail's share
(docs/parity.md, from bench/parity_calibration.py). An equivalence test calls
nearly every short comparison of seeds "cannot tell" at any margin a real change could still
exceed; a CI gate needs seeds of one engine to pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from wire.messages import encode_value

__all__ = [
    "BLOCKS",
    "CANNOT_TELL_BEYOND",
    "DEFAULT_ALPHA",
    "DEFAULT_TAUS",
    "DEFAULT_TOLERANCE",
    "EXIT_CANNOT_TELL",
    "EXIT_DIFFERENT",
    "EXIT_INCOMPARABLE",
    "EXIT_SAME",
    "HISTOGRAM_KEY",
    "NAN_KEY",
    "SCALAR_KEYS",
    "SEED_TOLERANCE",
    "MetricResult",
    "ParityError",
    "ParityReport",
    "compare",
    "compare_groups",
    "default_floor",
    "format_ratio",
    "header",
    "histogram_values",
    "holm",
    "joined_pages",
    "student_t_cdf",
    "student_t_quantile",
    "tail_key",
]

SCALAR_KEYS = (
    "mismatch/kl",
    "mismatch/tail_frac",
    "mismatch/tail_frac_2",
    "mismatch/low_tail_frac",
    "mismatch/log_ratio_abs_rare",
    "mismatch/log_ratio_abs_unlikely",
    "mismatch/log_ratio_abs_likely",
    "mismatch/log_ratio_abs_mean",
    "mismatch/log_ratio_abs_seq_mean",
    "mismatch/kl_k1",
)
"""Keel's own, the mean |ℓ| frameworks log themselves (SkyRL's and TRL's per token, slime's
per sequence: docs/metrics.md) and a framework's k1 estimate of the KL (verl's
`rollout_corr/kl`, OpenRLHF's `vllm_kl`: the token mean of −ℓ): a run imported from a framework whose only mismatch
metric is its own is compared on it, against a run that logs the same one."""
HISTOGRAM_KEY = "mismatch/log_ratio"
DEFAULT_TAUS = (0.001, 0.01, 0.1)
"""Bin edges of `trainer_hooks.details.EDGES`: bf16 noise (~1e-3) and up; τ = 1 and 2 are
the scalars `tail_frac`, `tail_frac_2` and `low_tail_frac`."""
DEFAULT_ALPHA = 0.05
DEFAULT_TOLERANCE = 0.25
"""With several runs a side: B/A within [1/1.25, 1.25] is no difference (seed-to-seed variation
is measured from the runs, so the margin is only what no one would act on)."""
SEED_TOLERANCE = 1.0
"""With one run a side: B/A within [1/2, 2] is no difference. Two seeds of one `keel lm` engine
have KLs within 2.3x of each other in 95 % of pairs at 100 steps, 1.7x at 1,000
(bench/parity_calibration.py, docs/parity.md): one run a side cannot measure that, so the
margin must hold it."""
BLOCKS = 10
"""Blocks a run is cut into: at 100 steps blocks of 10 (longer than the few steps over which
a step's mismatch follows its neighbours'), 9 degrees of freedom for one run a side."""
MIN_BLOCK_STEPS = 3
MIN_BLOCKS = 4
"""A run needs MIN_BLOCKS blocks of MIN_BLOCK_STEPS steps (12 steps) for a metric to be tested."""
KL_FLOOR = 1e-12
"""Nats: an fp32 sampler's KL is 1e-15..1e-14 (rounding of the log-probabilities alone)."""
LOG_RATIO_FLOOR = 1e-6
"""|ℓ| in nats: a few float32 ulps of a log-probability (an fp32 sampler's |ℓ| is ~5e-8)."""
SHARE_FLOOR = 1e-4
"""A share of tokens: one token in ten thousand."""

CANNOT_TELL_BEYOND = 10.0
"""A comparison that would call B/A different only an order of magnitude beyond the margin
(20x at the margin of one run a side, 12.5x with seeds) tells nothing about the metric. Two
seeds of one `keel lm` engine at lag 4 detect 10–17x over 100 steps (docs/parity.md)."""

EXIT_SAME, EXIT_DIFFERENT, EXIT_INCOMPARABLE, EXIT_CANNOT_TELL = 0, 1, 2, 3
"""The verdicts as `keel parity` exits with them: same, different, incomparable (nothing to
test), cannot tell (tested, but the headline metric could not have seen a change of
CANNOT_TELL_BEYOND times its margin: more steps or more seeds)."""
_EDGE_RTOL = 1e-6


class ParityError(Exception):
    """The runs cannot be compared (exit 2)."""


def default_floor(key: str) -> float:
    """The numerical-noise floor of a metric: values at or below it are zero for any engine."""
    if key == "mismatch/kl":
        return KL_FLOOR
    if key.startswith("mismatch/log_ratio_abs"):
        return LOG_RATIO_FLOOR
    if key.startswith(("mismatch/tail_frac", "mismatch/low_tail_frac", f"{HISTOGRAM_KEY}:")):
        return SHARE_FLOOR
    return KL_FLOOR


# -- Student's t (integer degrees of freedom) ----------------------------------------------


def student_t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with integer df >= 1: the closed form of Abramowitz & Stegun
    26.7.3–4 (a finite sum of df / 2 terms), exact to rounding; no SciPy on the base install."""
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    theta = math.atan(abs(t) / math.sqrt(df))
    cos2, sin = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:
        term, total = math.cos(theta), 0.0
        if df > 1:
            total = term
            for k in range(3, df - 1, 2):
                term *= cos2 * (k - 1) / k
                total += term
        within = 2 / math.pi * (theta + sin * total)
    else:
        term = total = 1.0
        for k in range(2, df - 1, 2):
            term *= cos2 * (k - 1) / k
            total += term
        within = sin * total
    within = min(1.0, max(0.0, within))
    return 0.5 + within / 2 if t >= 0 else 0.5 - within / 2


def student_t_quantile(q: float, df: int) -> float:
    """The t with P(T <= t) = q (bisection on `student_t_cdf`)."""
    if not 0 < q < 1:
        raise ValueError(f"q must be in (0, 1), got {q}")
    if q < 0.5:
        return -student_t_quantile(1 - q, df)
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < q:
        low, high = high, high * 2
    for _ in range(100):
        middle = (low + high) / 2
        if student_t_cdf(middle, df) < q:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def _upper_p(statistic: float, df: int) -> float:
    """One-sided P(T >= statistic)."""
    return 1.0 - student_t_cdf(statistic, df)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment: family-wise error control under any dependence."""
    count = len(p_values)
    order = sorted(range(count), key=lambda i: p_values[i])
    adjusted = [1.0] * count
    running = 0.0
    for position, i in enumerate(order):
        running = max(running, min(1.0, (count - position) * p_values[i]))
        adjusted[i] = running
    return adjusted


# -- the evidence: block summaries -----------------------------------------------------------


def block_summaries(values: Sequence[float], floor: float, blocks: int = BLOCKS) -> list[float]:
    """log(mean + floor) of each of `blocks` contiguous blocks of `values` (in step order;
    sizes differ by at most one step). A block's mean, not its median: a tail share is 0 at
    most steps of a block and still not nothing, and one bad step is part of the mismatch."""
    count = len(values)
    cuts = [round(i * count / blocks) for i in range(blocks + 1)]
    return [
        math.log(max(0.0, math.fsum(values[cuts[i] : cuts[i + 1]]) / (cuts[i + 1] - cuts[i])) + floor)
        for i in range(blocks)
    ]


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _variance(values: Sequence[float]) -> float:
    center = _mean(values)
    return math.fsum((v - center) ** 2 for v in values) / (len(values) - 1)


@dataclass(frozen=True)
class _Evidence:
    """log(B/A) of one metric: estimate, standard error and degrees of freedom."""

    estimate: float
    se: float
    df: int
    level_a: float
    level_b: float
    blocks: int
    constant: bool


def _evidence(runs_a: Sequence[Sequence[float]], runs_b: Sequence[Sequence[float]], floor: float) -> _Evidence | None:
    """None when a run has too few steps (MIN_BLOCKS blocks of MIN_BLOCK_STEPS)."""
    blocks = min(BLOCKS, *(len(run) // MIN_BLOCK_STEPS for run in [*runs_a, *runs_b]))
    if blocks < MIN_BLOCKS:
        return None
    side_a = [block_summaries(run, floor, blocks) for run in runs_a]
    side_b = [block_summaries(run, floor, blocks) for run in runs_b]
    constant = len({summary for run in [*side_a, *side_b] for summary in run}) == 1
    if len(side_a) == 1 and len(side_b) == 1:
        # One run a side: block k against block k, the same stretch of training.
        differences = [b - a for a, b in zip(side_a[0], side_b[0], strict=True)]
        estimate, df = _mean(differences), blocks - 1
        se = math.sqrt(_variance(differences) / blocks)
    else:
        # Seeds: each run's mean summary is one observation; the runs' spread is the noise.
        means_a, means_b = [_mean(run) for run in side_a], [_mean(run) for run in side_b]
        df = len(means_a) + len(means_b) - 2
        pooled = math.fsum((len(m) - 1) * _variance(m) for m in (means_a, means_b) if len(m) > 1) / df
        estimate = _mean(means_b) - _mean(means_a)
        se = math.sqrt(pooled * (1 / len(means_a) + 1 / len(means_b)))
    return _Evidence(estimate, se, df, _level(side_a, floor), _level(side_b, floor), blocks, constant)


def _level(side: Sequence[Sequence[float]], floor: float) -> float:
    """A side's typical value: exp of its mean block summary, less the floor (0 when what is
    left is rounding of the floor itself)."""
    level = math.exp(_mean([summary for run in side for summary in run])) - floor
    return level if level > floor * 1e-9 else 0.0


# -- the comparison ------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricResult:
    key: str
    steps_a: int
    """Steps of A's runs (all of them) with a value."""
    steps_b: int
    level_a: float
    """exp(mean block summary) − floor: A's typical value (a geometric mean of block means)."""
    level_b: float
    ratio: float
    """B/A of the floored levels: exp of the estimated log(B/A)."""
    interval: tuple[float, float] | None
    """The (1 − 2α) interval of B/A; None when not tested."""
    tolerance: float
    """The margin: B/A within [1/(1 + tolerance), 1 + tolerance] is no difference."""
    floor: float
    detectable: float | None
    """The smallest B/A (or its inverse) this comparison calls different at its steps and
    runs: exp(margin + t · standard error), at Holm's strictest level."""
    blocks: int
    constant: bool
    """One value throughout both sides (a tail no token reached): the same, outside Holm's
    family, and no evidence that the comparison could see a change."""
    p_different: float | None
    """One-sided p of |log(B/A)| > margin; None when not tested."""
    p_adjusted: float | None
    """p_different Holm-adjusted over the metrics tested."""
    verdict: str
    """"same", "differs", "cannot tell" or "too few steps"."""

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "steps_a": self.steps_a,
            "steps_b": self.steps_b,
            "level_a": _json_number(self.level_a),
            "level_b": _json_number(self.level_b),
            "ratio": _json_number(self.ratio),
            "interval": None if self.interval is None else [_json_number(x) for x in self.interval],
            "tolerance": self.tolerance,
            "floor": self.floor,
            "detectable": None if self.detectable is None else _json_number(self.detectable),
            "blocks": self.blocks,
            "constant": self.constant,
            "p_different": self.p_different,
            "p_adjusted": self.p_adjusted,
            "verdict": self.verdict,
        }


VERDICTS = {EXIT_SAME: "same", EXIT_DIFFERENT: "different", EXIT_INCOMPARABLE: "incomparable", EXIT_CANNOT_TELL: "cannot tell"}


def header(alpha: float) -> tuple[str, ...]:
    """The table's columns (the interval's level is 1 − 2α)."""
    return ("metric", "steps A/B", "A", "B", "B/A", f"{1 - 2 * alpha:.0%} interval", "detects", "floor", "p (Holm)", "verdict")


@dataclass
class ParityReport:
    metrics: list[MetricResult]
    alpha: float
    runs_a: int
    """Runs (seeds) on each side."""
    runs_b: int
    notes: list[str] = field(default_factory=list)
    """What was left out and why."""
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """"a", "b": name(s), id(s) and the step range read (filled by the command)."""

    @property
    def exit_code(self) -> int:
        verdicts = {metric.verdict for metric in self.metrics}
        if "differs" in verdicts:
            return EXIT_DIFFERENT
        if not verdicts - {"too few steps"}:
            return EXIT_INCOMPARABLE
        headline = self.headline
        return EXIT_SAME if headline is None or headline.verdict == "same" else EXIT_CANNOT_TELL

    @property
    def headline(self) -> MetricResult | None:
        """The metric whose power the verdict rests on: the first of SCALAR_KEYS (the KL, else
        a framework's mean |ℓ|) that was tested and varies, else the first other one. A share
        near 1 or a tail no token reached cannot say that a large change would have been seen."""
        varying = [metric for metric in self.metrics if metric.blocks and not metric.constant]
        ranked = sorted(varying, key=lambda m: SCALAR_KEYS.index(m.key) if m.key in SCALAR_KEYS else len(SCALAR_KEYS))
        return ranked[0] if ranked else None

    @property
    def verdict(self) -> str:
        return VERDICTS[self.exit_code]

    @property
    def method(self) -> str:
        """What was compared, and against what noise: the report's first line."""
        tested = [m for m in self.metrics if m.blocks]
        blocks = max((m.blocks for m in tested), default=0)
        steps = max((m.steps_a / self.runs_a for m in tested if m.blocks == blocks), default=0) / max(1, blocks)
        cut = f"{blocks} blocks of ~{steps:.3g} steps"
        if self.runs_a == 1 and self.runs_b == 1:
            noise = (
                f"one run a side, each cut into {cut} compared block by block "
                "(seed-to-seed variation is not measured: the margin holds it)"
            )
        else:
            noise = (
                f"{self.runs_a} run(s) against {self.runs_b}, each run the mean of its {cut}; "
                "the spread of the runs within a side is the noise"
            )
        tolerances = sorted({metric.tolerance for metric in self.metrics})
        margin = ", ".join(f"{1 + t:.3g}x" for t in tolerances) or "-"
        return (
            f"{noise}; different when B/A is beyond {margin} (p < {self.alpha:g}, Holm over the metrics); "
            "'detects': the smallest B/A it would call different"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "exit": self.exit_code,
            "alpha": self.alpha,
            "method": self.method,
            "runs": self.runs,
            "metrics": [metric.to_json() for metric in self.metrics],
            "notes": self.notes,
        }

    def rows(self) -> list[tuple[str, ...]]:
        """The table's rows, as the command prints them and the page shows them (HEADER)."""
        rows: list[tuple[str, ...]] = []
        for m in self.metrics:
            interval = "-" if m.interval is None else f"{format_ratio(m.interval[0])}–{format_ratio(m.interval[1])}"
            detectable = "-" if m.detectable is None else f"≥{format_ratio(m.detectable)}"
            p = "-" if m.p_adjusted is None else f"{m.p_adjusted:.2g}"
            rows.append((
                m.key, f"{m.steps_a}/{m.steps_b}", f"{m.level_a:.3g}", f"{m.level_b:.3g}", format_ratio(m.ratio),
                interval, detectable, f"{m.floor:g}", p, m.verdict,
            ))  # fmt: skip
        return rows

    def render(self) -> str:
        rows = [header(self.alpha), *self.rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
        lines.insert(1, "  ".join("-" * width for width in widths))
        lines.insert(0, f"method: {self.method}")
        lines.extend(f"note: {note}" for note in self.notes)
        lines.append(self.summary())
        return "\n".join(lines)

    def summary(self) -> str:
        names = " vs ".join(
            str(self.runs[side].get("name", side.upper())) for side in ("a", "b") if side in self.runs
        ) or "A vs B"
        code = self.exit_code
        if code == EXIT_DIFFERENT:
            parts = [
                f"{m.key} {format_ratio(m.ratio)} (p={m.p_adjusted:.2g})" for m in self.metrics if m.verdict == "differs"
            ]
            return f"DIFFERENT ({names}): B/A beyond the margin: " + ", ".join(parts)
        if code == EXIT_INCOMPARABLE:
            return f"INCOMPARABLE ({names}): no metric has enough steps in every run to test"
        tested = [m for m in self.metrics if m.verdict != "too few steps"]
        headline = self.headline
        seen = "" if headline is None or headline.detectable is None else f"{headline.key} detects ≥{format_ratio(headline.detectable)}"
        if code == EXIT_CANNOT_TELL:
            return (
                f"CANNOT TELL ({names}): no metric differs, but {seen}, over {CANNOT_TELL_BEYOND:g}x its margin: "
                "more steps or more seeds a side"
            )
        unsure = [m.key for m in tested if m.verdict == "cannot tell"]
        blind = f"; {len(unsure)} cannot tell ({', '.join(unsure)})" if unsure else ""
        return f"SAME ({names}): {len(tested)} metric(s) tested, none beyond its margin" + (f"; {seen}" if seen else "") + blind


def format_ratio(ratio: float) -> str:
    """B/A as the report shows it: "2.33x", "inf", "nan"."""
    if math.isnan(ratio):
        return "nan"
    if math.isinf(ratio):
        return "inf" if ratio > 0 else "-inf"
    return f"{ratio:.3g}x"


def _json_number(value: float) -> float | str:
    return encode_value(value)


def compare(a: Mapping[str, Sequence[float]], b: Mapping[str, Sequence[float]], **options: Any) -> ParityReport:
    """One run a side: `compare_groups([a], [b], ...)`."""
    return compare_groups([a], [b], **options)


def compare_groups(
    runs_a: Sequence[Mapping[str, Sequence[float]]],
    runs_b: Sequence[Mapping[str, Sequence[float]]],
    *,
    tolerance: float | None = None,
    tolerances: Mapping[str, float] | None = None,
    floor: float | None = None,
    floors: Mapping[str, float] | None = None,
    alpha: float = DEFAULT_ALPHA,
) -> ParityReport:
    """Compare each metric every run of both sides has, from its per-step values in step
    order (NaN values dropped).

    `tolerance` is the margin (0.25: B/A within [0.8, 1.25] is no difference); None takes
    SEED_TOLERANCE with one run a side, DEFAULT_TOLERANCE with several. `floor` replaces
    every metric's noise floor (`default_floor`); both overridable per key. Raises
    ParityError when a side has no run, no metric is shared, or none has a step.
    """
    if not runs_a or not runs_b:
        raise ParityError("each side needs at least one run")
    single = len(runs_a) == 1 and len(runs_b) == 1
    default_tolerance = tolerance if tolerance is not None else SEED_TOLERANCE if single else DEFAULT_TOLERANCE
    tolerances, floors = dict(tolerances or {}), dict(floors or {})
    notes: list[str] = []
    keys_a = set.intersection(*(set(run) for run in runs_a))
    keys_b = set.intersection(*(set(run) for run in runs_b))
    every = list(dict.fromkeys(key for run in [*runs_a, *runs_b] for key in run))
    for side, keys, other in (("A", keys_a, keys_b), ("B", keys_b, keys_a)):
        only = [key for key in every if key in keys and key not in other]
        if only:
            notes.append(f"only side {side} has {', '.join(only)} (in every run): not compared")
    shared: dict[str, tuple[list[list[float]], list[list[float]]]] = {}
    for key in (key for key in every if key in keys_a and key in keys_b):
        values_a, values_b = ([[float(v) for v in run[key] if not math.isnan(v)] for run in runs] for runs in (runs_a, runs_b))
        if not all([*values_a, *values_b]):
            notes.append(f"{key}: a run has no (non-NaN) value in the range: not compared")
            continue
        shared[key] = (values_a, values_b)
    if not shared:
        if not keys_a & keys_b:
            raise ParityError("the runs share no mismatch metric (" + ("; ".join(notes) or "none has any") + ")")
        raise ParityError("no steps in the range: " + "; ".join(notes))
    found: dict[str, _Evidence | None] = {}
    for key, (values_a, values_b) in shared.items():
        found[key] = _evidence(values_a, values_b, floors.get(key, floor if floor is not None else default_floor(key)))
    # A metric at one value throughout (a tail no token reached: all at the floor) is the
    # same and left out of Holm's family: it could never differ, so it takes no share of alpha.
    family = [key for key, evidence in found.items() if evidence is not None and not evidence.constant]
    p_different: dict[str, float] = {}
    margins = {key: math.log1p(tolerances.get(key, default_tolerance)) for key in shared}
    for key, evidence in found.items():
        if evidence is None:
            continue
        distance, margin = abs(evidence.estimate), margins[key]
        if evidence.se > 0:
            p_different[key] = _upper_p((distance - margin) / evidence.se, evidence.df)
        else:  # no spread at all: the estimate is the difference
            p_different[key] = 0.0 if distance > margin else 1.0
    adjusted = dict(zip(family, holm([p_different[key] for key in family]), strict=True))
    strictest = alpha / max(1, len(family))
    results = []
    for key, (values_a, values_b) in shared.items():
        evidence, margin = found[key], margins[key]
        steps_a, steps_b = sum(map(len, values_a)), sum(map(len, values_b))
        key_floor = floors.get(key, floor if floor is not None else default_floor(key))
        key_tolerance = tolerances.get(key, default_tolerance)
        if evidence is None:
            fewest = min(map(len, [*values_a, *values_b]))
            notes.append(
                f"{key}: a run has {fewest} step(s), fewer than {MIN_BLOCKS} blocks of {MIN_BLOCK_STEPS}: not tested"
            )
            results.append(MetricResult(
                key, steps_a, steps_b, math.nan, math.nan, math.nan, None, key_tolerance, key_floor, None, 0,
                False, None, None, "too few steps",
            ))  # fmt: skip
            continue
        half = student_t_quantile(1 - alpha, evidence.df) * evidence.se
        reach = student_t_quantile(1 - strictest, evidence.df) * evidence.se
        p_adj = adjusted.get(key, p_different[key])
        detectable = math.exp(margin + reach)
        if p_adj < alpha:
            verdict = "differs"
        elif p_different[key] >= alpha and reach <= math.log(CANNOT_TELL_BEYOND):
            verdict = "same"
        else:  # beyond the margin for this metric alone but not over the family, or blind
            verdict = "cannot tell"
        results.append(MetricResult(
            key=key, steps_a=steps_a, steps_b=steps_b, level_a=evidence.level_a, level_b=evidence.level_b,
            ratio=math.exp(evidence.estimate),
            interval=(math.exp(evidence.estimate - half), math.exp(evidence.estimate + half)),
            tolerance=key_tolerance, floor=key_floor, detectable=detectable, blocks=evidence.blocks,
            constant=evidence.constant, p_different=p_different[key], p_adjusted=p_adj, verdict=verdict,
        ))  # fmt: skip
    return ParityReport(metrics=results, alpha=alpha, runs_a=len(runs_a), runs_b=len(runs_b), notes=notes)


# -- a histogram's tails -----------------------------------------------------------------


def tail_key(tau: float, *, low: bool) -> str:
    return f"{HISTOGRAM_KEY}:{'<=-' if low else 'abs>='}{tau:g}"


NAN_KEY = f"{HISTOGRAM_KEY}:nan"


def joined_pages(parts: Sequence[Mapping[str, Any] | None]) -> tuple[list[float], list[list[int]], list[int], int]:
    """Consecutive unbucketed answers of GET /runs/{id}/distributions joined: edges, per-step
    counts, NaN counts and the steps left out (those whose edges differ from the first page's
    are left out too)."""
    edges: list[float] = []
    counts: list[list[int]] = []
    nans: list[int] = []
    left_out = 0
    for part in parts:
        if not part or not part["steps"]:
            continue
        if edges and part["edges"] != edges:
            left_out += len(part["steps"])
            continue
        edges = list(part["edges"])
        counts += part["counts"]
        nans += part["nan"]
        left_out += int(part["left_out"])
    return edges, counts, nans, left_out


def histogram_values(
    edges: Sequence[float], counts: Sequence[Sequence[int]], nans: Sequence[int], taus: Iterable[float]
) -> tuple[dict[str, list[float]], list[str]]:
    """Per step of a distributions answer: for each τ the share of the finite tokens with
    |ℓ| ≥ τ and with ℓ ≤ −τ (ℓ < −τ exactly: −τ itself is in the bin above), and the share
    of NaN tokens. Bins are [e(i), e(i+1)); a τ must be a bin edge (both signs)."""
    values: dict[str, list[float]] = {}
    notes: list[str] = []
    bins: list[tuple[float, list[int], list[int]]] = []
    for tau in taus:
        upper = _edge_index(edges, tau)
        lower = _edge_index(edges, -tau)
        if upper is None or lower is None:
            notes.append(f"τ={tau:g} is not a bin edge of {HISTOGRAM_KEY} (±{tau:g}): left out")
            continue
        # |ℓ| ≥ τ: the bins at or above +τ, and those whose upper edge is at or below −τ.
        high_bins = list(range(upper, len(edges) - 1))
        low_bins = list(range(0, lower))
        bins.append((tau, high_bins, low_bins))
        values[tail_key(tau, low=False)] = []
        values[tail_key(tau, low=True)] = []
    values[NAN_KEY] = []
    for step_counts, nan in zip(counts, nans, strict=True):
        finite = sum(step_counts)
        if finite + nan:
            values[NAN_KEY].append(nan / (finite + nan))
        if not finite:
            continue
        for tau, high_bins, low_bins in bins:
            low = sum(step_counts[i] for i in low_bins)
            high = sum(step_counts[i] for i in high_bins)
            values[tail_key(tau, low=False)].append((low + high) / finite)
            values[tail_key(tau, low=True)].append(low / finite)
    return values, notes


def _edge_index(edges: Sequence[float], value: float) -> int | None:
    for index, edge in enumerate(edges):
        if math.isclose(edge, value, rel_tol=_EDGE_RTOL):
            return index
    return None


