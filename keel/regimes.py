"""Leave one regime out (`keel eval-alerts --regimes`): does the early warning hold on a
regime it was never fitted on?

The runs of the corpora given are split along each axis of the regime corpus (learning
rate in bins, task difficulty, model size, batch shape, loss family, sampler dtype, lag in
bins, clipping on or off; a run whose
config lacks one of them, a toy run, is never held out and always fitted on). For every value of every axis the
collapse hazard is fitted on every other run and the rules are scored on the runs with
that value only: a *held-out cell*. The worst cell, per figure, is the figure that counts.

Rules with the `hazard` detector are scored with the cell's own model, from the hazard
series (`threshold_firings`: the lifecycle of `for_steps` 1, exactly as the backtest
replays it); the other rules have nothing fitted and are replayed once for every run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from keel.eval_alerts import UNBOUNDED_LOSSES, CorpusRun, Score, format_scores, rule_firings, score
from keel.hazard_eval import Rows, fit, rows, run_features
from server.alerts.catalog import RuleSpec
from server.alerts.hazard import HazardModel
from server.alerts.lifecycle import Lifecycle, Transition

__all__ = [
    "AXES", "SPLIT_BY", "Cell", "CellResult", "cells", "format_cells", "format_curve", "hazard_steps", "leave_one_out",
    "operating_curve", "threshold_firings", "worst",
]  # fmt: skip

BOUNDED_LOSSES = frozenset({"cispo", "cispo_floor", "tis", "mis"})


def _family(config: dict[str, Any]) -> str | None:
    loss = config.get("loss")
    if loss is None:
        return None
    if loss in UNBOUNDED_LOSSES:
        return "unbounded"
    return "bounded" if loss in BOUNDED_LOSSES else "ratio-free"


def _batch(config: dict[str, Any]) -> str | None:
    if "prompts" not in config or "group" not in config:
        return None
    return f"{config['prompts']}x{config['group']}"


def _binned(edges: Sequence[float], names: Sequence[str]) -> Callable[[Any], str | None]:
    """A number's bin: names[i] for edges[i - 1] <= x < edges[i] (one more name than edges).
    Corpora drawn at the edge of each cell (`keel lm-edge`) draw learning rates and lags
    around a cell's edge, so few runs share a value; their bins are the regimes."""

    def of(value: Any) -> str | None:
        if value is None:
            return None
        return names[sum(float(value) >= edge for edge in edges)]

    return of


_LR_BIN = _binned((1e-3, 2e-3, 4e-3), ("< 1e-3", "1e-3 to 2e-3", "2e-3 to 4e-3", ">= 4e-3"))
_LAG_BIN = _binned((1, 5, 9), ("0", "1-4", "5-8", "9+"))


def _clipping(config: dict[str, Any]) -> str | None:
    if "clip" not in config:
        return None
    return "on" if config["clip"] else "off"


AXES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "learning rate": lambda config: _LR_BIN(config.get("lr")),
    "difficulty": lambda config: config.get("digits"),
    "model size": lambda config: config.get("size"),
    "batch shape": _batch,
    "loss family": _family,
    "sampler dtype": lambda config: config.get("sampler_dtype"),
    "lag": lambda config: _LAG_BIN(config.get("lag")),
    "clipping": _clipping,
}
"""What a run's config says of each axis (None: the run has no such axis)."""
SPLIT_BY = ("learning rate", "difficulty", "model size", "batch shape", "loss family", "sampler dtype")
"""A run is split (held out cell by cell) when its config gives these: a regime run."""


@dataclass(frozen=True)
class Cell:
    axis: str
    value: Any
    runs: tuple[int, ...]
    """Indices of the held-out runs in the corpus."""


def cells(corpus: Sequence[CorpusRun], min_runs: int = 10) -> list[Cell]:
    """Every (axis, value) with at least `min_runs` runs whose axis keeps at least `min_runs`
    runs of other values to fit on (a value that is nearly the whole corpus is no held-out
    regime). Only runs whose config gives every axis of SPLIT_BY are split (the others, toy
    runs, are always fitted on); a run is not split on an axis its config does not give."""
    split = [index for index, run in enumerate(corpus) if all(AXES[axis](run.config) is not None for axis in SPLIT_BY)]
    out = []
    for axis, of in AXES.items():
        groups: dict[Any, list[int]] = {}
        for index in split:
            value = of(corpus[index].config)
            if value is not None:
                groups.setdefault(value, []).append(index)
        given = sum(len(group) for group in groups.values())
        for value in sorted(groups, key=str):
            if len(groups[value]) >= min_runs and given - len(groups[value]) >= min_runs:
                out.append(Cell(axis, value, tuple(groups[value])))
    return out


def hazard_steps(corpus: Sequence[CorpusRun]) -> list[list[tuple[int, list[float | None]]]]:
    """Per run, its `run_features`: computed once, scored under any model."""
    return [run_features(run) for run in corpus]


def threshold_firings(series: Sequence[tuple[int, float]], p: float, keep_firing_for: int) -> list[int]:
    """The firing steps of `hazard > p` with `for_steps` 1, through the engine's lifecycle."""
    lifecycle, fired = Lifecycle(), []
    for step, hazard in series:
        if Transition.FIRING in lifecycle.step(hazard > p, step, for_steps=1, keep_firing_for=keep_firing_for):
            fired.append(step)
    return fired


