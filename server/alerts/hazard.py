"""The collapse hazard: the probability that a run collapses within the next HORIZON steps.

A logistic model on features the server computes incrementally from the metrics a run
logs (constant work and a small JSON state per step, as every detector):

- the reward: how much it has gained since the start, how far it is under its peak and
  its trend, in initial per-sample spreads (RewardGain);
- the sampler–learner mismatch: the level of `mismatch/kl` (else a framework's k1 estimate of
  the same KL, `mismatch/kl_k1`: verl's `rollout_corr/kl`, OpenRLHF's `vllm_kl`), its trend, and how far it and
  the ratio tail have climbed above the level they had once the run learned (the CUSUMs of
  the `climb` detector);
- the ratio tail: the level of log `mismatch/ratio_max` and its persistence (the share of
  recent steps with a ratio above e^2);
- the share of tokens whose coefficient the loss does not bound (`mismatch/unbounded_frac`);
- staleness (`staleness/lag_mean`), the gradient's trend and the ESS;
- the signatures every RL run logs, mismatch or not: the policy's entropy and the loss's
  magnitude, each against the level it had once the run learned (the climbs of the rules
  "entropy running away" and "loss growing", their parameters), and the share of groups
  whose reward has no spread (`reward/zero_std_frac`).

A feature whose metric a run has never logged is taken at its mean on the corpus the model
was fitted on, so it neither raises nor lowers the hazard; one not logged at a step keeps
its last value. The coefficients (MODEL) are fitted by `keel eval-alerts --fit-hazard`
on labelled corpora (docs/alerts.md says which, and how well the hazard is calibrated on
held-out ones). As a rule: detector `hazard`, active while the hazard exceeds `p`.

Nothing here holds a model for the process: whoever computes a hazard is given its
`HazardModel` (the server builds its one in server/components.py, from
`Settings.hazard_model`; `keel eval-alerts --hazard-model` builds its own).
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, overload

from server.alerts.detectors import REWARD_ALPHA, Climb, Detector, RewardGain, Signal, watched
from wire import Row
from wire.labels import SMOOTH_WINDOW, Falls, Scan, falls, resume, smoothed

if TYPE_CHECKING:
    from server.storage import Store

__all__ = [
    "FEATURES", "HORIZON", "INPUTS", "MODEL", "WARMUP", "Course", "Fall", "Hazard", "HazardCache", "HazardModel", "fall_of", "features", "hazard_at",
    "hazard_series", "load_model", "reads",
]  # fmt: skip

HORIZON = 50
"""Steps ahead the hazard speaks about: P(the run collapses in (t, t + HORIZON])."""
WARMUP = 30
"""Steps before a hazard is given (no baseline yet)."""
READS = ("reward/mean", "mismatch/kl", "mismatch/ratio_max", "grad/norm")
"""A step that logs none of these (nor an alternative of ALTERNATIVES) is skipped: it neither
advances nor changes the hazard."""
ALTERNATIVES = {"mismatch/kl": ("mismatch/kl_k1",)}
"""What the hazard reads in place of one of READS that a run does not log: a k1 estimate of the
sampler–learner KL is the same quantity in the same unit (nats), a noisier estimate of it. A
framework's mean |Δ log p| is not a KL, and is not read."""
KL_KEY = "|".join(("mismatch/kl", *ALTERNATIVES["mismatch/kl"]))
"""The KL features' metric: the first of these a run logs (`watched`), kept for the run."""
_READ_KEYS = frozenset(READS).union(*ALTERNATIVES.values())
INPUTS = (
    *READS, *ALTERNATIVES["mismatch/kl"], "reward/std", "mismatch/unbounded_frac", "staleness/lag_mean", "mismatch/ess_frac",
    "mismatch/tail_frac", "mismatch/low_tail_frac", "mismatch/log_ratio_abs_unlikely",
    "policy/entropy", "loss/total", "loss/pg", "reward/zero_std_frac",
)  # fmt: skip
"""Every metric the features read: the hazard of a run depends on these points only."""
GAIN_CAP = 4.0
"""The reward's gain saturates here (initial spreads): past it a run has learned enough to
lose, and a larger gain says nothing more about a collapse."""
TAIL_LOG_RATIO = 2.0
"""A step's ratio tail counts as large when log(ratio_max) exceeds this (r > 7.4)."""

