"""a default warning when the loss trains on almost nothing: "loss gated out"

A loss that gates (masks or clips away) nearly every token it is given learns nothing, however
healthy every other number looks: verl's rollout-correction rejection preset rejecting every
sequence (its `rollout_rs_masked_fraction` at 1, the gradient exactly 0 at every step) was
flagged by no rule. "loss gated out" warns when `gate/frac` stays above 0.95 for 20 steps
(docs/alerts.md, "Every signal a run logs"). Default rules are installed when a project is
first seen, so this adds the rule to every project that has no rule of that name, once; a
user who deletes it later keeps it deleted.

Revision ID: 0017
Revises: 0016
"""

import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here as the rule was introduced (server/alerts/catalog.py holds the current defaults).
RULE: dict[str, Any] = {
    "name": "loss gated out", "metric": "gate/frac", "detector": "threshold",
    "params": {"op": ">", "threshold": 0.95, "resolve_at": 0.8}, "severity": "warning", "for_steps": 20,
    "keep_firing_for": 10, "group_name": None, "run_id": None, "enabled": True, "builtin": True, "action": None,
}

projects = sa.table("projects", sa.column("name", sa.String))
rules = sa.table(
    "rules",
    sa.column("id", sa.Integer), sa.column("name", sa.String), sa.column("project", sa.String),
    sa.column("group_name", sa.String), sa.column("run_id", sa.String), sa.column("metric", sa.String),
    sa.column("detector", sa.String), sa.column("params", sa.JSON), sa.column("severity", sa.String),
    sa.column("for_steps", sa.Integer), sa.column("keep_firing_for", sa.Integer), sa.column("enabled", sa.Boolean),
    sa.column("builtin", sa.Boolean), sa.column("created_at", sa.Double), sa.column("action", sa.String),
)


def upgrade() -> None:
    conn = op.get_bind()
    every = list(conn.execute(sa.select(projects.c.name)).scalars())
    have = set(conn.execute(sa.select(rules.c.project).where(rules.c.name == RULE["name"])).scalars())
    missing = [name for name in every if name not in have]
    if missing:
        now = time.time()
        conn.execute(rules.insert(), [{**RULE, "project": name, "created_at": now} for name in missing])


def downgrade() -> None:
    conn = op.get_bind()
    ids = list(conn.execute(sa.select(rules.c.id).where(rules.c.name == RULE["name"], rules.c.builtin.is_(True))).scalars())
    if ids:
        conn.execute(sa.text("DELETE FROM rule_states WHERE rule_id IN :ids").bindparams(sa.bindparam("ids", expanding=True)), {"ids": ids})
        conn.execute(sa.text("UPDATE alerts SET rule_id = NULL WHERE rule_id IN :ids").bindparams(sa.bindparam("ids", expanding=True)), {"ids": ids})
        conn.execute(rules.delete().where(rules.c.id.in_(ids)))
