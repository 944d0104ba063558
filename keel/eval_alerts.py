"""`keel eval-alerts`: score the alert rules on a labelled corpus: a backtest plus labels.

A corpus is a list of runs, each with its config, its per-step series and a
collapse label: the toy grid (learners.toy) built on the spot, or a JSON file
(`--corpus`: one saved with `--save-corpus`, or the real-learner corpus of
`keel lm-grid --json`, or a folder of `keel lm-regimes`). A run *collapses* when its
reward reached >= 0.5, later fell >= 0.2 below its running peak and did not regain
within 0.1 of that peak in the next 100 steps (wire.labels); the collapse step is
the first step of that fall. A fall that regains is a *dip*. The real learner's
reward is labelled on its 10-step trailing mean.

Every run goes through `server.alerts.backtest` (the engine's own detectors and
lifecycle, in-process), and each rule's firing steps are scored (docs/alerts.md,
"How good are the critical alerts?"):

- a collapse at step c >= MIN_HISTORY is a *hit* when the rule fired in
  [c - WINDOW, c); lead = c - the first such firing; recall and the median lead
  are over these collapses only;
- a firing before c - WINDOW on a collapsing run is an *early false alarm* (the
  run was healthy then);
- a stable run with any firing is a *false alarm*, counted apart for losses
  that bound their coefficient and for those that do not (UNBOUNDED_LOSSES),
  and as firings per 1,000 stable run-steps;
- a collapse before MIN_HISTORY has no history to learn a baseline from: it is
  reported apart ("no history") and left out of recall and lead;
- firings from WINDOW steps before a dip to DIP_AFTER steps after it count neither
  as hits nor as false alarms; dips are counted apart, with how many a rule fired on.

A stable run is scored until AFTERMATH steps before its end (`scored_until`), so what
followed every firing counted as a false alarm is known: AFTERMATH steps without a
collapse. A collapsing run is scored up to its collapse, wherever it comes. PPO is scored on its own beside the
union (its negative-advantage hole makes it the loss that collapses most).
rlwatch's default detectors are fed the same series in the same invocation.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from server.alerts.backtest import backtest
from server.alerts.catalog import DEFAULT_RULES, RuleSpec
from server.alerts.hazard import HazardModel
from wire import Row
from wire.labels import SMOOTH_WINDOW, collapse_step, falls, smoothed

__all__ = [
    "CorpusRun",
    "Score",
    "build_corpus",
    "collapse_step",
    "evaluate",
    "format_scores",
    "hazard_rule",
    "load_corpus",
    "load_real_runs",
    "rule_firings",
    "save_corpus",
    "score",
]

WINDOW = 150
"""A firing counts for a collapse when it comes at most this many steps before it."""
MIN_HISTORY = 50
"""A collapse before this step is scored apart: no detector can have a baseline by then."""
AFTERMATH = 150
"""The last steps of a run that never collapsed are not scored: a firing there cannot be
judged, since the run might have collapsed just after its end; a firing before them is a
false alarm, because the run went on at least AFTERMATH steps without collapsing. A run that
collapses, in those last steps too, is scored up to its collapse."""
UNBOUNDED_LOSSES = frozenset({"importance_sampling", "ppo", "dro", "gspo", "flash_reinforce"})
"""Losses whose per-token coefficient is not bounded (docs/losses.md): the ratio itself
(IS), PPO's and GSPO's negative-advantage hole, DRO's −β·ℓ, FlashREINFORCE's sg(r)."""
DIP_AFTER = 100
"""Firings up to this many steps after a dip (and WINDOW before it) are not judged."""
WARNING_RULE = "mismatch climbing"
HAZARD_RULE = "collapse hazard"
REPLAYED_KEYS = (
    "reward/mean", "reward/std", "mismatch/kl", "mismatch/ratio_max", "mismatch/ess_frac",
    "gate/frac", "grad/norm", "loss/total", "policy/entropy",
)


def _near_dip(dip: int, step: int) -> bool:
    """Is `step` in the window of the dip at `dip` (WINDOW before it to DIP_AFTER after)?"""
    return dip - WINDOW <= step < dip + DIP_AFTER


@dataclass
class CorpusRun:
    name: str
    config: dict[str, Any]
    series: dict[str, list[float]]
    collapse_step: int | None
    dips: list[int] = field(default_factory=list)
    """Falls that regained (or, at the end, could not be judged): wire.labels."""

    @classmethod
    def labelled(cls, name: str, config: dict[str, Any], series: dict[str, list[float]], smooth: int = 1) -> CorpusRun:
        """A run labelled from its reward (its `smooth`-step trailing mean)."""
        rewards = series.get("reward/mean", [])
        fall = falls(smoothed(rewards, smooth) if smooth > 1 else rewards)
        dips = [*fall.dips, *([] if fall.unjudged is None else [fall.unjudged])]
        return cls(name, config, series, fall.collapse, dips)

    def judged(self, step: int) -> bool:
        """Is a firing at `step` judged (not within a dip's window)?"""
        return not any(_near_dip(dip, step) for dip in self.dips)

    @property
    def steps(self) -> int:
        return len(self.series.get("reward/mean", []))

    @property
    def scored_until(self) -> int:
        """A stable run's firings are scored before this step (AFTERMATH steps before its end)."""
        return max(0, self.steps - AFTERMATH)

    @property
    def ppo(self) -> bool:
        return str(self.config.get("loss")) == "ppo"

    @property
    def unbounded(self) -> bool:
        return str(self.config.get("loss")) in UNBOUNDED_LOSSES

    def rows(self) -> list[Row]:
        length = max((len(values) for values in self.series.values()), default=0)
        return [
            Row(step=step, time=None, values={key: values[step] for key, values in self.series.items() if step < len(values) and values[step] is not None})
            for step in range(length)
        ]


@dataclass
class Score:
    detector: str
    collapsing: int
    """Collapses with history (at step >= MIN_HISTORY)."""
    hits: int
    recall: float
    median_lead: float | None
    early_false_alarms: int
    """Collapsing runs with a firing before their window."""
    no_history: int
    no_history_fired: int
    """Collapses before MIN_HISTORY, and how many of them had a firing before the collapse."""
    stable_bounded: int
    false_alarms_bounded: int
    stable_unbounded: int
    false_alarms_unbounded: int
    unbounded_rate_with_early: float
    """(stable unbounded runs with a firing + unbounded collapsing runs with an early one) /
    (stable unbounded runs + unbounded collapsing runs)."""
    firings_per_1k_stable_steps: float
    firings_before_history: int
    """Firings at a step < MIN_HISTORY on any run (a detector without a baseline)."""
    leads: list[int] = field(default_factory=list)
    leads_at_bound: int = 0
    """Hits whose lead is at least the physical bound of a one-update collapse, lag - 1 steps
    (at least 1), out of `hits_with_lag` (the hits on runs whose config gives their lag)."""
    hits_with_lag: int = 0
    dips: int = 0
    """Falls that regained (or could not be judged): their windows are not scored."""
    dips_fired: int = 0
    """Dips with a firing from WINDOW steps before to DIP_AFTER after them."""

    @property
    def fa_bounded_rate(self) -> float:
        return self.false_alarms_bounded / self.stable_bounded if self.stable_bounded else math.nan

    @property
    def fa_unbounded_rate(self) -> float:
        return self.false_alarms_unbounded / self.stable_unbounded if self.stable_unbounded else math.nan


def _mismatch_level(name: str) -> str:
    """A level of learners.toy, or "SIGMA/FRACTION" (e.g. 0.15/0.01), registered under that name."""
    from learners.toy import MISMATCH_LEVELS, MismatchLevel

    if name not in MISMATCH_LEVELS:
        try:
            sigma, fraction = (float(part) for part in name.split("/"))
        except ValueError:
            raise ValueError(f"mismatch {name!r}: one of {sorted(MISMATCH_LEVELS)} or SIGMA/FRACTION") from None
        MISMATCH_LEVELS[name] = MismatchLevel(sigma, fraction)
    return name


def build_corpus(losses: Sequence[str], lags: Sequence[int], mismatches: Sequence[str], seeds: Sequence[int], steps: int, device: str) -> list[CorpusRun]:
    from learners.toy import ToyConfig, grid_specs, simulate

    levels = [_mismatch_level(name) for name in mismatches]
    specs = grid_specs(losses=losses, lags=lags, mismatches=levels, seeds=seeds)
    result = simulate(specs, ToyConfig(steps=steps), device=device, keep_history=True)
    assert result.history is not None
    history = {key: result.history[key].cpu().tolist() for key in REPLAYED_KEYS if key in result.history}
    corpus = []
    for index, spec in enumerate(specs):
        series = {key: values[index] for key, values in history.items()}
        config = {"loss": spec.loss, "lag": spec.lag, "mismatch": spec.mismatch, "seed": spec.seed}
        corpus.append(CorpusRun.labelled(spec.name, config, series))
    return corpus


def load_real_runs(folder: str, split: str | None = None) -> list[CorpusRun]:
    """The public logs of real runs in `folder` (corpora/real): its `runs.json` lists each
    file (a history export with a `_step` column, names as the framework logged them), its
    framework, its outcome as judged from the data and the source, and its split. Names go
    through the framework's map as `keel import` maps them (a run's own `names` first, for
    hand-written loops); the label is the manifest's (`collapse_step`), since real rewards
    have no common scale for the reach-and-drop label. A run's steps are its logged rows (a
    log every 10 steps gives one row per 10 steps: leads are in rows). Only `split` ("tune",
    "score") if given."""
    import csv
    import os

    from trainer_hooks.integrations.names import MAPS

    with open(os.path.join(folder, "runs.json"), encoding="utf-8") as handle:
        manifest = json.load(handle)
    corpus = []
    for entry in manifest:
        if split is not None and entry.get("split") != split:
            continue
        name_map = MAPS.get(entry.get("framework", ""))
        own = entry.get("names") or {}
        columns: dict[str, dict[int, float]] = {}
        with open(os.path.join(folder, entry["file"]), encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle)
            header = set(reader.fieldnames or ())
            for row in reader:
                step = int(float(row["_step"]))
                for column, cell in row.items():
                    if column == "_step" or cell in ("", None):
                        continue
                    key = own.get(column) or (name_map.keel_name(column, header) if name_map else column)
                    try:
                        columns.setdefault(key, {})[step] = float(cell)
                    except ValueError:
                        continue
        # One row per logged step (a log every 10 steps is 10 steps apart, not 9 empty rows);
        # a metric not logged at a row is None there (no point), a logged NaN stays NaN.
        steps = sorted({step for values in columns.values() for step in values})
        first = steps[0]
        series: dict[str, list[Any]] = {key: [values.get(step) for step in steps] for key, values in columns.items()}
        algorithm = str(entry.get("algorithm", "")).lower()
        config: dict[str, Any] = {"loss": "ppo" if "ppo" in algorithm or "grpo" in algorithm else algorithm, "source": f"{entry['repo']}@{entry['commit'][:7]}"}
        collapse = entry.get("collapse_step")
        at = None if collapse is None else next((row for row, step in enumerate(steps) if step >= int(collapse)), len(steps))
        config["steps"] = [first, steps[-1]]
        corpus.append(CorpusRun(entry["file"], config, series, at))
    return corpus


def load_corpus(path: str) -> list[CorpusRun]:
    """A corpus file ({"runs": [{name, config (or lm-grid's spec), series}]}), a folder of
    `keel lm-regimes` run files, or a folder of real runs' logs with a `runs.json`
    (`load_real_runs`). Labels are taken from the series (a stored label is not used):
    real-learner runs (a config with `digits`) on the 10-step trailing mean."""
    import os

    if os.path.isdir(path) and os.path.exists(os.path.join(path, "runs.json")):
        return load_real_runs(path)
    if os.path.isdir(path):
        from learners.lm.runfiles import read_dir

        runs: list[dict[str, Any]] = list(read_dir(path))
    else:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        runs = data["runs"] if isinstance(data, dict) else data
    corpus = []
    for run in runs:
        series = {key: [math.nan if v is None else float(v) for v in values] for key, values in run["series"].items()}
        config = dict(run.get("config") or run.get("spec") or {})
        corpus.append(CorpusRun.labelled(run["name"], config, series, SMOOTH_WINDOW if "digits" in config else 1))
    return corpus


def save_corpus(corpus: Sequence[CorpusRun], path: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"runs": [asdict(run) for run in corpus]}, handle)