FEATURES = (
    "gain", "drawdown", "reward_trend", "log_kl", "kl_trend", "kl_climb", "tail_climb",
    "log_ratio_max", "tail_persistence", "unbounded_frac", "staleness", "grad_trend", "ess_loss",
    "kl_rise", "tail_rise", "tail_mass", "low_tail", "unlikely_mismatch",
    "entropy_rise", "entropy_climb", "loss_rise", "loss_climb", "zero_spread",
)  # fmt: skip
TAIL_FLOOR = 1e-4
"""Tail shares below this count as this (log10 of the share is the feature)."""

_FAST, _SLOW = 0.3, 0.03
_CLIMB = {"warmup": 50, "k": 1.0, "h": 1e9, "z_cap": 8.0, "min_scale": 0.05, "floor": 1e-12, "after_gain": 2.5}
_KL_CLIMB = Climb(KL_KEY, _CLIMB)
_TAIL_CLIMB = Climb("mismatch/ratio_max", _CLIMB)
# The signature rules' climbs (server/alerts/catalog.py), never firing: their CUSUM and level.
_ENTROPY_CLIMB = Climb("policy/entropy", {**_CLIMB, "k": 2.0, "min_scale": 0.35, "adapt": 0.02, "floor": 0.2})
_LOSS_CLIMB = Climb("loss/total|loss/pg", {**_CLIMB, "k": 2.0, "of": "magnitude", "floor": 0.01, "min_scale": 0.5})


def _finite(values: Mapping[str, float], key: str) -> float | None:
    value = values.get(key)
    return value if value is not None and math.isfinite(value) else None


def _ewma(state: dict[str, Any], key: str, x: float, alpha: float) -> float:
    state[key] = x if key not in state else (1 - alpha) * state[key] + alpha * x
    return float(state[key])


def _clip(x: float, low: float, high: float) -> float:
    return low if math.isnan(x) else min(high, max(low, x))


