"""The statistics and the verdict of parity: is run B's sampler–learner mismatch the same as
run A's? Pure functions of per-step values, standard library only (and `wire` for JSON numbers).

`keel parity A B` (keel/parity.py: the command and its reads through keel.client) and the
compare page's parity view (dashboard/views/parity.py: its reads through dashboard.data) both
decide with `compare`, so the page and the command give one verdict for the same values. It
lives in the dashboard because the dashboard may not import `keel/` (docs/architecture.md);
`keel` imports it inside its functions, and it imports nothing but the standard library and
`wire`, so `keel parity` still runs on the base install (no Dash, no FastAPI;
tests/test_layering.py holds it to that).

What is compared, per step (docs/metrics.md, "Parity of two runs"):

- the scalars `mismatch/kl`, `mismatch/tail_frac`, `mismatch/tail_frac_2`,
  `mismatch/low_tail_frac`, `mismatch/log_ratio_abs_{rare,unlikely,likely}`, and the mean
  |ℓ| per token (`mismatch/log_ratio_abs_mean`) or per sequence (`_seq_mean`, slime's);
- from the step's `mismatch/log_ratio` histogram: the share of the tokens with |ℓ| ≥ τ
  (both tails) and with ℓ ≤ −τ (the low tail) for each τ (bin edges), and the share of
  tokens whose ℓ is NaN.

The statistic. Each step's value is one observation (the tokens of a step are not
independent draws: a step shares its weights, its prompts and its sampler state, and the
per-step values vary far more than token counting would say). Per metric, the two runs'
per-step values are compared with a two-sided Mann–Whitney rank-sum test, its p-value from
the exact permutation distribution of the rank sum (ties as midranks) when that is cheap to
enumerate, else from the normal approximation with tie and continuity corrections. The
p-values of the metrics tested are Holm-adjusted (the family-wise error stays at alpha
whatever the metrics' correlation; a metric all one value in both runs, such as a tail no
token reached, is the same and not counted). A metric *differs* when its adjusted p < alpha AND
its medians differ by more than the tolerance (|B − A| > tol · min(|A|, |B|), or the
floor when that is larger); otherwise it is the *same*. A metric whose step counts cannot
reach a significant p at all is reported "too few steps" and not tested.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from wire import encode_value

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_TAUS",
    "DEFAULT_TOLERANCE",
    "EXIT_DIFFERENT",
    "EXIT_INCOMPARABLE",
    "EXIT_SAME",
    "HISTOGRAM_KEY",
    "NAN_KEY",
    "SCALAR_KEYS",
    "MetricResult",
    "ParityError",
    "ParityReport",
    "compare",
    "format_ratio",
    "histogram_values",
    "holm",
    "joined_pages",
    "mann_whitney_p",
    "min_attainable_p",
    "pool",
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
)
"""Keel's own, and the mean |ℓ| frameworks log themselves (SkyRL's and TRL's per token,
slime's per sequence: docs/metrics.md): a run imported from a framework whose only mismatch
metric is its own is compared on it, against a run that logs the same one."""
HISTOGRAM_KEY = "mismatch/log_ratio"
DEFAULT_TAUS = (0.001, 0.01, 0.1)
"""Bin edges of `trainer_hooks.details.EDGES`: bf16 noise (~1e-3) and up; τ = 1 and 2 are
the scalars `tail_frac`, `tail_frac_2` and `low_tail_frac`."""
DEFAULT_TOLERANCE = 0.25
DEFAULT_ALPHA = 0.05

EXIT_SAME, EXIT_DIFFERENT, EXIT_INCOMPARABLE = 0, 1, 2
"""The verdicts as `keel parity` exits with them: same, different, incomparable."""
_EXACT_BUDGET = 4 * 10**9
"""Largest (bits of the generating polynomial) x (its updates) for the exact distribution."""
_EDGE_RTOL = 1e-6


class ParityError(Exception):
    """The runs cannot be compared (exit 2)."""


# -- the statistic ------------------------------------------------------------------------


def _midranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """Ranks 1..N of `values` (ties share their mean rank) and the sizes of the tie groups."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    ties: list[int] = []
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for position in range(i, j + 1):
            ranks[order[position]] = (i + j) / 2 + 1
        ties.append(j - i + 1)
        i = j + 1
    return ranks, ties