def _subset(data: Rows, keep: set[int]) -> Rows:
    index = [i for i, run in enumerate(data.run) if run in keep]
    return Rows([data.x[i] for i in index], [data.y[i] for i in index], [data.run[i] for i in index])


@dataclass
class CellResult:
    cell: Cell
    scores: list[Score]
    model: dict[str, Any]
    hazards: list[list[tuple[int, float]]] = field(default_factory=list)
    """Per held-out run, (step, hazard) under the cell's model."""


def _union(*lists: Sequence[int]) -> list[int]:
    return sorted({step for steps in lists for step in steps})


def leave_one_out(
    corpus: Sequence[CorpusRun],
    rules: Sequence[RuleSpec],
    hazard_p: float,
    *,
    min_runs: int = 10,
    fit_model: Callable[[Rows], dict[str, Any]] | None = None,
) -> list[CellResult]:
    """For every held-out cell: the critical rules (their hazard rules under the cell's own
    model) and `hazard > hazard_p` alone, scored on the cell's runs."""
    fit_model = fit_model or (lambda data: fit(data, description="leave one regime out"))
    critical = [rule for rule in rules if rule.severity == "critical"]
    fixed = [rule for rule in critical if rule.detector != "hazard"]
    hazard_rules = [rule for rule in critical if rule.detector == "hazard"]
    fixed_firings = rule_firings(corpus, fixed)
    union_fixed = [_union(*(fixed_firings[rule.name][i] for rule in fixed)) for i in range(len(corpus))]
    steps = hazard_steps(corpus)
    data = rows(corpus, steps)
    results = []
    for cell in cells(corpus, min_runs):
        held = set(cell.runs)
        model = fit_model(_subset(data, set(range(len(corpus))) - held))
        scorer = HazardModel(model)
        hazards = [[(step, scorer.probability(x)) for step, x in steps[i]] for i in cell.runs]
        runs = [corpus[i] for i in cell.runs]
        ruled = [
            _union(union_fixed[i], *(threshold_firings(series, rule.params.get("p", 0.5), rule.keep_firing_for) for rule in hazard_rules))
            for i, series in zip(cell.runs, hazards, strict=True)
        ]
        alone = [threshold_firings(series, hazard_p, 50) for series in hazards]
        results.append(CellResult(cell, [score("rules", runs, ruled), score(f"hazard > {hazard_p:g}", runs, alone)], model, hazards))
    return results


def operating_curve(result: CellResult, corpus: Sequence[CorpusRun], ps: Sequence[float]) -> list[Score]:
    """`hazard > p` on one held-out cell, for every p (its own model): recall against false alarms."""
    runs = [corpus[i] for i in result.cell.runs]
    return [score(f"hazard > {p:g}", runs, [threshold_firings(series, p, 50) for series in result.hazards]) for p in ps]


def _rate(count: int, total: int) -> float:
    return count / total if total else math.nan


def _percent(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.0%}"


def worst(results: Sequence[CellResult], detector: str = "rules") -> dict[str, Any]:
    """The worst held-out cell for each target figure, and which cell it is."""
    def pick(value: Callable[[Score], float], lowest: bool) -> dict[str, Any]:
        scored = [(value(s), f"{r.cell.axis} {r.cell.value}") for r in results for s in r.scores if s.detector == detector]
        scored = [(v, name) for v, name in scored if not math.isnan(v)]
        if not scored:
            return {"value": math.nan, "cell": None}
        v, name = min(scored) if lowest else max(scored)
        return {"value": v, "cell": name}

    return {
        "recall": pick(lambda s: s.recall, True),
        "at_bound": pick(lambda s: _rate(s.leads_at_bound, s.hits_with_lag), True),
        "fa_bounded": pick(lambda s: s.fa_bounded_rate, False),
        "fa_unbounded": pick(lambda s: s.fa_unbounded_rate, False),
    }


def format_cells(results: Sequence[CellResult]) -> str:
    lines = []
    for result in results:
        cell = result.cell
        lines.append(f"-- held out: {cell.axis} = {cell.value} ({len(cell.runs)} runs)")
        lines.append(format_scores(result.scores))
    for detector in ("rules", *{s.detector for r in results for s in r.scores if s.detector != "rules"}):
        w = worst(results, detector)
        lines.append(
            f"worst held-out cell, {detector}: recall {_percent(w['recall']['value'])} ({w['recall']['cell']}), "
            f">=lag-1 {_percent(w['at_bound']['value'])} ({w['at_bound']['cell']}), "
            f"FA bounded {_percent(w['fa_bounded']['value'])} ({w['fa_bounded']['cell']}), "
            f"FA unbounded {_percent(w['fa_unbounded']['value'])} ({w['fa_unbounded']['cell']})"
        )
    return "\n".join(lines)


def format_curve(name: str, curve: Sequence[Score]) -> str:
    lines = [f"operating curve on {name}:", f"{'p':>5s} {'recall':>8s} {'>=lag-1':>8s} {'FA bounded':>11s} {'FA unbounded':>13s}"]
    for s in curve:
        p = s.detector.rsplit(" ", 1)[-1]
        lines.append(
            f"{p:>5s} {_percent(s.recall):>8s} {_percent(_rate(s.leads_at_bound, s.hits_with_lag)):>8s} "
            f"{_percent(s.fa_bounded_rate):>11s} {_percent(s.fa_unbounded_rate):>13s}"
        )
    return "\n".join(lines)