def features(state: dict[str, Any], values: Mapping[str, float]) -> list[float | None]:
    """Update `state` with one step's values; the feature vector after it (FEATURES' order).
    None: the run has never logged the metric a feature needs."""
    f = state.setdefault("f", {})
    RewardGain.update(state, values, "reward/mean", "reward/std", REWARD_ALPHA)
    out: dict[str, float | None] = dict.fromkeys(FEATURES)
    gained = RewardGain.gained(state)
    if gained is not None:
        spread = gained[1] if gained[1] > 0 else 1.0
        reward = _finite(values, "reward/mean")
        slow = _ewma(f, "reward_slow", reward, _SLOW) if reward is not None else f.get("reward_slow", state["reward_smooth"])
        out["gain"] = _clip(gained[0] / spread, -5, GAIN_CAP)
        out["drawdown"] = _clip((state["reward_peak"] - state["reward_smooth"]) / spread, 0, 10)
        out["reward_trend"] = _clip((state["reward_smooth"] - slow) / spread, -5, 5)
    kl_key = watched(state.setdefault("kl_climb", {}), KL_KEY, values)  # the KL climb's own choice, below
    kl = None if kl_key is None else values.get(kl_key)
    if kl is not None and not math.isnan(kl):
        log_kl = math.log10(max(kl, 1e-6)) if math.isfinite(kl) else 3.0
        out["log_kl"] = _clip(_ewma(f, "kl_fast", log_kl, _FAST), -6, 3)
        out["kl_trend"] = _clip(log_kl - _ewma(f, "kl_slow", log_kl, _SLOW), -5, 5)
    for name, climb in (("kl_climb", _KL_CLIMB), ("tail_climb", _TAIL_CLIMB)):
        if climb.observe(state.setdefault(name, {}), state, values) is not None:
            out[name] = _clip(state[name].get("cusum", 0.0) / 20, 0, 10)
    ratio = values.get("mismatch/ratio_max")
    if ratio is not None and not math.isnan(ratio):
        log_ratio = math.log(max(ratio, 1e-12)) if math.isfinite(ratio) else 50.0
        out["log_ratio_max"] = _clip(_ewma(f, "log_ratio", log_ratio, _FAST), -5, 50) / 10
        out["tail_persistence"] = _ewma(f, "tail", float(log_ratio > TAIL_LOG_RATIO), _SLOW)
    unbounded = _finite(values, "mismatch/unbounded_frac")
    if unbounded is not None:
        out["unbounded_frac"] = _clip(100 * _ewma(f, "unbounded", unbounded, _FAST), 0, 100)
    staleness = _finite(values, "staleness/lag_mean")
    if staleness is not None:
        out["staleness"] = math.log1p(max(0.0, _ewma(f, "staleness", staleness, _FAST)))
    grad = values.get("grad/norm")
    if grad is not None and not math.isnan(grad) and grad > 0:
        log_grad = math.log(grad) if math.isfinite(grad) else 700.0
        out["grad_trend"] = _clip(_ewma(f, "grad_fast", log_grad, _FAST) - _ewma(f, "grad_slow", log_grad, _SLOW), -5, 5)
    ess = _finite(values, "mismatch/ess_frac")
    if ess is not None:
        out["ess_loss"] = _clip(1 - _ewma(f, "ess", ess, _FAST), 0, 1)
    # The level above the one the run had once it learned, per run (the climbs' frozen medians).
    # (kl_fast is log10 KL, log_ratio ln ratio_max: to nats, then the rise in decades)
    for name, climbed, level, to_nats in (("kl_rise", "kl_climb", "kl_fast", math.log(10)), ("tail_rise", "tail_climb", "log_ratio", 1.0)):
        median = state.get(climbed, {}).get("median")
        if median is not None and level in f:
            out[name] = _clip((f[level] * to_nats - median) / math.log(10), -5, 10)
    for name, key in (("tail_mass", "mismatch/tail_frac"), ("low_tail", "mismatch/low_tail_frac")):
        share = _finite(values, key)
        if share is not None:
            out[name] = math.log10(max(_ewma(f, name, share, _FAST), TAIL_FLOOR))
    unlikely = _finite(values, "mismatch/log_ratio_abs_unlikely")
    if unlikely is not None:
        out["unlikely_mismatch"] = _clip(math.log10(max(_ewma(f, "unlikely", unlikely, _FAST), 1e-6)), -6, 2)
    # Entropy and |loss| above the level they had once the run learned (the climbs' medians,
    # natural logs of the floored values): in decades, from their fast EWMAs.
    for name, climb in (("entropy", _ENTROPY_CLIMB), ("loss", _LOSS_CLIMB)):
        track = state.setdefault(f"{name}_climb", {})
        if climb.observe(track, state, values) is None:
            continue
        key = track.get("key")
        value = None if key is None else values.get(key)
        if value is None or math.isnan(value) or (value == 0.0 and climb.params["of"] == "magnitude"):
            continue  # as the climb: no value, or a loss of exactly 0 (no advantage), carries no level
        log_value = min(math.log(max(abs(value), climb.params["floor"])), 700.0) if math.isfinite(value) else 700.0
        now = _ewma(f, name, log_value, _FAST)
        out[f"{name}_climb"] = _clip(track.get("cusum", 0.0) / 20, 0, 10)
        if "median" in track:
            out[f"{name}_rise"] = _clip((now - track["median"]) / math.log(10), -5, 10)
    zero = _finite(values, "reward/zero_std_frac")
    if zero is not None:
        out["zero_spread"] = _clip(_ewma(f, "zero_spread", zero, _FAST), 0, 1)
    last = state.setdefault("last", {})
    for name in FEATURES:  # a metric not logged at this step keeps its last value
        if out[name] is None:
            out[name] = last.get(name)
        else:
            last[name] = out[name]
    state["n"] = state.get("n", 0) + 1
    return [out[name] for name in FEATURES]


