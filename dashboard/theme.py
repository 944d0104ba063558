"""Look and vocabulary of the dashboard: colours, metric titles and units, chart defaults.

One place for these so every page and figure agrees (a run is the same colour
everywhere; a metric has one title and one unit).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "GROUP_PALETTE",
    "DASHES",
    "HEADLINE_KEYS",
    "SIGNAL_KEYS",
    "LOSS_MAGNITUDE_KEY",
    "logged_charts",
    "drawn_keys",
    "HAZARD_TOOLTIP",
    "CRITICAL_HAZARD",
    "KL_KEY",
    "HEALTHY",
    "HAZARD_HEALTHY",
    "LOSS_CONFIG_KEYS",
    "loss_name",
    "KL_BANDS",
    "MetricInfo",
    "metric_info",
    "SEVERITY_COLOURS",
    "FONT",
    "INK",
    "MUTED",
    "GRID",
]

FONT = "Inter, system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif"
INK = "#1f2933"
MUTED = "#7b8794"
GRID = "#e4e7eb"

# Colour-blind-safe (Okabe-Ito ordering, then Tableau extras): one colour per group.
GROUP_PALETTE = (
    "#0072B2",
    "#D55E00",
    "#009E73",
    "#CC79A7",
    "#E69F00",
    "#56B4E9",
    "#8C564B",
    "#4E79A7",
    "#B07AA1",
    "#59A14F",
)
# Runs of one group share its colour and differ by dash, so seeds stay apart.
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")

# Alert colours stay clear of the group palette's orange and vermillion.
SEVERITY_COLOURS = {"critical": "#C81E1E", "warning": "#CA8A04", "info": "#2563EB"}


@dataclass(frozen=True)
class MetricInfo:
    key: str
    title: str
    """Human title shown above the chart."""
    unit: str
    """y-axis label: what the number measures."""
    log_y: bool
    """Spans decades (KL, ratios, norms): a log axis shows the climb before the blow-up."""
    sources: tuple[str, ...] = ()
    """The metrics the chart draws when its key is not one (`LOSS_MAGNITUDE_KEY`): each run's
    line is the first of them the run logs. Empty: the chart draws its own key."""
    of: Literal["value", "magnitude"] = "value"
    """"magnitude" draws |x| (a loss, whose sign means nothing to its size)."""
    companion: str | None = None
    """A metric drawn beside each run's line as a dashed line (`response/length_cap` beside
    the length), for the runs that log it."""
    learned_level: bool = False
    """Draw each run's learned level (dashboard/learned_level.py) as a dashed line."""
    of_loss: str | None = None
    """What the metric counts of the run's loss ("gated"): a run whose loss never does it logs
    0 at every step, and its chart says the metric is not used by that loss instead of drawing
    a flat line."""

    @property
    def drawn_from(self) -> tuple[str, ...]:
        """The metrics whose values the chart's lines are (its key, or its sources)."""
        return self.sources or (self.key,)


_KNOWN = {
    info.key: info
    for info in (
        MetricInfo("reward/mean", "Reward", "mean reward", False),
        MetricInfo("reward/std", "Reward spread", "std of reward", False),
        MetricInfo("mismatch/kl", "Sampler–learner KL", "KL(μ‖π), nats (k3)", True),
        MetricInfo("mismatch/kl_k1", "KL estimate k1", "nats", False),
        MetricInfo("mismatch/kl_k2", "KL estimate k2", "nats", True),
        MetricInfo("mismatch/ratio_max", "Max importance ratio", "max π/μ (raw)", True),
        MetricInfo("mismatch/ratio_min", "Min importance ratio", "min π/μ", True),
        MetricInfo("mismatch/ess_frac", "Effective sample size", "fraction of tokens", False),
        MetricInfo("mismatch/log_ratio_abs_mean", "Mean |log ratio|", "nats", True),
        MetricInfo("mismatch/log_ratio_p99", "p99 |log ratio|", "nats", True),
        MetricInfo("mismatch/tail_frac", "Tail fraction", "fraction of tokens with |ℓ| ≥ 1", True),
        MetricInfo("mismatch/tail_frac_2", "Far tail fraction", "fraction of tokens with |ℓ| ≥ 2", True),
        MetricInfo("mismatch/low_tail_frac", "Low tail fraction", "fraction of tokens with ℓ ≤ −1", True),
        MetricInfo("mismatch/log_ratio_abs_rare", "Mean |log ratio|, μ < 1e-3", "nats", True),
        MetricInfo("mismatch/log_ratio_abs_unlikely", "Mean |log ratio|, 1e-3 ≤ μ < 0.1", "nats", True),
        MetricInfo("mismatch/log_ratio_abs_likely", "Mean |log ratio|, μ ≥ 0.1", "nats", True),
        MetricInfo("mismatch/bkl_seq_max", "Max sequence Bernoulli KL", "nats", True),
        MetricInfo("gate/frac", "Gated fraction", "fraction of units gated", False, of_loss="gated"),
        MetricInfo("grad/norm", "Gradient norm", "global L2 norm, pre-clip", True),
        MetricInfo("policy/entropy", "Policy entropy", "nats / token", True, learned_level=True),
        MetricInfo("policy/clip_frac", "PPO clip fraction", "share of tokens clipped", False),
        MetricInfo("policy/ppo_kl", "PPO KL", "KL(π_old‖π), nats", True),
        MetricInfo("policy/ratio_max", "Max PPO ratio", "max π/π_old", True),
        MetricInfo("loss/total", "Loss", "loss", False),
        MetricInfo("loss/pg", "Policy-gradient loss", "loss", False),
        MetricInfo(
            "|loss|", "Loss magnitude", "|loss| (sign dropped)", True, sources=("loss/total", "loss/pg"), of="magnitude"
        ),
        MetricInfo("response/length_mean", "Response length", "tokens (mean per answer)", False, companion="response/length_cap"),
        MetricInfo("response/length_cap", "Length cap", "tokens", False),
        MetricInfo("response/truncated_frac", "Answers at the length cap", "share of answers (0–1)", False),
        MetricInfo("reward/zero_std_frac", "Prompts without reward spread", "share of prompts (0–1)", False),
        MetricInfo("perf/step_s", "Step time", "seconds", False),
        MetricInfo("perf/tokens_per_s", "Throughput", "tokens / s", False),
        MetricInfo("staleness/lag_mean", "Mean staleness", "policy versions", False),
        MetricInfo("staleness/lag_max", "Max staleness", "policy versions", False),
    )
}

