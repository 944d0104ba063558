"""Backtest: where would these rules have fired on these rows?

The same detectors and the same lifecycle as the engine (`catalog.build_detector`,
`lifecycle.Lifecycle`; hazard rules with the model the caller gives), fed a run's rows in step order, with no database, no
alert rows and no notifications: a user tunes a rule on last week's runs before
enabling it (`keel backtest`, `POST /api/v1/backtest`; docs/alerts.md). The core,
`backtest`, is a pure function; `stored_rows`, `stored_rules` and `backtest_runs` are
the thin loaders that read runs and rules from the database.

A rule file is a JSON or YAML list of rules (or `{"rules": [...]}`), each
`{name, metric, detector, params, severity, for_steps, keep_firing_for}`; the
keys the rules API adds (`id`, `project`, `enabled`, ...) are accepted and
ignored, so the output of `GET /api/v1/rules` is a rule file.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from server.alerts.catalog import DEFAULT_RULES, SEVERITIES, RuleSpec, build_detector
from server.alerts.hazard import HazardModel
from server.alerts.lifecycle import Lifecycle, Transition
from server.errors import NotFound
from server.models import Rule
from server.storage import Store
from wire import Row

__all__ = [
    "Episode",
    "Replay",
    "RuleBacktest",
    "RunBacktest",
    "backtest",
    "backtest_runs",
    "parse_rules",
    "rule_from_json",
    "rule_spec",
    "stored_rows",
    "stored_rules",
    "DEFAULT_RULES",
]

CLOCK_DETECTORS = frozenset({"silent"})
"""Detectors evaluated on the server's clock, not on points: nothing to replay."""
RULE_KEYS = frozenset({"name", "metric", "detector", "params", "severity", "for_steps", "keep_firing_for"})
IGNORED_KEYS = frozenset({"id", "project", "group", "run_id", "enabled", "builtin"})
"""Keys of the rules API's output that do not change what a rule computes on one run."""
ROWS_PER_READ = 200_000
"""Points per database read of `stored_rows` (it pages through longer runs)."""


@dataclass(frozen=True)
class Episode:
    """One alert of a rule on a run: what the alerts table would have held."""

    started_step: int
    """The first step its condition held (pending from here)."""
    fired_step: int
    resolved_step: int | None
    """None: still firing at the last row."""
    value: float
    """The watched metric's value at the firing step."""
    message: str


@dataclass
class RuleBacktest:
    rule: RuleSpec
    episodes: list[Episode] = field(default_factory=list)
    cancelled: int = 0
    """Pending alerts that cleared before `for_steps`: never notified."""
    evaluated_steps: int = 0
    """Rows that carried a metric the rule watches."""
    skipped: str | None = None
    """Why the rule was not replayed (a clock-based detector), else None."""

    @property
    def fired_steps(self) -> list[int]:
        return [episode.fired_step for episode in self.episodes]

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": asdict(self.rule),
            "episodes": [asdict(episode) for episode in self.episodes],
            "cancelled": self.cancelled,
            "evaluated_steps": self.evaluated_steps,
            "skipped": self.skipped,
        }


class Replay:
    """One rule on one run, a row at a time: what `backtest_rule` does over a whole run, for a
    loop that asks after each step whether the rule fires (a guard beside a training loop,
    bench/guard.py). `result.episodes` holds the closed ones; `firing` the one open now, if any."""

    def __init__(self, rule: RuleSpec, *, hazard_model: HazardModel | None = None) -> None:
        self.result = RuleBacktest(rule)
        self.detector = None
        if rule.detector in CLOCK_DETECTORS:
            self.result.skipped = f"detector {rule.detector!r} runs on the server's clock, not on logged points"
        else:
            self.detector = build_detector(rule.detector, rule.metric, rule.params, hazard_model=hazard_model)
            self.state = self.detector.initial_state()
        self.lifecycle = Lifecycle()
        self.last_step: int | None = None
        self.firing: Episode | None = None

    def feed(self, row: Row) -> None:
        """The next row (a repeated or older step is skipped, as the engine does)."""
        if self.detector is None or (self.last_step is not None and row.step <= self.last_step):
            return
        self.last_step = row.step
        signal = self.detector.update(self.state, row.step, row.values)
        if signal is None:
            return
        rule = self.result.rule
        self.result.evaluated_steps += 1
        for transition in self.lifecycle.step(signal.active, row.step, for_steps=rule.for_steps, keep_firing_for=rule.keep_firing_for):
            if transition is Transition.FIRING:
                started = self.lifecycle.started_step if self.lifecycle.started_step is not None else row.step
                self.firing = Episode(started, row.step, None, signal.value, signal.message)
            elif transition is Transition.RESOLVED and self.firing is not None:
                self.result.episodes.append(replace(self.firing, resolved_step=row.step))
                self.firing = None
            elif transition is Transition.CANCELLED:
                self.result.cancelled += 1

    def finish(self) -> RuleBacktest:
        """The backtest so far, an episode still firing closed as unresolved."""
        if self.firing is not None:
            self.result.episodes.append(self.firing)
            self.firing = None
        return self.result