class HazardModel:
    """A fitted model over FEATURES, from its JSON (`keel eval-alerts --fit-hazard`):

    - `"kind": "logistic"` (the default): weights on standardised features and an intercept;
      a feature that is None (never logged) is taken at its mean: it says nothing;
    - `"kind": "trees"`: gradient-boosted regression trees on the log-odds, each node
      `[feature, threshold, missing_left, left, right, value]` (a leaf: `[-1, 0, 0, 0, 0, value]`);
      x <= threshold goes left, a None feature goes where the fit sent missing values.

    Evaluation is pure Python and constant per step (trees × depth comparisons).
    """

    def __init__(self, model: Mapping[str, Any]):
        fitted = list(model["features"])
        if fitted != list(FEATURES[: len(fitted)]):
            raise ValueError(
                f"the hazard model's features {fitted} are not {list(FEATURES)}: "
                "refit it with keel eval-alerts --fit-hazard"
            )
        # A model fitted before features were added still reads: the new ones weigh nothing.
        added = len(FEATURES) - len(fitted)
        self.kind = str(model.get("kind", "logistic"))
        needs = {"logistic": ("horizon", "intercept", "weights", "means", "scales"), "trees": ("horizon", "intercept", "trees")}
        lacking = [key for key in needs.get(self.kind, ()) if key not in model]
        if lacking:
            raise ValueError(f"the hazard model has no {', '.join(lacking)}: refit it with keel eval-alerts --fit-hazard")
        self.horizon = int(model["horizon"])
        self.intercept = float(model["intercept"])
        if self.kind == "logistic":
            self.weights = [float(w) for w in model["weights"]] + [0.0] * added
            self.means = [float(m) for m in model["means"]] + [0.0] * added
            self.scales = [float(s) if s > 0 else 1.0 for s in model["scales"]] + [1.0] * added
            self.trees: list[list[tuple[int, float, bool, int, int, float]]] = []
        elif self.kind == "trees":
            self.weights, self.means, self.scales = [], [], []
            self.trees = [
                [(int(n[0]), float(n[1]), bool(n[2]), int(n[3]), int(n[4]), float(n[5])) for n in tree]
                for tree in model["trees"]
            ]
        else:
            raise ValueError(f"unknown hazard model kind {self.kind!r}: logistic or trees")

    def log_odds(self, x: Sequence[float | None]) -> tuple[float, list[float]]:
        """The model's log-odds at `x`, and each feature's share of it (for a logistic model,
        its term; for trees, the value changes along each tree's path at its splits)."""
        if self.kind == "logistic":
            terms = [0.0 if v is None else w * (v - m) / s for w, v, m, s in zip(self.weights, x, self.means, self.scales, strict=True)]
            return self.intercept + sum(terms), terms
        shares = [0.0] * len(FEATURES)
        z = self.intercept
        for tree in self.trees:
            node = tree[0]
            while node[0] >= 0:
                value = x[node[0]]
                child = tree[node[3] if (node[2] if value is None or math.isnan(value) else value <= node[1]) else node[4]]
                shares[node[0]] += child[5] - node[5]
                node = child
            z += node[5]
        return z, shares

    def probability(self, x: Sequence[float | None]) -> float:
        return _sigmoid(self.log_odds(x)[0])


def _sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z)) if z > -700 else 0.0


