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


@router.post("/backtest", dependencies=[READ], responses=errors(404, 429))
async def backtest(body: BacktestIn, store: StoreDep, hazard_model: HazardModelDep) -> dict[str, Any]:
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
    return {"runs": [result.to_json() for result in results]}