def min_attainable_p(n: int, m: int) -> float:
    """The smallest two-sided p-value the rank-sum test can give with n and m observations:
    both extreme orderings, 2 / C(n + m, n) (1 when either sample is empty)."""
    if n == 0 or m == 0:
        return 1.0
    return min(1.0, 2 / math.comb(n + m, n))


def mann_whitney_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of the Mann–Whitney rank-sum test of `a` against `b` (no NaN).

    Exact when cheap: the permutation distribution of the smaller sample's rank sum over all
    C(N, k) splits, counted with a generating polynomial packed into one Python int per
    subset size (ranks doubled, so midranks are integers). Else the normal approximation
    with the tie-corrected variance and a continuity correction.
    """
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        return 1.0
    ranks, ties = _midranks([*a, *b])
    if len(ties) == 1:
        return 1.0  # every value equal: nothing tells the samples apart
    total = n + m
    small, k = (ranks[:n], n) if n <= m else (ranks[n:], m)
    doubled = [round(2 * r) for r in ranks]
    observed = round(2 * sum(small))
    center = k * (total + 1)  # the doubled rank sum's mean under the null
    splits = math.comb(total, k)
    width = -(-(splits.bit_length() + 1) // 8) * 8  # bits per coefficient, whole bytes
    top = sum(sorted(doubled)[-k:])
    if width * (top + 1) * total * k <= _EXACT_BUDGET:
        return _exact_p(doubled, k, observed, center, width, top, splits)
    u = sum(small) - k * (k + 1) / 2
    variance = n * m / 12 * ((total + 1) - sum(t**3 - t for t in ties) / (total * (total - 1)))
    if variance <= 0:
        return 1.0
    z = max(0.0, abs(u - n * m / 2) - 0.5) / math.sqrt(variance)
    return min(1.0, math.erfc(z / math.sqrt(2)))


def _exact_p(doubled: list[int], k: int, observed: int, center: int, width: int, top: int, splits: int) -> float:
    # poly[j]: coefficient s (at bit s * width) counts the j-subsets with doubled rank sum s.
    poly = [1] + [0] * k
    for seen, value in enumerate(doubled, start=1):
        shift = value * width
        for j in range(min(k, seen), 0, -1):
            if poly[j - 1]:
                poly[j] += poly[j - 1] << shift
    step = width // 8
    raw = poly[k].to_bytes((top + 1) * step, "little")
    distance = abs(observed - center)
    extreme = 0
    for s in range(top + 1):
        if abs(s - center) >= distance:
            extreme += int.from_bytes(raw[s * step : (s + 1) * step], "little")
    return min(1.0, extreme / splits)


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


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    low, high = ordered[middle - 1], ordered[middle]
    if math.isinf(low) and low == high:
        return low
    return (low + high) / 2


def _ratio(a: float, b: float) -> float:
    """B / A; 1 when both are 0, ±inf when only A is."""
    if a == b:
        return 1.0
    if a == 0:
        return math.copysign(math.inf, b)
    return b / a


# -- the comparison -----------------------------------------------------------------------


@dataclass(frozen=True)
class MetricResult:
    key: str
    steps_a: int
    steps_b: int
    median_a: float
    median_b: float
    ratio: float
    """median B / median A."""
    tolerance: float
    floor: float
    within_tolerance: bool
    p: float | None
    """The rank-sum test's p-value; None when the metric was not tested (too few steps)."""
    p_adjusted: float | None
    """Holm-adjusted over the metrics tested."""
    significant: bool
    """p_adjusted < alpha."""
    verdict: str
    """"same", "differs" or "too few steps"."""

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "steps_a": self.steps_a,
            "steps_b": self.steps_b,
            "median_a": _json_number(self.median_a),
            "median_b": _json_number(self.median_b),
            "ratio": _json_number(self.ratio),
            "tolerance": self.tolerance,
            "floor": self.floor,
            "within_tolerance": self.within_tolerance,
            "p": self.p,
            "p_adjusted": self.p_adjusted,
            "significant": self.significant,
            "verdict": self.verdict,
        }