def backtest_rule(rule: RuleSpec, rows: Iterable[Row], *, hazard_model: HazardModel | None = None) -> RuleBacktest:
    """Replay `rows` (ascending steps; a repeated or older step is skipped, as the engine does).
    A `hazard` rule computes with `hazard_model` (None: only for rules of other detectors)."""
    replay = Replay(rule, hazard_model=hazard_model)
    for row in rows:
        replay.feed(row)
    return replay.finish()


def backtest(rules: Sequence[RuleSpec], rows: Sequence[Row], *, hazard_model: HazardModel | None = None) -> list[RuleBacktest]:
    """Per rule (in order), where it would have gone pending, fired and resolved on `rows`
    (hazard rules under `hazard_model`, as in `backtest_rule`)."""
    return [backtest_rule(rule, rows, hazard_model=hazard_model) for rule in rules]


# -- rules as data ------------------------------------------------------------------


def rule_from_json(data: Mapping[str, Any]) -> RuleSpec:
    """A rule from its JSON form; ValueError saying what is wrong with it."""
    if not isinstance(data, Mapping):
        raise ValueError(f"a rule must be an object, got {type(data).__name__}")
    unknown = set(data) - RULE_KEYS - IGNORED_KEYS
    if unknown:
        raise ValueError(f"unknown rule field(s) {sorted(unknown)}; known: {sorted(RULE_KEYS)}")
    missing = {"name", "metric", "detector"} - set(data)
    if missing:
        raise ValueError(f"a rule needs {sorted(missing)}")
    for key in ("name", "metric", "detector"):
        if not isinstance(data[key], str) or not data[key]:
            raise ValueError(f"rule field {key!r} must be a non-empty string")
    params = data.get("params") or {}
    if not isinstance(params, Mapping):
        raise ValueError("rule field 'params' must be an object")
    severity = data.get("severity", "warning")
    if severity not in SEVERITIES:
        raise ValueError(f"severity must be one of {', '.join(SEVERITIES)}")
    counts = {}
    for key in ("for_steps", "keep_firing_for"):
        value = data.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"rule field {key!r} must be an integer >= 0")
        counts[key] = value
    rule = RuleSpec(data["name"], data["metric"], data["detector"], severity, params=dict(params), **counts)
    build_detector(rule.detector, rule.metric, rule.params)  # its own parameter checks
    return rule


def parse_rules(text: str) -> list[RuleSpec]:
    """The rules of a rule file's text: JSON, or YAML when PyYAML is installed."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        try:
            import yaml
        except ImportError:
            raise ValueError(f"not JSON ({exc}); install PyYAML to read YAML rule files") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as yaml_exc:
            raise ValueError(f"neither JSON nor YAML: {yaml_exc}") from None
    if isinstance(data, Mapping) and "rules" in data:
        data = data["rules"]
    if not isinstance(data, list) or not data:
        raise ValueError("a rule file holds a non-empty list of rules (or {\"rules\": [...]})")
    rules = []
    for index, item in enumerate(data):
        try:
            rules.append(rule_from_json(item))
        except ValueError as exc:
            raise ValueError(f"rule {index}: {exc}") from None
    return rules


def rule_spec(rule: Rule) -> RuleSpec:
    """A stored rule as the spec the backtest replays."""
    return RuleSpec(
        rule.name, rule.metric, rule.detector, rule.severity,
        for_steps=rule.for_steps, keep_firing_for=rule.keep_firing_for, params=dict(rule.params or {}),
    )  # fmt: skip


# -- the database edge ----------------------------------------------------------------


async def stored_rows(store: Store, run_id: str) -> list[Row]:
    """Every stored row of a run, in step order (`Store.rows`, paged). UnknownRun if none such."""
    await store.get_run(run_id)
    rows: list[Row] = []
    after = -1
    while True:
        page = await store.rows(run_id, after=after, before=2**62, max_points=ROWS_PER_READ)
        if not page:
            return rows
        rows.extend(page)
        after = page[-1].step


async def stored_rules(store: Store, rule_ids: Sequence[int]) -> list[RuleSpec]:
    """These stored rules, in the order given. NotFound for an id that is not a rule."""
    specs = []
    async with store.sessions() as session:
        for rule_id in rule_ids:
            rule = await session.get(Rule, rule_id)
            if rule is None:
                raise NotFound(f"rule {rule_id} not found")
            specs.append(rule_spec(rule))
    return specs


@dataclass
class RunBacktest:
    run_id: str
    run_name: str
    steps: int
    """Rows replayed."""
    results: list[RuleBacktest]

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "run_name": self.run_name, "steps": self.steps, "rules": [r.to_json() for r in self.results]}


async def backtest_runs(store: Store, rules: Sequence[RuleSpec], run_ids: Sequence[str], hazard_model: HazardModel) -> list[RunBacktest]:
    """Each stored run replayed through the rules, hazard rules under `hazard_model` (the
    replay itself off the event loop)."""
    out = []
    for run_id in run_ids:
        run = await store.get_run(run_id)
        rows = await stored_rows(store, run_id)
        results = await asyncio.to_thread(backtest, rules, rows, hazard_model=hazard_model)
        out.append(RunBacktest(run.id, run.name, len(rows), results))
    return out
