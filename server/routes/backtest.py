"""Backtest rules on stored runs (REST): where would they have fired? (docs/alerts.md)"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from server.alerts.backtest import DEFAULT_RULES, backtest_runs, rule_from_json, stored_rules
from server.auth import READ
from server.deps import HazardModelDep, StoreDep
from server.schemas import MAX_INT, ApiRoute, Name, Text, errors, unprocessable

__all__ = ["router"]

router = APIRouter(tags=["alerts"], route_class=ApiRoute, responses=errors(401))

MAX_RUNS = 50
"""Runs per request: each is read whole and replayed through every rule."""
MAX_RULES = 50
StepCount = Annotated[int, Field(ge=0, le=MAX_INT)]


class BacktestRule(BaseModel):
    """A rule as the rules API takes it; scope fields (project, run_id, ...) do not apply here."""

    model_config = ConfigDict(strict=True)
    name: Annotated[Name, Field(min_length=1)]
    metric: Annotated[Name, Field(min_length=1)]
    detector: Annotated[Text, Field(max_length=50)]
    params: dict[Text, Any] = Field(default_factory=dict)
    severity: Text = "warning"
    for_steps: StepCount = 1
    keep_firing_for: StepCount = 1


class BacktestIn(BaseModel):
    model_config = ConfigDict(strict=True)
    run_ids: list[Text] = Field(min_length=1, max_length=MAX_RUNS)
    rules: list[BacktestRule] | None = Field(None, max_length=MAX_RULES, description="default: the default rules")
    rule_ids: list[Annotated[int, Field(ge=1, le=MAX_INT)]] | None = Field(
        None, max_length=MAX_RULES, description="stored rules to replay instead of `rules`"
    )


class ReplayedRuleOut(BaseModel):
    """A rule as replayed: server.alerts.catalog.RuleSpec's fields, in its order (a test holds
    them equal)."""

    name: str
    metric: str
    detector: str
    severity: str
    for_steps: int
    keep_firing_for: int
    params: dict[str, Any] = Field(description="the detector's parameters as given (its defaults not filled in)")


class EpisodeOut(BaseModel):
    """One alert of a rule on a run, as the alerts table would have held it
    (server.alerts.backtest.Episode's fields, in its order)."""

    started_step: int = Field(description="the first step its condition held (pending from here)")
    fired_step: int
    resolved_step: int | None = Field(description="null: still firing at the last row")
    value: float | None = Field(description="the watched metric's value at the firing step; null when not finite")
    message: str


class RuleBacktestOut(BaseModel):
    """A rule replayed on one run (server.alerts.backtest.RuleBacktest's JSON)."""

    rule: ReplayedRuleOut
    episodes: list[EpisodeOut]
    cancelled: int = Field(description="pending alerts that cleared before `for_steps`: never notified")
    evaluated_steps: int = Field(description="rows that carried a metric the rule watches")
    skipped: str | None = Field(description="why the rule was not replayed (a clock-based detector); null when it was")


class RunBacktestOut(BaseModel):
    """One stored run replayed (server.alerts.backtest.RunBacktest's JSON)."""

    run_id: str
    run_name: str
    steps: int = Field(description="rows replayed")
    rules: list[RuleBacktestOut] = Field(description="one per rule, in the order given")


class BacktestOut(BaseModel):
    runs: list[RunBacktestOut] = Field(description="one per run id, in the order given")


@router.post("/backtest", response_model=BacktestOut, dependencies=[READ], responses=errors(404, 429))
async def backtest(body: BacktestIn, store: StoreDep, hazard_model: HazardModelDep) -> BacktestOut:
    """Replay stored runs through rules with the engine's detectors and hazard model; no alert is written."""
    if body.rules is not None and body.rule_ids is not None:
        raise unprocessable("give rules or rule_ids, not both", "rule_ids")
    try:
        if body.rules is not None:
            rules = [rule_from_json(rule.model_dump()) for rule in body.rules]
        elif body.rule_ids is not None:
            rules = await stored_rules(store, body.rule_ids)
        else:
            rules = list(DEFAULT_RULES)
    except ValueError as exc:
        raise unprocessable(str(exc), "rules") from None
    results = await backtest_runs(store, rules, body.run_ids, hazard_model)
    return BacktestOut.model_validate({"runs": [result.to_json() for result in results]})