@dataclass
class ParityReport:
    metrics: list[MetricResult]
    alpha: float
    notes: list[str] = field(default_factory=list)
    """What was left out and why."""
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """"a", "b": id, name and the step range read (filled by the command)."""

    @property
    def exit_code(self) -> int:
        if any(metric.verdict == "differs" for metric in self.metrics):
            return EXIT_DIFFERENT
        if not any(metric.p is not None for metric in self.metrics):
            return EXIT_INCOMPARABLE
        return EXIT_SAME

    @property
    def verdict(self) -> str:
        return {EXIT_SAME: "same", EXIT_DIFFERENT: "different", EXIT_INCOMPARABLE: "incomparable"}[self.exit_code]

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "exit": self.exit_code,
            "alpha": self.alpha,
            "runs": self.runs,
            "metrics": [metric.to_json() for metric in self.metrics],
            "notes": self.notes,
        }

    def render(self) -> str:
        header = ("metric", "steps A/B", "A median", "B median", "B/A", "p (Holm)", "verdict")
        rows = [header]
        for metric in self.metrics:
            p = "-" if metric.p_adjusted is None else f"{metric.p_adjusted:.2g}"
            rows.append((
                metric.key, f"{metric.steps_a}/{metric.steps_b}", f"{metric.median_a:.3g}",
                f"{metric.median_b:.3g}", format_ratio(metric.ratio), p, metric.verdict,
            ))  # fmt: skip
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
        lines.insert(1, "  ".join("-" * width for width in widths))
        lines.extend(f"note: {note}" for note in self.notes)
        lines.append(self.summary())
        return "\n".join(lines)

    def summary(self) -> str:
        names = " vs ".join(
            str(self.runs[side].get("name", side.upper())) for side in ("a", "b") if side in self.runs
        ) or "A vs B"
        differing = [metric for metric in self.metrics if metric.verdict == "differs"]
        if differing:
            parts = [f"{m.key} {format_ratio(m.ratio)} (p={m.p_adjusted:.2g})" for m in differing]
            return f"DIFFERENT ({names}): B/A of the medians: " + ", ".join(parts)
        if self.exit_code == EXIT_INCOMPARABLE:
            return f"INCOMPARABLE ({names}): no metric has enough steps in both runs to test"
        tested = sum(metric.p is not None for metric in self.metrics)
        return f"SAME ({names}): {tested} metric(s) tested, none differs beyond its tolerance at alpha={self.alpha:g}"


def format_ratio(ratio: float) -> str:
    """B/A as the report shows it: "2.33x", "inf", "nan"."""
    if math.isnan(ratio):
        return "nan"
    if math.isinf(ratio):
        return "inf" if ratio > 0 else "-inf"
    return f"{ratio:.3g}x"


def _json_number(value: float) -> float | str:
    return encode_value(value)


def _per_key(spec: Mapping[str, float], key: str, default: float) -> float:
    return spec.get(key, default)


