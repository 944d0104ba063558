"""the built-in "entropy running away" rule counts an entropy under 0.2 nats as 0.2

An entropy that sharpened under 0.2 nats wanders by factors of several in log units: a rise
from 0.1 to 0.5 nats, which healthy runs of real LLM RL show late in training, paged as a
runaway with the floor at 0.1 (docs/alerts.md). A built-in rule still on its 0010 parameters
gets the floor of 0.2; its runs' detector state is kept, read as the new floor reads it (the
learned level and the values waiting to become it under 0.2 count as 0.2: the median of the
floored values is the floored median), so a run that has learned keeps its level rather than
waiting for its reward to rise again. A rule its user edited is left as it is.

Revision ID: 0015
Revises: 0014
"""

import hashlib
import json
import math
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "entropy running away"
# Frozen here (server/alerts/catalog.py SIGNATURE_RULES holds the current default).
BEFORE: dict[str, Any] = {"min_scale": 0.35, "k": 2.0, "h": 10.0, "adapt": 0.02, "floor": 0.1}
AFTER: dict[str, Any] = {**BEFORE, "floor": 0.2}

rules = sa.table(
    "rules", sa.column("id", sa.Integer), sa.column("name", sa.String), sa.column("metric", sa.String),
    sa.column("detector", sa.String), sa.column("params", sa.JSON), sa.column("builtin", sa.Boolean),
)
rule_states = sa.table("rule_states", sa.column("rule_id", sa.Integer), sa.column("run_id", sa.String), sa.column("state", sa.JSON))


def _definition(detector: str, metric: str, params: dict[str, Any]) -> str:
    """What a stored detector state was computed for (frozen from server/alerts/state.py
    `definition`): a state whose definition is not the rule's is thrown away when read."""
    text = json.dumps([detector, metric, params], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _floored(detector: dict[str, Any], floor: float) -> dict[str, Any]:
    """A climb's state read under `floor`: its level and its warm-up values (log units) no lower."""
    low = math.log(floor)
    out = dict(detector)
    if isinstance(out.get("median"), (int, float)):
        out["median"] = max(float(out["median"]), low)
    if isinstance(out.get("warmup"), list):
        out["warmup"] = [max(float(x), low) if isinstance(x, (int, float)) else x for x in out["warmup"]]
    return out


def _move(conn: sa.Connection, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Built-in rules still on `old` take `new`; each run's state of them is read under the
    new floor and marked as computed for the new parameters, so the run keeps its learned
    level (a downgrade cannot lower a floored level again: it keeps it, which pages later)."""
    chosen = [
        (rule_id, detector, metric)
        for rule_id, detector, metric, params in conn.execute(
            sa.select(rules.c.id, rules.c.detector, rules.c.metric, rules.c.params).where(rules.c.name == NAME, rules.c.builtin.is_(True))
        )
        if params == old
    ]
    for rule_id, detector, metric in chosen:
        conn.execute(rules.update().where(rules.c.id == rule_id).values(params=new))
        was, now = _definition(detector, metric, old), _definition(detector, metric, new)
        for run_id, state in conn.execute(sa.select(rule_states.c.run_id, rule_states.c.state).where(rule_states.c.rule_id == rule_id)).all():
            if not isinstance(state, dict) or state.get("definition") != was or not isinstance(state.get("detector"), dict):
                continue  # computed for another definition: thrown away when read, as before
            moved = {**state, "detector": _floored(state["detector"], new["floor"]), "definition": now}
            conn.execute(rule_states.update().where(rule_states.c.rule_id == rule_id, rule_states.c.run_id == run_id).values(state=moved))


def upgrade() -> None:
    _move(op.get_bind(), BEFORE, AFTER)


def downgrade() -> None:
    _move(op.get_bind(), AFTER, BEFORE)