HEADLINE_KEYS = ("reward/mean", "mismatch/kl", "gate/frac", "mismatch/ratio_max", "grad/norm")
"""The five default panels (docs/metrics.md ★), in display order."""
LOSS_MAGNITUDE_KEY = "|loss|"
"""The loss's magnitude chart: |`loss/total`|, or |`loss/pg`| for a run that logs no loss/total.
Not a metric key: the chart's own name (its lines are the runs' loss metrics)."""
SIGNAL_KEYS = ("policy/entropy", LOSS_MAGNITUDE_KEY, "response/length_mean", "response/truncated_frac")
"""Charts drawn beside the headline charts, each when a run logs what it draws: the signals of
the alert rules beyond the mismatch (entropy running away, the loss growing, answers at the
length cap; docs/alerts.md)."""
HAZARD_TOOLTIP = "collapse hazard: estimated probability that the run collapses within the next 50 steps (once it collapsed, the step it did)"
"""What a table's hazard column holds (50: the horizon GET /runs/{id}/hazard answers)."""
CRITICAL_HAZARD = 0.5
"""A hazard at or above this is drawn in the critical colour (the default threshold of the
`hazard` alert rule)."""


def metric_info(key: str) -> MetricInfo:
    """What we know about a metric; unknown keys get their own name as title, linear axis."""
    return _KNOWN.get(key) or MetricInfo(key, key, key.rsplit("/", 1)[-1], False)


def logged_charts(candidates: Iterable[str], logged: Iterable[str]) -> list[str]:
    """The charts of `candidates` (in their order) that draw something the runs log."""
    keys = set(logged)
    return [chart for chart in candidates if keys.intersection(metric_info(chart).drawn_from)]


def drawn_keys(charts: Iterable[str]) -> set[str]:
    """The metrics these charts draw as they are logged (their lines' and companions' keys; a
    magnitude is not the metric, whose own chart keeps its sign)."""
    drawn: set[str] = set()
    for chart in charts:
        info = metric_info(chart)
        if info.of == "value":
            drawn.update(info.drawn_from)
        if info.companion:
            drawn.add(info.companion)
    return drawn


HEALTHY = {
    "reward/mean": "Healthy: rises, then holds. A fall after the rise is the collapse the charts beside it warn of.",
    "mismatch/kl": "Healthy: low and flat: 1e-5–1e-3 reported for dense models, 1e-3–1e-1 for MoE "
    "(KL healthy band shades it); a stale sampler adds to it. A climb comes before a collapse.",
    "gate/frac": "No published healthy range: read it against the KL. A share that falls while the KL climbs "
    "is not a run healing.",
    "mismatch/ratio_max": "Healthy: near 1 (exactly 1 on-policy) and not climbing. One token with a ratio ≫ 1 "
    "is how importance sampling and PPO blow up.",
    "grad/norm": "Healthy: steady at the run's own level. A sudden many-fold jump, or a NaN/Inf, is a broken update.",
    "mismatch/tail_frac": "Healthy: small and flat. A growing share is the policies disagreeing by a factor of e "
    "or more on more tokens.",
    "policy/entropy": "Healthy: near the dashed learned level, drifting down as the policy sharpens. Climbing to "
    "twice it is the output going uniform.",
    LOSS_MAGNITUDE_KEY: "Healthy: within the magnitudes of its first steps. Growing into the hundreds or "
    "thousands is a run diverging.",
    "response/length_mean": "Healthy: below the dashed cap. Answers growing step after step towards it often come "
    "before a fall.",
    "response/truncated_frac": "Healthy: near 0. A share climbing towards 1 is answers running into the cap.",
}
"""One line under each headline and signal chart: what a healthy run looks like on it
(docs/metrics.md, docs/alerts.md)."""
HAZARD_HEALTHY = (
    f"Healthy: near 0. From {CRITICAL_HAZARD:.0%} (the hazard rule's default threshold) the tables show it red."
)
"""The line under the collapse hazard chart."""

LOSS_CONFIG_KEYS = ("loss", "loss_fn")
"""Run config keys that name the run's loss (Keel's learners write `loss`, some frameworks'
configs `loss_fn`): the first one set."""


def loss_name(config: dict[str, object]) -> str | None:
    """The run's loss as its config names it (a name, not a section of settings), or None."""
    return next((value for key in LOSS_CONFIG_KEYS if isinstance(value := config.get(key), str) and value), None)


KL_KEY = "mismatch/kl"
KL_BANDS = {
    "dense": ("dense model", 1e-5, 1e-3),
    "moe": ("MoE", 1e-3, 1e-1),
}
"""Healthy ranges of the sampler–learner KL (k3, `mismatch/kl`) as the Miles/slime write-up on
training–inference mismatch gives them, by model kind: (label, low, high). The KL chart shades
the one a user picks (layout.chart_controls, "KL healthy band")."""