def compare(
    a: Mapping[str, Sequence[float]],
    b: Mapping[str, Sequence[float]],
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    tolerances: Mapping[str, float] | None = None,
    floor: float = 0.0,
    floors: Mapping[str, float] | None = None,
    alpha: float = DEFAULT_ALPHA,
) -> ParityReport:
    """Compare the per-step values of each metric both runs have (NaN values dropped).

    `tolerance` is relative (0.25: medians within 25 % of each other are the same),
    `floor` absolute (differences of the medians at or below it are the same), both per
    key overridable. Raises ParityError when no metric is shared or none has a step.
    """
    tolerances, floors = dict(tolerances or {}), dict(floors or {})
    notes: list[str] = []
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    for side, keys in (("A", only_a), ("B", only_b)):
        if keys:
            notes.append(f"only run {side} has {', '.join(keys)}: not compared")
    shared: dict[str, tuple[list[float], list[float]]] = {}
    for key in [key for key in a if key in b]:
        values_a = [float(v) for v in a[key] if not math.isnan(v)]
        values_b = [float(v) for v in b[key] if not math.isnan(v)]
        if not values_a or not values_b:
            side = "A" if not values_a else "B"
            notes.append(f"{key}: run {side} has no (non-NaN) value in the range: not compared")
            continue
        shared[key] = (values_a, values_b)
    if not shared:
        if not set(a) & set(b):
            raise ParityError("the runs share no mismatch metric (" + ("; ".join(notes) or "neither has any") + ")")
        raise ParityError("no steps in the range: " + "; ".join(notes))
    # A metric whose values are all one number in both runs (a tail no token reached) has
    # p = 1 under every ordering: it is the same, and left out of Holm's family (it could
    # never be rejected, so it need not share the error budget). The others are testable
    # when their step counts can give a p below alpha at Holm's first (strictest) step.
    constant = {key for key, (va, vb) in shared.items() if len({*va, *vb}) == 1}
    family = max(1, len(shared) - len(constant))
    testable = {key for key, (va, vb) in shared.items() if min_attainable_p(len(va), len(vb)) * family < alpha}
    raw = {key: mann_whitney_p(*shared[key]) for key in shared if key in testable - constant}
    adjusted = dict(zip(raw, holm(list(raw.values())), strict=True))
    for key in testable & constant:
        raw[key] = adjusted[key] = 1.0
    results: list[MetricResult] = []
    for key, (values_a, values_b) in shared.items():
        median_a, median_b = _median(values_a), _median(values_b)
        tol, flo = _per_key(tolerances, key, tolerance), _per_key(floors, key, floor)
        within = _within(median_a, median_b, tol, flo)
        p, p_adjusted = raw.get(key), adjusted.get(key)
        significant = p_adjusted is not None and p_adjusted < alpha
        if key not in testable:
            verdict = "too few steps"
            notes.append(
                f"{key}: {len(values_a)} and {len(values_b)} step(s) cannot give p < {alpha:g} over {family} metric(s): not tested"
            )
        elif significant and not within:
            verdict = "differs"
        else:
            verdict = "same"
        results.append(MetricResult(
            key=key, steps_a=len(values_a), steps_b=len(values_b), median_a=median_a, median_b=median_b,
            ratio=_ratio(median_a, median_b), tolerance=tol, floor=flo, within_tolerance=within,
            p=p, p_adjusted=p_adjusted, significant=significant, verdict=verdict,
        ))  # fmt: skip
    return ParityReport(metrics=results, alpha=alpha, notes=notes)


def _within(a: float, b: float, tolerance: float, floor: float) -> bool:
    if a == b:
        return True
    difference = abs(b - a)
    if math.isnan(difference):
        return False
    return difference <= max(tolerance * min(abs(a), abs(b)), floor)


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


# -- groups -------------------------------------------------------------------------------


def pool(runs: Sequence[Mapping[str, Sequence[float]]]) -> dict[str, list[float]]:
    """A group's per-step values: each metric's values of every run that has it, one run after
    another, so each step of each run is one observation (the runs of a group are draws of
    one setting, as the steps of a run are). A metric no run has is absent."""
    pooled: dict[str, list[float]] = {}
    for values in runs:
        for key, steps in values.items():
            pooled.setdefault(key, []).extend(steps)
    return pooled