# -- firings ---------------------------------------------------------------------------


def rule_firings(
    corpus: Sequence[CorpusRun], rules: Sequence[RuleSpec], *, hazard_model: HazardModel | None = None
) -> dict[str, list[list[int]]]:
    """Per rule name, per run: the steps where the rule fired (the backtest of every run;
    hazard rules under `hazard_model`, which only rules without one may leave out)."""
    out: dict[str, list[list[int]]] = {rule.name: [] for rule in rules}
    for run in corpus:
        for result in backtest(rules, run.rows(), hazard_model=hazard_model):
            out[result.rule.name].append(result.fired_steps)
    return out


def critical_firings(
    corpus: Sequence[CorpusRun], rules: Sequence[RuleSpec], *, hazard_model: HazardModel | None = None
) -> tuple[list[list[int]], dict[str, list[list[int]]]]:
    """The union of the critical rules' firing steps per run, and every rule's own."""
    per_rule = rule_firings(corpus, rules, hazard_model=hazard_model)
    critical = [rule.name for rule in rules if rule.severity == "critical"]
    union = [sorted({step for name in critical for step in per_rule[name][index]}) for index in range(len(corpus))]
    return union, per_rule


def rlwatch_firings(corpus: Sequence[CorpusRun]) -> list[list[int]] | None:
    """Steps where rlwatch's default detectors raised a critical alert, per run (None: not installed)."""
    try:
        from rlwatch.config import RLWatchConfig
        from rlwatch.detectors import DetectorSuite
    except ImportError:
        return None
    out: list[list[int]] = []
    for run in corpus:
        suite = DetectorSuite(RLWatchConfig())
        s = run.series

        def at(key: str, step: int, s=s) -> float | None:
            # a run logs what it logs: rlwatch's detectors skip a metric given as None
            return s[key][step] if key in s else None

        fired = []
        for step in range(run.steps):
            alerts = suite.check_step(
                step,
                entropy=at("policy/entropy", step),
                kl_divergence=at("mismatch/kl", step),
                reward_mean=at("reward/mean", step),
                reward_std=at("reward/std", step),
                loss=at("loss/total", step),
                grad_norm=at("grad/norm", step),
            )
            if any(alert.severity == "critical" for alert in alerts):
                fired.append(step)
        out.append(fired)
    return out