MODEL: dict[str, Any] = {
    "horizon": 50,
    "features": list(FEATURES),
    "fitted_on": "keel lm-corpus --seeds 100-111 (120 real-learner runs, 17 collapses) and the toy grid of "
    "keel eval-alerts --seeds 0,1,2 (288 runs, 27 collapses)",
    "intercept": -7.480397,
    "weights": [3.803116, 0.50348, 0.026274, 2.248362, 0.014895, 0.098523, -0.572592, 0.805608, -0.674102, -1.348335, 0.089101, 0.34493, -0.026586, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    "means": [3.364657, 0.090588, 0.391829, -1.9673, 0.02688, 0.057879, 1.421796, 0.165429, 0.357065, 4.454846, 1.809249, -0.119968, 0.147275, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    "scales": [1.199669, 0.201324, 0.734219, 1.469624, 0.528372, 0.484908, 3.313506, 0.107649, 0.315281, 2.262918, 0.303666, 0.470008, 0.185666, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
}
"""Written by `keel eval-alerts --fit-hazard` (docs/alerts.md, "Collapse hazard")."""


def load_model(path: str | Path | None) -> HazardModel:
    """The model fitted into this file (`keel eval-alerts --fit-hazard`), or the built-in one
    (MODEL) with no file; ValueError for a file that is not a model of these FEATURES."""
    if path is None:
        return HazardModel(MODEL)
    with open(path, encoding="utf-8") as handle:
        return HazardModel(json.load(handle))


def hazard_series(rows: Sequence[Mapping[str, float]], model: HazardModel) -> list[float | None]:
    """The hazard at every step of a run's rows (None before WARMUP steps)."""
    state: dict[str, Any] = {}
    # As the detector: a step without any of READS is not a step of the hazard.
    return [hazard_at(state, values, model) for values in rows]


@dataclass(frozen=True)
class Fall:
    """What the reward did, by the corpora's collapse label (wire/labels.py) on its trailing
    mean: once it fell, the hazard (a collapse *ahead*) no longer speaks of the run."""

    collapsed_at: int | None = None
    """The first step of a fall that lasted (no regain within WITHIN steps)."""
    falling_since: int | None = None
    """The first step of a fall not judged yet (fewer than WITHIN steps after it, no regain)."""
    dips: tuple[int, ...] = ()
    """First steps of the falls that regained."""


@dataclass(frozen=True)
class Course:
    """A run's hazard so far (HazardCache.so_far), with what the page needs to read it."""

    steps: list[int]
    hazard: list[float]
    label: Fall
    """What the reward did (Course.fall)."""
    logged: frozenset[str]
    """Which of INPUTS the run has logged."""

    def fall(self) -> Fall:
        """The reward's falls, labelled as the corpora are (`fall_of` of its finite reward/mean)."""
        return self.label

    def missing(self) -> list[str]:
        """The metrics the hazard reads most (READS) that the run has never logged: their
        features sit at the fitted corpus' mean, neither raising nor lowering it."""
        return [key for key in READS if key not in self.logged and not any(alt in self.logged for alt in ALTERNATIVES.get(key, ()))]


def _span(low: float, high: float) -> tuple[float, float]:
    """The range a reward is labelled on: the label's 0.5 reach and 0.2 drop are of a 0-1
    reward, so one that left [0, 1] is read on the range it covered."""
    return (low, high) if (low < 0.0 or high > 1.0) and high > low else (0.0, 1.0)


def _scale(value: float, span: tuple[float, float]) -> float:
    return value if span == (0.0, 1.0) else (value - span[0]) / (span[1] - span[0])


def fall_of(steps: Sequence[int], rewards: Sequence[float]) -> Fall:
    """The label of a reward logged at `steps`, read at once: what `_Rewards` keeps up to date."""
    span = _span(min(rewards, default=0.0), max(rewards, default=1.0))
    found = falls([_scale(value, span) for value in smoothed(rewards)])
    return _fall(found, steps)


def _fall(found: Falls, steps: Sequence[int]) -> Fall:
    return Fall(
        collapsed_at=None if found.collapse is None else steps[found.collapse],
        falling_since=None if found.unjudged is None else steps[found.unjudged],
        dips=tuple(steps[index] for index in found.dips),
    )


class _Plus(Sequence[float]):
    """`head` and one value after it, without copying `head` (the run's newest reward)."""

    def __init__(self, head: list[float], tail: float):
        self.head, self.tail = head, tail

    def __len__(self) -> int:
        return len(self.head) + 1

    @overload
    def __getitem__(self, index: int) -> float: ...
    @overload
    def __getitem__(self, index: slice) -> list[float]: ...
    def __getitem__(self, index: int | slice) -> float | list[float]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        return self.tail if index in (len(self.head), -1) else self.head[index]


@dataclass
class _Rewards:
    """A run's finite reward/mean by step and its label so far: the smoothing and the scan
    go on from where the last read stopped, so a run read every few seconds costs its new
    steps, not its history (unless the reward leaves the range it was read on: then all)."""

    steps: list[int] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)
    smooth: list[float] = field(default_factory=list)
    """`smoothed(raw)`, as the label reads it."""
    total: float = 0.0
    """The trailing window's sum after `raw` (smoothed's own running sum)."""
    low: float = math.inf
    high: float = -math.inf
    span: tuple[float, float] = (0.0, 1.0)
    """`_span(low, high)` of `raw`."""
    scaled: list[float] = field(default_factory=list)
    """`smooth` read on `span`."""
    scan: Scan = Scan()
    """How far the label read `scaled`."""

    def _next(self, reward: float) -> tuple[float, float]:
        """The running sum and the smoothed value once `reward` follows `raw` (as smoothed())."""
        n = len(self.raw)
        total = self.total + reward - (self.raw[n - SMOOTH_WINDOW] if n >= SMOOTH_WINDOW else 0.0)
        return total, total / min(n + 1, SMOOTH_WINDOW)

    def add(self, step: int, reward: float) -> None:
        self.total, value = self._next(reward)
        self.steps.append(step)
        self.raw.append(reward)
        self.smooth.append(value)
        self.low, self.high = min(self.low, reward), max(self.high, reward)
        span = _span(self.low, self.high)
        if span != self.span:
            self.span, self.scan = span, Scan()
            self.scaled = [_scale(v, span) for v in self.smooth]
        else:
            self.scaled.append(_scale(value, span))

    def fall(self, newest: tuple[int, float] | None) -> Fall:
        """The label of the rewards kept and then `newest` (the run's newest step and reward,
        which may still change): the scan of the kept ones is kept, the newest's is not."""
        found, self.scan = resume(self.scan, self.scaled)
        if newest is None:
            return _fall(found, self.steps)
        step, reward = newest
        _, value = self._next(reward)
        span = _span(min(self.low, reward), max(self.high, reward))
        if span == self.span:
            found, _ = resume(self.scan, _Plus(self.scaled, _scale(value, span)))
        else:
            found, _ = resume(Scan(), [_scale(v, span) for v in [*self.smooth, value]])
        return _fall(found, _Plus(self.steps, step))  # type: ignore[arg-type]


@dataclass
class _Track:
    state: dict[str, Any] = field(default_factory=dict)
    """The features' state after `through`."""
    through: int = -1
    steps: list[int] = field(default_factory=list)
    hazard: list[float] = field(default_factory=list)
    rewards: _Rewards = field(default_factory=_Rewards)
    logged: set[str] = field(default_factory=set)

    def note(self, row: Row) -> None:
        """Keep what Course reads of a row (its reward, which inputs it logs)."""
        self.logged.update(key for key in INPUTS if key in row.values)
        reward = _reward(row)
        if reward is not None:
            self.rewards.add(row.step, reward)


def _reward(row: Row) -> float | None:
    reward = row.values.get("reward/mean")
    return reward if reward is not None and math.isfinite(reward) else None


class HazardCache:
    """Each run's hazard series under `model` as far as it was read, extended by the rows
    stored after it, so a page that redraws the hazard every few seconds costs the new steps only.

    A run's newest step may still get values (a step split over frames), so it is computed
    on a copy of the state and read again next time; the steps before it are kept. A run
    deleted and created again (another `started_at`) starts afresh.
    """

    def __init__(self, model: HazardModel, runs: int = 512):
        self.model = model
        """The one model of every hazard this cache answers (its horizon is theirs)."""
        self.runs = runs
        self.lock = asyncio.Lock()
        """Held from `after` to `extend`: two reads of one run must not both add its rows."""
        self._tracks: OrderedDict[tuple[str, float], _Track] = OrderedDict()

    async def so_far(self, store: Store, run_id: str, started_at: float) -> Course:
        """The run's hazard past the warm-up (and what reads it), from what is kept extended by
        the rows stored since (the whole history on a run's first read only)."""
        async with self.lock:
            rows: list[Row] = []
            after = self.after(run_id, started_at)
            while page := await store.rows(run_id, after=after, before=2**62, keys=INPUTS):
                rows.extend(page)
                after = page[-1].step
            return await asyncio.to_thread(self.extend, run_id, started_at, rows)

    def after(self, run_id: str, started_at: float) -> int:
        """The last step already kept for this run (-1: none): read the rows after it."""
        track = self._tracks.get((run_id, started_at))
        return track.through if track is not None else -1

    def extend(self, run_id: str, started_at: float, rows: Sequence[Row]) -> Course:
        """The run's hazard past the warm-up, `rows` (in step order, after `after()`) added."""
        key = (run_id, started_at)
        track = self._tracks.pop(key, None) or _Track()
        self._tracks[key] = track
        while len(self._tracks) > self.runs:
            self._tracks.popitem(last=False)
        kept, newest = (rows[:-1], rows[-1:]) if rows else ([], [])
        for row in kept:
            value = hazard_at(track.state, row.values, self.model)
            track.through = row.step
            track.note(row)
            if value is not None:
                track.steps.append(row.step)
                track.hazard.append(value)
        steps, hazard = track.steps, track.hazard
        logged = set(track.logged)
        last: tuple[int, float] | None = None
        for row in newest:
            logged.update(key for key in INPUTS if key in row.values)
            last = None if (reward := _reward(row)) is None else (row.step, reward)
            value = hazard_at(copy.deepcopy(track.state), row.values, self.model)
            if value is not None:
                steps, hazard = [*steps, row.step], [*hazard, value]
        return Course(steps, hazard, track.rewards.fall(last), frozenset(logged))


def hazard_at(state: dict[str, Any], values: Mapping[str, float], model: HazardModel) -> float | None:
    """The hazard after one more step of a run (`state` carries the features over): None for
    a step that is not one of the hazard's (`reads`) or inside the warm-up."""
    if not reads(values):
        return None
    x = features(state, values)
    return model.probability(x) if state["n"] > WARMUP else None


def reads(values: Mapping[str, float]) -> bool:
    """Does this step log anything the hazard reads (the reward, the mismatch, the gradient)?"""
    return any(key in values for key in _READ_KEYS)


class Hazard(Detector):
    """Active while the collapse hazard (the probability of a collapse within HORIZON steps)
    under `model` is above `p`. The rule's metric is ignored: the hazard reads the metrics it
    needs. Built without a model it only checks its parameters (a rule being validated)."""

    kind = "hazard"
    defaults: ClassVar[dict[str, Any]] = {"p": 0.5}

    def __init__(self, metric: str, params: Mapping[str, Any] | None = None, model: HazardModel | None = None):
        self.model = model
        super().__init__(metric, params)

    def validate(self) -> None:
        p = self.params["p"]
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p < 1:
            raise ValueError("parameter 'p' must be a probability strictly between 0 and 1")

    def update(self, state: dict[str, Any], step: int, values: Mapping[str, float]) -> Signal | None:
        if self.model is None:
            raise RuntimeError("this hazard detector was built to check its parameters only: give build_detector a hazard_model")
        if not reads(values):
            return None
        x = features(state, values)
        if state["n"] <= WARMUP:
            return Signal(False, 0.0, "warming up")
        z, shares = self.model.log_odds(x)
        hazard = _sigmoid(z)
        if hazard <= self.params["p"]:
            return Signal(False, hazard, f"collapse hazard {hazard:.0%}")
        top = sorted(((share, name) for share, v, name in zip(shares, x, FEATURES, strict=True) if v is not None), reverse=True)[:3]
        why = ", ".join(f"{name} {x[FEATURES.index(name)]:.3g}" for _, name in top)
        return Signal(True, hazard, f"collapse hazard {hazard:.0%} within {self.model.horizon} steps (> {self.params['p']:g}); most: {why}")
