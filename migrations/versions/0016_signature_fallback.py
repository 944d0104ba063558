"""the built-in entropy and loss rules also watch a run whose reward never rose

"Entropy running away" and "loss growing" measure from the level a run had once its reward
rose 2.5 initial spreads. A run that starts from a trained checkpoint, or whose reward is too
noisy to show that rise, never has that level, and the rules said nothing however far its
entropy or loss ran (docs/alerts.md, "Every signal a run logs"). With `fallback` 100, after 100
values of waiting the level is the last 50 anyway, and the rule pages only while the mean of
the reward's last 10 values is also 1.5 spreads below its mean over those 50 steps
(`fallback_drop`); a run whose reward rises later has its level retaken then. A built-in rule still on its earlier parameters gets `fallback`; its runs'
detector states are kept (the new parameter reads only what they hold) and marked as
computed for the new parameters. A rule its user edited is left as it is.

Revision ID: 0016
Revises: 0015
"""

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here (server/alerts/catalog.py SIGNATURE_RULES holds the current defaults).
BEFORE: dict[str, dict[str, Any]] = {
    "entropy running away": {"min_scale": 0.35, "k": 2.0, "h": 10.0, "adapt": 0.02, "floor": 0.2},
    "loss growing": {"of": "magnitude", "floor": 0.01, "min_scale": 0.5, "k": 2.0, "h": 10.0},
}
AFTER: dict[str, dict[str, Any]] = {name: {**params, "fallback": 100} for name, params in BEFORE.items()}

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


def _move(conn: sa.Connection, old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> None:
    """Built-in rules still on `old` take `new`; each run's state of them is kept, marked as
    computed for the new parameters."""
    for name in old:
        chosen = [
            (rule_id, detector, metric)
            for rule_id, detector, metric, params in conn.execute(
                sa.select(rules.c.id, rules.c.detector, rules.c.metric, rules.c.params).where(rules.c.name == name, rules.c.builtin.is_(True))
            )
            if params == old[name]
        ]
        for rule_id, detector, metric in chosen:
            conn.execute(rules.update().where(rules.c.id == rule_id).values(params=new[name]))
            was, now = _definition(detector, metric, old[name]), _definition(detector, metric, new[name])
            for run_id, state in conn.execute(sa.select(rule_states.c.run_id, rule_states.c.state).where(rule_states.c.rule_id == rule_id)).all():
                if not isinstance(state, dict) or state.get("definition") != was:
                    continue  # computed for another definition: thrown away when read, as before
                conn.execute(
                    rule_states.update().where(rule_states.c.rule_id == rule_id, rule_states.c.run_id == run_id).values(state={**state, "definition": now})
                )


def upgrade() -> None:
    _move(op.get_bind(), BEFORE, AFTER)


def downgrade() -> None:
    # A state taken under the fallback keeps its level: the rule then waits no more for it.
    _move(op.get_bind(), AFTER, BEFORE)