# -- scoring ---------------------------------------------------------------------------


def score(detector: str, corpus: Sequence[CorpusRun], firings: Sequence[Sequence[int]]) -> Score:
    leads: list[int] = []
    hits = early = no_history = no_history_fired = before_history = 0
    stable = {True: 0, False: 0}
    false_alarms = {True: 0, False: 0}
    unbounded_collapsing = unbounded_early = 0
    stable_steps = stable_firings = 0
    with_lag = at_bound = 0
    dips = dips_fired = 0
    for run, all_fired in zip(corpus, firings, strict=True):
        c = run.collapse_step
        dips += len(run.dips)
        dips_fired += sum(any(_near_dip(dip, step) for step in all_fired) for dip in run.dips)
        fired = [step for step in all_fired if run.judged(step) and (c is not None or step < run.scored_until)]
        before_history += sum(step < MIN_HISTORY for step in fired)
        if c is None:
            stable[run.unbounded] += 1
            false_alarms[run.unbounded] += bool(fired)
            stable_steps += run.scored_until
            stable_firings += len(fired)
            continue
        if c < MIN_HISTORY:
            no_history += 1
            no_history_fired += any(step < c for step in fired)
            continue
        in_window = [step for step in fired if c - WINDOW <= step < c]
        if in_window:
            hits += 1
            leads.append(c - in_window[0])
            lag = run.config.get("lag")
            if isinstance(lag, int):
                with_lag += 1
                at_bound += c - in_window[0] >= max(1, lag - 1)
        was_early = any(step < c - WINDOW for step in fired)
        early += was_early
        if run.unbounded:
            unbounded_collapsing += 1
            unbounded_early += was_early
    collapsing = sum(run.collapse_step is not None and run.collapse_step >= MIN_HISTORY for run in corpus)
    unbounded_base = stable[True] + unbounded_collapsing
    return Score(
        detector=detector,
        collapsing=collapsing,
        hits=hits,
        recall=hits / collapsing if collapsing else math.nan,
        median_lead=statistics.median(leads) if leads else None,
        early_false_alarms=early,
        no_history=no_history,
        no_history_fired=no_history_fired,
        stable_bounded=stable[False],
        false_alarms_bounded=false_alarms[False],
        stable_unbounded=stable[True],
        false_alarms_unbounded=false_alarms[True],
        unbounded_rate_with_early=(false_alarms[True] + unbounded_early) / unbounded_base if unbounded_base else math.nan,
        firings_per_1k_stable_steps=1000 * stable_firings / stable_steps if stable_steps else math.nan,
        firings_before_history=before_history,
        leads=sorted(leads),
        leads_at_bound=at_bound,
        hits_with_lag=with_lag,
        dips=dips,
        dips_fired=dips_fired,
    )


def _ratio(count: int, total: int) -> str:
    return f"{count}/{total} ({count / total:.0%})" if total else "-"


def format_scores(scores: Sequence[Score]) -> str:
    header = (
        f"{'detector':36s} {'recall':>14s} {'med. lead':>9s} {'>=lag-1':>7s} {'early FA':>8s} {'FA bounded':>14s} "
        f"{'FA unbounded':>14s} {'+early':>6s} {'/1k st.':>7s} {'<50':>4s} {'no hist.':>8s} {'dips':>9s}"
    )
    lines = [header]
    for s in scores:
        lead = "-" if s.median_lead is None else f"{s.median_lead:g}"
        bound = f"{s.leads_at_bound / s.hits_with_lag:.0%}" if s.hits_with_lag else "-"
        lines.append(
            f"{s.detector:36s} {_ratio(s.hits, s.collapsing):>14s} {lead:>9s} {bound:>7s} {s.early_false_alarms:>8d} "
            f"{_ratio(s.false_alarms_bounded, s.stable_bounded):>14s} {_ratio(s.false_alarms_unbounded, s.stable_unbounded):>14s} "
            f"{s.unbounded_rate_with_early:>6.0%} {s.firings_per_1k_stable_steps:>7.2f} {s.firings_before_history:>4d} "
            f"{s.no_history_fired:>3d}/{s.no_history:<4d} {f'{s.dips_fired}/{s.dips}':>9s}"
        )
    return "\n".join(lines)


def false_alarm_runs(corpus: Sequence[CorpusRun], firings: Sequence[Sequence[int]]) -> list[str]:
    """One line per stable run that fired and per collapsing run that fired early or missed."""
    lines = []
    for run, all_fired in zip(corpus, firings, strict=True):
        c = run.collapse_step
        fired = [step for step in all_fired if run.judged(step) and (c is not None or step < run.scored_until)]
        if c is None and fired:
            lines.append(f"false alarm  {run.name}: fired at {fired[:5]}")
        elif c is not None and c >= MIN_HISTORY:
            early = [step for step in fired if step < c - WINDOW]
            hit = any(c - WINDOW <= step < c for step in fired)
            if early or not hit:
                lines.append(f"{'early FA' if early else 'miss':12s} {run.name}: collapse {c}, fired at {fired[:5]}")
    return lines


def hazard_rule(p: float) -> RuleSpec:
    """The collapse hazard as a critical rule: fires while P(collapse within HORIZON) > p."""
    return RuleSpec(HAZARD_RULE, "reward/mean", "hazard", "critical", for_steps=1, keep_firing_for=50, params={"p": p})


def _split(name: str, corpus: Sequence[CorpusRun], firings: Sequence[Sequence[int]]) -> list[Score]:
    """`name` scored on the PPO runs and on the others apart (when the corpus has both)."""
    ppo = [index for index, run in enumerate(corpus) if run.ppo]
    if not ppo or len(ppo) == len(corpus):
        return []
    rest = [index for index in range(len(corpus)) if index not in set(ppo)]
    return [
        score(f"  {name}: {label}", [corpus[i] for i in indices], [firings[i] for i in indices])
        for label, indices in (("PPO", ppo), ("other losses", rest))
    ]


def evaluate(
    corpus: Sequence[CorpusRun],
    rules: Sequence[RuleSpec] = DEFAULT_RULES,
    *,
    hazard_model: HazardModel,
    hazard_p: float | None = None,
    details: bool = False,
    rlwatch: bool = True,
) -> dict[str, Any]:
    """Score the critical rules (PPO apart), the "mismatch climbing" warning, the collapse
    hazard as a rule `hazard > hazard_p` (alone and beside the critical rules) and rlwatch;
    the hazard, and any hazard rule among `rules`, under `hazard_model`."""
    started = time.perf_counter()
    critical, per_rule = critical_firings(corpus, rules, hazard_model=hazard_model)
    scores = [score("keel critical", corpus, critical)]
    names = [rule.name for rule in rules if rule.severity == "critical"]
    if len(names) > 1:  # what each critical rule contributes to the union
        scores += [score(f"  {name}", corpus, per_rule[name]) for name in names]
    scores += _split("keel critical", corpus, critical)
    if hazard_p is not None:
        hazard = rule_firings(corpus, [hazard_rule(hazard_p)], hazard_model=hazard_model)[HAZARD_RULE]
        scores.append(score(f"hazard > {hazard_p:g}", corpus, hazard))
        scores += _split(f"hazard > {hazard_p:g}", corpus, hazard)
        both = [sorted({*a, *b}) for a, b in zip(critical, hazard, strict=True)]
        scores.append(score(f"keel critical + hazard > {hazard_p:g}", corpus, both))
    if WARNING_RULE in per_rule:
        scores.append(score(f"keel warning ({WARNING_RULE})", corpus, per_rule[WARNING_RULE]))
    replayed = time.perf_counter()
    peer = rlwatch_firings(corpus) if rlwatch else None
    if peer is not None:
        scores.append(score("rlwatch 0.5 defaults (crit.)", corpus, peer))
    result: dict[str, Any] = {
        "runs": len(corpus),
        "collapsing": sum(run.collapse_step is not None for run in corpus),
        "scores": [asdict(s) for s in scores],
        "text": format_scores(scores),
        "rlwatch_available": peer is not None,
        "timings_s": {"backtest": replayed - started, "rlwatch": time.perf_counter() - replayed},
    }
    if details:
        result["details"] = false_alarm_runs(corpus, critical)
    return result
